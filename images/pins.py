"""Write the images' constraints files from the versions installed in this environment.

    .venv/bin/python images/pins.py            # rewrite them
    .venv/bin/python images/pins.py --check    # exit 1, naming the file, if one is stale

``images/constraints.txt`` pins, with ``==``, every distribution the daemons and the
operator run: pyproject.toml's dependencies, its ``daemons`` and ``operator`` extras,
and everything they require in turn, as installed here (``importlib.metadata``; run it
with the project's venv, where ``make`` installed every extra). ``images/spark/constraints.txt``
pins what the ``spark`` extra adds on top of that. The Dockerfiles install with
``pip install -c`` of these files, so an image holds exactly these versions; a test
(tests/k8s/test_images.py) keeps them in step with pyproject.toml and the venv.

Markers are evaluated for the images: CPython 3.11 on Linux.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import pathlib
import sys
import tomllib

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "images" / "constraints.txt"
SPARK_CONSTRAINTS = ROOT / "images" / "spark" / "constraints.txt"
PROJECT = "waltz"
# The extras each file covers (the core dependencies always).
DAEMON_EXTRAS = ("daemons", "operator")
SPARK_EXTRAS = ("spark",)

HEADER = """\
# {what}
# Exact versions, transitive dependencies included, for `pip install -c`.
# Generated from the project's venv: .venv/bin/python images/pins.py
# Do not edit by hand; tests/k8s/test_images.py checks it against pyproject.toml.
"""


def image_environment() -> dict[str, str]:
    """Marker variables of the images (CPython 3.11 on Linux)."""
    env = default_environment()
    env.update(
        sys_platform="linux",
        platform_system="Linux",
        os_name="posix",
        implementation_name="cpython",
        platform_python_implementation="CPython",
        python_version="3.11",
    )
    return env


def pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def project_requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """pyproject.toml's dependencies and those of ``extras``, markers applying."""
    project = pyproject()["project"]
    texts = list(project["dependencies"])
    for extra in extras:
        texts += project["optional-dependencies"][extra]
    env = image_environment()
    requirements = [Requirement(t) for t in texts]
    return [r for r in requirements if r.marker is None or r.marker.evaluate(env)]


def closure(roots: list[Requirement]) -> dict[str, str]:
    """{canonical name: installed version} of ``roots`` and all they require in turn."""
    env = image_environment()
    pinned: dict[str, str] = {}
    # (requirement, the extras it asks of its distribution)
    todo = [(r, frozenset(r.extras)) for r in roots]
    seen_extras: dict[str, set[str]] = {}
    while todo:
        requirement, extras = todo.pop()
        name = canonicalize_name(requirement.name)
        if name == PROJECT:
            continue
        if name in pinned and extras <= seen_extras[name]:
            continue
        try:
            dist = importlib.metadata.distribution(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            raise SystemExit(
                f"pins: {requirement.name} (required as {requirement}) is not installed "
                f"here: run me with the project's venv (make installs every extra)"
            ) from None
        version = dist.version
        if not requirement.specifier.contains(version, prereleases=True):
            raise SystemExit(f"pins: installed {requirement.name} {version} is not {requirement}")
        pinned[name] = version
        seen_extras.setdefault(name, set()).update(extras)
        for text in dist.requires or ():
            child = Requirement(text)
            if child.marker is not None and not any(
                child.marker.evaluate({**env, "extra": extra}) for extra in ("", *extras)
            ):
                continue
            todo.append((child, frozenset(child.extras)))
    return pinned


def daemon_pins() -> dict[str, str]:
    return closure(project_requirements(DAEMON_EXTRAS))


def spark_pins() -> dict[str, str]:
    """What the spark extra adds to the daemons' pins (the Spark image uses both files)."""
    base = daemon_pins()
    full = closure(project_requirements(SPARK_EXTRAS))
    return {name: v for name, v in full.items() if name not in base}


def render(what: str, pins: dict[str, str]) -> str:
    lines = [f"{name}=={pins[name]}" for name in sorted(pins)]
    return HEADER.format(what=what) + "\n".join(lines) + "\n"


def files() -> dict[pathlib.Path, str]:
    return {
        CONSTRAINTS: render(
            "What the storage, server and operator images run: pyproject.toml's\n"
            "# dependencies and its operator extra.",
            daemon_pins(),
        ),
        SPARK_CONSTRAINTS: render(
            "What the spark extra adds, for the Spark job image (which uses\n"
            "# images/constraints.txt too). pyspark is the Spark version of its base image.",
            spark_pins(),
        ),
    }


def parse_pins(text: str) -> dict[str, str]:
    """{canonical name: version} of a constraints file's ``name==version`` lines."""
    pins = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        specs = list(requirement.specifier)
        if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
            raise ValueError(f"not an exact pin: {raw!r}")
        pins[canonicalize_name(requirement.name)] = specs[0].version
    return pins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pins", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether they are stale")
    args = parser.parse_args(argv)
    stale = 0
    for path, text in files().items():
        current = path.read_text() if path.exists() else ""
        if current == text:
            continue
        if args.check:
            print(f"{path.relative_to(ROOT)} is stale: run .venv/bin/python images/pins.py")
            stale = 1
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return stale


if __name__ == "__main__":
    sys.exit(main())
