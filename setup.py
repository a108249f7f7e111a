"""The compiled per-record loops (waltz_client/wire/_native.c); everything else about the
distribution is in pyproject.toml.

``WALTZ_BUILD_NATIVE`` says what to do with them:

- ``auto`` (the default): build them where a C compiler works, and go on without them
  where it does not (waltz_client/wire/native.py then uses the pure-Python loops);
- ``require``: fail the build if they cannot be compiled (the storage and server images);
- ``skip``: a pure-Python distribution (the operator's image, which has no hot loop, and
  the Spark image, whose Python is not the build stage's).
"""

import os

from setuptools import Extension, setup

MODES = ("auto", "require", "skip")
mode = os.environ.get("WALTZ_BUILD_NATIVE", "auto").strip().lower() or "auto"
if mode not in MODES:
    raise SystemExit(f"WALTZ_BUILD_NATIVE={mode!r}: expected one of {', '.join(MODES)}")

native = Extension(
    "waltz_client.wire._native",
    ["waltz_client/wire/_native.c"],
    extra_compile_args=["-O2", "-std=c99", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    optional=mode == "auto",
)
setup(ext_modules=[] if mode == "skip" else [native])
