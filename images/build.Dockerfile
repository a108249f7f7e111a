# The build stage every image shares: the waltz wheel, built once for all four images.
# Build it from the repository root before them (`make images` does), a target each:
#   docker build -f images/build.Dockerfile --target native -t waltz-build-native:0.1.0 .
#   docker build -f images/build.Dockerfile --target pure -t waltz-build-pure:0.1.0 .
# `native` holds in /wheels the wheel with the compiled per-record loops
# (waltz_client/wire/_native.c, WALTZ_BUILD_NATIVE=require: built with them or not at
# all), for the storage and server images; `pure` the pure-Python wheel (skip), for the
# operator and Spark images. Both keep the build tools and, in /src, the sources and
# images/constraints.txt: each image makes its venv from its wheel in a stage of its own
# and copies only that venv, so no image keeps a compiler.

# The tag names the Python release and the Debian release; pass a digest-pinned
# reference (python:3.11.16-slim-trixie@sha256:...) to pin it further, the same to the
# images built on this one.
ARG PYTHON_IMAGE=python:3.11.16-slim-trixie

# --- sources: the build tools, a C compiler and the source tree ------------------------
FROM ${PYTHON_IMAGE} AS sources
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY images/build-requirements.txt images/constraints.txt images/
RUN pip install -r images/build-requirements.txt
# Before the sources, so that a change to them does not install it again.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml setup.py README.md ./
COPY waltz_client/ waltz_client/
COPY images/storage/waltz_storage/ images/storage/waltz_storage/
COPY images/server/waltz_server/ images/server/waltz_server/
COPY operator/waltz_operator/ operator/waltz_operator/

# --- pure: waltz as pure Python (the compiler unused) ---------------------------------
FROM sources AS pure
RUN WALTZ_BUILD_NATIVE=skip pip wheel --no-deps --no-build-isolation -w /wheels .

# --- native: waltz with its compiled loops --------------------------------------------
FROM sources AS native
RUN WALTZ_BUILD_NATIVE=require pip wheel --no-deps --no-build-isolation -w /wheels .
