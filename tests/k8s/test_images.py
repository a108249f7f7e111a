"""The container images: the Dockerfiles' structure (parsed here, no Docker needed), the
pinned constraints in step with pyproject.toml and the venv, `make images`, and, where a
Docker engine exists, the images built and run read-only as uid 10001.

Each structural check is a function that raises AssertionError; the real Dockerfiles must
pass them, and broken copies of them (test_checks_catch_a_broken_dockerfile) must not.
Every image builds on the build stage they share (images/build.Dockerfile): an image's
stage FROM a target of it is checked as that target's instructions followed by its own.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
SCRIPTS = PROJECT["scripts"]

_spec = importlib.util.spec_from_file_location("waltz_image_pins", ROOT / "images" / "pins.py")
pins = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pins)

DOCKERFILES = {
    "storage": "images/storage/Dockerfile",
    "server": "images/server/Dockerfile",
    "operator": "operator/Dockerfile",
    "spark": "images/spark/Dockerfile",
}
DAEMONS = ("storage", "server", "operator")
# The build stage every image builds on, and its targets' images as `make images` tags them.
SHARED_BUILD = "images/build.Dockerfile"
BUILD_IMAGES = {"waltz-build-native": "native", "waltz-build-pure": "pure"}
# The extras each image installs with the waltz wheel.
EXTRAS = {
    "storage": {"daemons"},
    "server": {"daemons"},
    "operator": {"operator"},
    "spark": {"spark"},
}
# The constraints files each image installs with.
CONSTRAINTS = {
    "storage": {"images/constraints.txt"},
    "server": {"images/constraints.txt"},
    "operator": {"images/constraints.txt"},
    "spark": {"images/constraints.txt", "images/spark/constraints.txt"},
}
ENTRYPOINTS = {
    "storage": ["waltz-storage"],
    "server": ["waltz-server"],
    "operator": ["waltz-operator"],
    # Spark's own entrypoint (driver / executor / pass-through) under tini.
    "spark": ["/usr/bin/tini", "--", "/opt/entrypoint.sh"],
}
OCI_LABELS = ("source", "version", "licenses", "title", "description")
SPARK_DISTRIBUTIONS = {"pyspark", "py4j"}


# --- a Dockerfile parser ---------------------------------------------------------------


@dataclasses.dataclass
class Instruction:
    keyword: str
    args: str
    line: int
    path: str = "Dockerfile"  # the file it is in (a shared build stage's, spliced in)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclasses.dataclass
class Stage:
    base: str  # the FROM reference, variables resolved
    name: str | None
    args: dict[str, str]  # ARG defaults in force in the stage
    instructions: list[Instruction]
    built_on: str | None = None  # the shared build stage's image it is FROM (spliced in)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@dataclasses.dataclass
class Dockerfile:
    path: str
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage_names(self) -> set[str]:
        return {s.name for s in self.stages if s.name}


def substitute(text: str, variables: dict[str, str]) -> str:
    """``${NAME}`` and ``$NAME`` as Docker expands them (unknown: empty)."""

    def value(m: re.Match) -> str:
        return variables.get(m.group(1) or m.group(2), "")

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, text)


def logical_lines(text: str) -> list[tuple[int, str]]:
    """Instructions with their continuation lines joined; comments and blank lines out
    (also inside a continued instruction, as Docker does)."""
    out: list[tuple[int, str]] = []
    buffer, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not buffer:
            start = number
        if raw.rstrip().endswith("\\"):
            buffer += raw.rstrip()[:-1] + " "
            continue
        out.append((start, buffer + raw))
        buffer = ""
    if buffer:
        out.append((start, buffer))
    return out


def parse_dockerfile(text: str, path: str = "Dockerfile") -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line, logical in logical_lines(text):
        keyword, _, args = logical.strip().partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(substitute(words[0], global_args), name, {}, []))
            continue
        if keyword == "ARG":
            key, eq, default = args.partition("=")
            scope = global_args if not stages else stages[-1].args
            if eq:
                scope[key] = default.strip().strip('"')
            elif stages:  # a global ARG declared again takes its default into the stage
                scope[key] = global_args.get(key, "")
            continue
        assert stages, f"{path}:{line}: {keyword} before FROM"
        stages[-1].instructions.append(Instruction(keyword, args, line, path))
    return Dockerfile(path, global_args, stages)


def chain(df: Dockerfile, name: str) -> list[Stage]:
    """Stage ``name`` of ``df`` and the stages of ``df`` it is FROM, the first first."""
    by_name = {s.name: s for s in df.stages if s.name}
    stages = [by_name[name]]
    while stages[0].base in by_name:
        stages.insert(0, by_name[stages[0].base])
    return stages


def on_shared_build(df: Dockerfile, shared: Dockerfile) -> Dockerfile:
    """``df`` with each stage FROM a target of the shared build stage spliced: its base
    that target's first base, its instructions the target's and then its own."""
    stages = []
    for stage in df.stages:
        image = stage.base.partition(":")[0]
        if image not in BUILD_IMAGES:
            stages.append(stage)
            continue
        target = chain(shared, BUILD_IMAGES[image])
        inherited = [i for s in target for i in s.instructions]
        stages.append(
            Stage(
                target[0].base, stage.name, stage.args, inherited + stage.instructions, stage.base
            )
        )
    return Dockerfile(df.path, df.global_args, stages)


def load(component: str, edit: tuple[str, str, str] | None = None) -> Dockerfile:
    """The component's Dockerfile on the shared build stage; ``edit``: (path, old, new),
    one of the two files as it would be with ``old`` replaced."""
    texts = {path: (ROOT / path).read_text() for path in (DOCKERFILES[component], SHARED_BUILD)}
    if edit is not None:
        path, old, new = edit
        assert old in texts[path], f"the breakage {old!r} no longer applies to {path}"
        texts[path] = texts[path].replace(old, new)
    shared = parse_dockerfile(texts[SHARED_BUILD], SHARED_BUILD)
    path = DOCKERFILES[component]
    return on_shared_build(parse_dockerfile(texts[path], path), shared)


def labels(stage: Stage) -> dict[str, str]:
    out = {}
    for instruction in stage.all("LABEL"):
        for token in shlex.split(instruction.args):
            key, _, value = token.partition("=")
            out[key] = substitute(value, stage.args)
    return out


def env(stage: Stage) -> dict[str, str]:
    out: dict[str, str] = {}
    for instruction in stage.all("ENV"):
        for token in shlex.split(instruction.args):
            key, _, value = token.partition("=")
            out[key] = value
    return out


def copies(stage: Stage) -> list[tuple[list[str], str, dict[str, str]]]:
    """(sources, destination, options) of each COPY/ADD."""
    out = []
    for instruction in stage.all("COPY") + stage.all("ADD"):
        args = instruction.args
        words = json.loads(args) if args.lstrip().startswith("[") else shlex.split(args)
        options = {}
        while words and words[0].startswith("--"):
            key, _, value = words.pop(0)[2:].partition("=")
            options[key] = value
        out.append((words[:-1], words[-1], options))
    return out


def copied_files(stage: Stage) -> dict[str, str]:
    """{path in the stage: path in the repository} of the files COPY'd from the build
    context (WORKDIR applied to relative destinations)."""
    out: dict[str, str] = {}
    workdir = "/"
    for instruction in stage.instructions:
        if instruction.keyword == "WORKDIR":
            workdir = os.path.join(workdir, instruction.args)
            continue
        if instruction.keyword != "COPY":
            continue
        [(sources, dest, options)] = copies(Stage("", None, {}, [instruction]))
        if "from" in options:
            continue
        dest = os.path.join(workdir, dest)
        for source in sources:
            base = ROOT / source
            files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
            for f in files:
                if base.is_file():
                    target = (
                        os.path.join(dest, base.name)
                        if dest.endswith("/") or len(sources) > 1
                        else dest
                    )
                else:
                    target = os.path.join(dest, str(f.relative_to(base)))
                out[os.path.normpath(target)] = str(f.relative_to(ROOT))
    return out


def workdir_of(stage: Stage, instruction: Instruction) -> str:
    """The working directory where ``instruction`` of ``stage`` runs."""
    workdir = "/"
    for i in stage.instructions[: stage.instructions.index(instruction)]:
        if i.keyword == "WORKDIR":
            workdir = os.path.join(workdir, i.args)
    return workdir


@dataclasses.dataclass
class PipCall:
    command: str  # install, wheel, uninstall, check, ...
    options: dict[str, list[str]]
    positional: list[str]
    stage: Stage
    run: Instruction


PIP_VALUE_OPTIONS = {
    "-c": "constraint",
    "--constraint": "constraint",
    "-r": "requirement",
    "--requirement": "requirement",
    "-f": "find-links",
    "--find-links": "find-links",
    "-w": "wheel-dir",
    "--wheel-dir": "wheel-dir",
    "--python": "python",
    "-i": "index-url",
    "--index-url": "index-url",
    "--extra-index-url": "extra-index-url",
    "--only-binary": "only-binary",
    "--no-binary": "no-binary",
    "--platform": "platform",
    "-t": "target",
    "--target": "target",
    "--prefix": "prefix",
    "--root": "root",
    "--invalidation-mode": "invalidation-mode",
}


def pip_calls(dockerfile: Dockerfile) -> list[PipCall]:
    out = []
    for stage in dockerfile.stages:
        for run in stage.all("RUN"):
            for segment in re.split(r"&&|;|\|\|", run.args):
                try:
                    words = shlex.split(segment)
                except ValueError:
                    continue
                for at, word in enumerate(words):
                    if os.path.basename(word) in ("pip", "pip3"):
                        break
                    if word == "-m" and at + 1 < len(words) and words[at + 1] == "pip":
                        at += 1
                        break
                else:
                    continue
                rest = words[at + 1 :]
                options: dict[str, list[str]] = {}
                positional: list[str] = []
                command = ""
                while rest:
                    word = rest.pop(0)
                    if word.startswith("-"):
                        key, eq, value = word.partition("=")
                        if key in PIP_VALUE_OPTIONS:
                            name = PIP_VALUE_OPTIONS[key]
                            options.setdefault(name, []).append(value if eq else rest.pop(0))
                        else:
                            options.setdefault(key.lstrip("-"), []).append(value)
                    elif not command:
                        command = word
                    else:
                        positional.append(word)
                out.append(PipCall(command, options, positional, stage, run))
    return out


# --- the checks ------------------------------------------------------------------------


def check_base_images_pinned(df: Dockerfile, component: str) -> None:
    local = df.stage_names()
    bases = [s.base for s in df.stages if s.base not in local]
    assert bases, f"{df.path}: no base image"
    for base in bases:
        reference, _, digest = base.partition("@")
        image, _, tag = reference.rpartition(":")
        assert image and tag, f"{df.path}: base image {base!r} has no tag"
        assert tag != "latest" and "latest" not in base, f"{df.path}: {base!r} is not pinned"
        assert re.search(r"\d+\.\d+\.\d+", tag), f"{df.path}: {base!r}: tag names no release"
        if digest:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"{df.path}: bad digest {base!r}"
        if image == "python":
            assert re.fullmatch(r"3\.11\.\d+-slim(-[a-z]+)?", tag), (
                f"{df.path}: {base!r}: the Python base is a slim Python 3.11 image"
            )
    python_bases = [b for b in bases if b.startswith("python:")]
    if component in DAEMONS:
        assert df.final.base in python_bases, f"{df.path}: final stage is not on Python slim"
    else:
        spark_version = check_spark_base(df)
        assert spark_version


def check_spark_base(df: Dockerfile) -> str:
    """The Spark image's base is Apache Spark's official Python image at the Spark version
    pinned as pyspark, within the spark extra's range; that version."""
    m = re.fullmatch(
        r"(?:apache/spark|spark):(\d+\.\d+\.\d+)-scala[\d.]+-java\d+-python3-ubuntu",
        df.final.base,
    )
    assert m, f"{df.path}: final stage {df.final.base!r} is not the official Spark Python image"
    version = m.group(1)
    assert version == df.global_args.get("SPARK_VERSION"), f"{df.path}: SPARK_VERSION"
    pinned = pins.parse_pins((ROOT / "images/spark/constraints.txt").read_text())
    assert pinned.get("pyspark") == version, (
        f"{df.path}: Spark {version} but images/spark/constraints.txt pins pyspark "
        f"{pinned.get('pyspark')}"
    )
    spark_extra = {
        canonicalize_name(r.name): r.specifier
        for r in map(Requirement, PROJECT["optional-dependencies"]["spark"])
    }
    assert spark_extra["pyspark"].contains(version), f"{df.path}: Spark {version} vs spark extra"
    return version


def check_runs_as_10001(df: Dockerfile, component: str) -> None:
    users = df.final.all("USER")
    assert users, f"{df.path}: the final stage sets no USER (it would run as root)"
    user = users[-1].args.strip()
    assert re.fullmatch(r"\d+(:\d+)?", user), f"{df.path}: USER {user!r} is not numeric"
    uid, _, gid = user.partition(":")
    assert uid == "10001" and gid in ("", "10001"), f"{df.path}: USER {user}, not 10001:10001"
    runs = " ".join(r.args for r in df.final.all("RUN"))
    assert re.search(r"useradd\b.*--uid 10001", runs) and re.search(
        r"groupadd\b.*--gid 10001", runs
    ), f"{df.path}: no user and group 10001 created (a passwd entry for uid 10001)"


def check_read_only_root(df: Dockerfile, component: str) -> None:
    """Nothing to write outside volumes: no bytecode at run time (compiled at build time),
    HOME and TMPDIR in /tmp (an emptyDir in the pods)."""
    variables = env(df.final)
    for key, value in {"PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp", "TMPDIR": "/tmp"}.items():
        assert variables.get(key) == value, f"{df.path}: ENV {key}={value} missing"
    runs = " ".join(r.args for s in df.stages for r in s.all("RUN"))
    assert "compileall" in runs, f"{df.path}: bytecode is not compiled at build time"


def read_repo_file(path: str) -> str:
    return (ROOT / path).read_text()


def check_no_spark(df: Dockerfile, component: str, read=read_repo_file) -> None:
    """No pyspark or Spark in a daemon or operator image: nothing in its install lines,
    nothing in the constraints it installs with, no Spark base."""
    for stage in df.stages:
        assert "spark" not in stage.base.lower(), f"{df.path}: a Spark base image"
        for run in stage.all("RUN"):
            assert "spark" not in run.args.lower(), f"{run.where}: Spark installed"
        for sources, _, _ in copies(stage):
            assert not any("spark" in s for s in sources), f"{df.path}: copies {sources}"
    for path in used_constraints(df):
        pinned = pins.parse_pins(read(path))
        assert not SPARK_DISTRIBUTIONS & set(pinned), f"{df.path}: {path} pins pyspark"


def check_entrypoint(df: Dockerfile, component: str) -> None:
    entrypoints = df.final.all("ENTRYPOINT")
    assert entrypoints, f"{df.path}: no ENTRYPOINT"
    text = entrypoints[-1].args
    try:
        argv = json.loads(text)
    except ValueError:
        raise AssertionError(f"{df.path}: ENTRYPOINT {text} is not in exec (JSON) form") from None
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv), df.path
    assert argv == ENTRYPOINTS[component], f"{df.path}: ENTRYPOINT {argv}"
    for cmd in df.final.all("CMD"):
        assert cmd.args.lstrip().startswith("["), f"{df.path}: CMD in shell form"
    if component in DAEMONS:
        check_console_script(argv[0])


def check_console_script(name: str) -> None:
    """``name`` is a [project.scripts] entry whose module and function exist."""
    assert name in SCRIPTS, f"{name} is not a console script of pyproject.toml"
    module, _, function = SCRIPTS[name].partition(":")
    package_dirs = PYPROJECT["tool"]["setuptools"]["package-dir"]
    top, *rest = module.split(".")
    path = ROOT / package_dirs.get(top, top) / pathlib.Path(*rest).with_suffix(".py")
    assert path.is_file(), f"{name}: no module {module} ({path})"
    tree = ast.parse(path.read_text())
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert function in defined, f"{name}: {module} defines no {function}()"


def check_oci_labels(df: Dockerfile, component: str) -> None:
    found = labels(df.final)
    for key in OCI_LABELS:
        value = found.get(f"org.opencontainers.image.{key}", "")
        assert value.strip(), f"{df.path}: OCI label org.opencontainers.image.{key} missing"
    assert found["org.opencontainers.image.title"] == f"waltz-{component}", df.path
    assert found["org.opencontainers.image.version"] == PROJECT["version"], (
        f"{df.path}: version label {found['org.opencontainers.image.version']!r}, "
        f"pyproject.toml says {PROJECT['version']}"
    )
    assert found["org.opencontainers.image.licenses"] == PROJECT["license"]["text"], df.path
    assert found["org.opencontainers.image.source"].startswith("https://"), df.path


def repo_files(call: PipCall, option: str) -> set[str]:
    """The repository files a pip call names with ``option`` (-c: constraint, -r:
    requirement), through the stage's COPYs and WORKDIR."""
    files = copied_files(call.stage)
    out = set()
    for path in call.options.get(option, []):
        in_stage = os.path.normpath(os.path.join(workdir_of(call.stage, call.run), path))
        assert in_stage in files, f"{call.run.where}: {path} is not COPY'd from the repository"
        out.add(files[in_stage])
    return out


def used_constraints(df: Dockerfile) -> set[str]:
    """The repository files the Dockerfile's pip calls name with -c."""
    return set().union(*(repo_files(call, "constraint") for call in pip_calls(df)))


def check_constraints_used(df: Dockerfile, component: str) -> None:
    """Every pip install or wheel of requirements goes through the constraints file (or a
    file of exact pins); nothing named without an exact pin; the waltz wheel with the
    image's extras only."""
    assert used_constraints(df) == CONSTRAINTS[component], (
        f"{df.path}: installs with {sorted(used_constraints(df))}, "
        f"not {sorted(CONSTRAINTS[component])}"
    )
    extras_seen: list[set[str]] = []
    installs = [c for c in pip_calls(df) if c.command in ("install", "wheel")]
    assert installs, f"{df.path}: no pip install"
    for call in installs:
        where = call.run.where
        for path in repo_files(call, "requirement"):
            pins.parse_pins(read_repo_file(path))  # exact pins only
        constraints = repo_files(call, "constraint")
        if call.command == "install" and call.positional:
            assert constraints == CONSTRAINTS[component], (
                f"{where}: pip install with -c {sorted(constraints)}, "
                f"not {sorted(CONSTRAINTS[component])}"
            )
        assert constraints <= CONSTRAINTS[component], f"{where}: -c {sorted(constraints)}"
        for word in call.positional:
            wheel = re.fullmatch(
                r'"?(?:\$\(echo )?/wheels/waltz-\*\.whl\)?(?:\[([\w,]*)\])?"?', word
            )
            if wheel:
                extras_seen.append(set(filter(None, (wheel.group(1) or "").split(","))))
                continue
            if word == "." and call.command == "wheel":
                continue
            requirement = Requirement(substitute(word, {**df.global_args, **call.stage.args}))
            specs = list(requirement.specifier)
            assert len(specs) == 1 and specs[0].operator == "==", f"{where}: {word} not pinned"
    assert extras_seen, f"{df.path}: the waltz wheel is not installed"
    for extras in extras_seen:
        assert extras == EXTRAS[component], f"{df.path}: waltz{sorted(extras)} installed"


def check_multi_stage(df: Dockerfile, component: str) -> None:
    """Build tools stay out: the wheel is built and the venv made in earlier stages; the
    final stage copies the venv and runs no pip install, compiler or build."""
    assert len(df.stages) >= 2, f"{df.path}: a single stage"
    assert any(o.get("from") for _, _, o in copies(df.final)), f"{df.path}: COPY --from"
    for run in df.final.all("RUN"):
        assert not re.search(r"pip\S* (install|wheel)|python\S* -m pip install", run.args), (
            f"{df.path}:{run.line}: pip install in the final stage"
        )
        assert not re.search(r"\b(gcc|g\+\+|build-essential|make|cmake|clang)\b", run.args), (
            f"{df.path}:{run.line}: build tools in the final stage"
        )
    for sources, _, options in copies(df.final):
        assert options.get("from") or not any(s in (".", "./") for s in sources), (
            f"{df.path}: the final stage copies the whole context"
        )


# How each image builds the compiled per-record loops (setup.py's WALTZ_BUILD_NATIVE): the
# daemons with them or not at all; the operator and Spark images as pure Python.
NATIVE_BUILD = {"storage": "require", "server": "require", "operator": "skip", "spark": "skip"}


def check_native_build(df: Dockerfile, component: str) -> None:
    """The waltz wheel is built from setup.py with the image's WALTZ_BUILD_NATIVE, and a
    stage that must compile installs a C compiler before it builds."""
    mode = NATIVE_BUILD[component]
    builds = [c for c in pip_calls(df) if c.command == "wheel" and "." in c.positional]
    assert builds, f"{df.path}: the waltz wheel is not built (no pip wheel .)"
    for call in builds:
        stage, run, where = call.stage, call.run, call.run.where
        assert re.search(rf"\bWALTZ_BUILD_NATIVE={mode}\b", run.args), (
            f"{where}: the wheel is not built with WALTZ_BUILD_NATIVE={mode}"
        )
        copied = set(copied_files(stage).values())
        assert "setup.py" in copied, f"{where}: setup.py is not copied, so nothing is compiled"
        if mode == "require":
            before = stage.instructions[: stage.instructions.index(run)]
            assert any(
                i.keyword == "RUN" and re.search(r"apt-get install\b.*\bgcc\b", i.args)
                for i in before
            ), f"{where}: no C compiler installed before the wheel is built"


# The shared build stage's target each image's wheel comes from, by WALTZ_BUILD_NATIVE.
BUILD_TARGET = {"require": "native", "skip": "pure"}


def check_shared_build_stage(df: Dockerfile, component: str) -> None:
    """The image builds on the build stage the images share (images/build.Dockerfile), on
    the target of its WALTZ_BUILD_NATIVE, tagged with the project's version as `make
    images` tags it, and builds no waltz wheel itself."""
    built = [s for s in df.stages if s.built_on]
    assert built, f"{df.path}: no stage is FROM the shared build stage ({SHARED_BUILD})"
    for stage in built:
        image, _, tag = (stage.built_on or "").partition(":")
        target = BUILD_TARGET[NATIVE_BUILD[component]]
        assert BUILD_IMAGES[image] == target, f"{df.path}: FROM {image}, not the {target} build"
        assert tag == PROJECT["version"], (
            f"{df.path}: FROM {stage.built_on}, but `make images` tags it {PROJECT['version']}"
        )
    for call in pip_calls(df):
        if call.run.path == df.path:
            assert not (call.command == "wheel" and "." in call.positional), (
                f"{call.run.where}: builds the waltz wheel itself, not in {SHARED_BUILD}"
            )


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def pattern_regex(pattern: str) -> re.Pattern:
    """A .dockerignore pattern as Docker matches it: ``*`` and ``?`` within one path
    element, ``**`` across any number of them."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore keeps ``path`` out of the context (a pattern that matches a
    folder of it excludes it too; the last matching pattern wins, ``!`` re-includes)."""
    result = False
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = pattern_regex(os.path.normpath(pattern.lstrip("!").strip("/")))
        if any(regex.match(p) for p in prefixes):
            result = not negate
    return result


def check_copy_sources(df: Dockerfile, component: str) -> None:
    patterns = dockerignore_patterns()
    for stage in df.stages:
        for sources, _, options in copies(stage):
            if "from" in options:
                assert options["from"] in df.stage_names(), f"{df.path}: --from={options['from']}"
                continue
            for source in sources:
                assert not source.startswith(("/", "..")), f"{df.path}: COPY {source}"
                matches = list(ROOT.glob(source.rstrip("/"))) if source not in (".", "./") else []
                assert matches, f"{df.path}: COPY source {source} is not in the repository"
                assert not ignored(source.rstrip("/"), patterns), (
                    f"{df.path}: COPY {source}, which .dockerignore excludes"
                )


CHECKS = [
    check_base_images_pinned,
    check_runs_as_10001,
    check_read_only_root,
    check_entrypoint,
    check_oci_labels,
    check_constraints_used,
    check_multi_stage,
    check_copy_sources,
    check_native_build,
    check_shared_build_stage,
]


# --- the Dockerfiles pass ----------------------------------------------------------------


@pytest.mark.parametrize("component", sorted(DOCKERFILES))
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_dockerfile(component, check):
    check(load(component), component)


@pytest.mark.parametrize("component", DAEMONS)
def test_no_spark_in_the_daemon_and_operator_images(component):
    check_no_spark(load(component), component)


def test_the_spark_image_is_the_official_spark_python_image_at_the_pinned_version():
    assert (
        check_spark_base(load("spark"))
        == pins.parse_pins((ROOT / "images/spark/constraints.txt").read_text())["pyspark"]
    )


def test_dockerignore_keeps_the_venv_git_and_local_state_out():
    patterns = dockerignore_patterns()
    local_build = (
        "waltz_client/wire/_native.cpython-311-x86_64-linux-gnu.so"  # an editable install's
    )
    for path in (
        ".venv",
        ".venv/bin/python",
        ".git",
        ".git/config",
        ".waltz-local/zk",
        local_build,
    ):
        assert ignored(path, patterns), f".dockerignore lets {path} in"
    kept = (
        "pyproject.toml",
        "setup.py",
        "README.md",
        "waltz_client/client.py",
        "images/constraints.txt",
    )
    for path in kept:
        assert not ignored(path, patterns), f".dockerignore keeps {path} out"


# --- each check fails when what it checks breaks ----------------------------------------

BREAKAGES = [
    # (component, check, old text, new text)
    ("storage", check_base_images_pinned, "python:3.11.16-slim-trixie", "python:latest"),
    ("server", check_base_images_pinned, "python:3.11.16-slim-trixie", "python:3.11-slim"),
    ("operator", check_base_images_pinned, "python:3.11.16-slim-trixie", "python"),
    ("spark", check_base_images_pinned, "SPARK_VERSION=4.3.0", "SPARK_VERSION=4.1.2"),
    ("storage", check_runs_as_10001, "USER 10001:10001", "USER root"),
    ("server", check_runs_as_10001, "USER 10001:10001", "USER waltz"),
    ("operator", check_runs_as_10001, "USER 10001:10001\n", ""),
    ("spark", check_runs_as_10001, "USER 10001:10001", "USER 185"),
    ("storage", check_read_only_root, "PYTHONDONTWRITEBYTECODE=1 \\\n    PYTHONUNB", "PYTHONUNB"),
    ("operator", check_read_only_root, "HOME=/tmp", "HOME=/home/waltz"),
    ("storage", check_entrypoint, '["waltz-storage"]', "waltz-storage"),
    ("server", check_entrypoint, '["waltz-server"]', '["waltz-serve"]'),
    ("operator", check_entrypoint, 'ENTRYPOINT ["waltz-operator"]', ""),
    ("spark", check_entrypoint, '"/usr/bin/tini", "--", ', ""),
    ("storage", check_oci_labels, 'org.opencontainers.image.licenses="Apache-2.0"', 'x="y"'),
    ("server", check_oci_labels, "ARG VERSION=0.1.0", "ARG VERSION=9.9.9"),
    ("spark", check_oci_labels, "org.opencontainers.image.source=", "x="),
    ("storage", check_constraints_used, "-c images/constraints.txt ", ""),
    ("operator", check_constraints_used, "[operator]", "[operator,spark]"),
    ("server", check_constraints_used, '[daemons]" \\\n', '[daemons]" aiohttp \\\n'),
    ("spark", check_constraints_used, "-c /pins/spark-constraints.txt ", ""),
    ("storage", check_multi_stage, "COPY --from=build /opt/waltz /opt/waltz", ""),
    ("server", check_multi_stage, "RUN python -m", "RUN pip install aiohttp && python -m"),
    ("storage", check_no_spark, '[daemons]" \\\n', '[daemons]" pyspark==4.3.0 \\\n'),
    ("storage", check_shared_build_stage, "FROM waltz-build-native:", "FROM waltz-build-pure:"),
    ("operator", check_shared_build_stage, "ARG BUILD_TAG=0.1.0", "ARG BUILD_TAG=latest"),
    ("spark", check_shared_build_stage, "FROM waltz-build-pure:${BUILD_TAG}",
     "FROM python:3.11.16-slim-trixie"),
    ("server", check_shared_build_stage, "RUN python -m venv",
     "RUN WALTZ_BUILD_NATIVE=require pip wheel -w /wheels . && python -m venv"),
]  # fmt: skip
# Breakages of the shared build stage, and the check that catches each in an image on it.
SHARED_BUILD_BREAKAGES = [
    ("storage", check_copy_sources, "README.md ./", "READ.md ./"),
    ("operator", check_copy_sources, "COPY waltz_client/ waltz_client/", "COPY tests/ tests/"),
    ("storage", check_native_build, "WALTZ_BUILD_NATIVE=require ", ""),
    ("server", check_native_build, "gcc libc6-dev", "libc6-dev"),
    ("server", check_native_build, "setup.py ", ""),
    ("operator", check_native_build, "WALTZ_BUILD_NATIVE=skip", "WALTZ_BUILD_NATIVE=auto"),
    ("spark", check_native_build, "setup.py ", ""),
    ("server", check_no_spark, "images/constraints.txt images/\n",
     "images/constraints.txt images/spark/constraints.txt images/\n"),
]  # fmt: skip
ALL_BREAKAGES = [(c, f, old, new, DOCKERFILES[c]) for c, f, old, new in BREAKAGES] + [
    (c, f, old, new, SHARED_BUILD) for c, f, old, new in SHARED_BUILD_BREAKAGES
]


@pytest.mark.parametrize(
    "component, check, old, new, path",
    ALL_BREAKAGES,
    ids=[
        f"{c}-{f.__name__.removeprefix('check_')}-{i}" for i, (c, f, *_) in enumerate(ALL_BREAKAGES)
    ],
)
def test_checks_catch_a_broken_dockerfile(component, check, old, new, path):
    broken = load(component, (path, old, new))
    with pytest.raises(AssertionError):
        check(broken, component)


def test_checks_catch_spark_pins_in_the_daemons_constraints():
    """check_no_spark reads the constraints a daemon image installs with."""

    def polluted(path: str) -> str:
        return read_repo_file(path) + "pyspark==4.3.0\n"

    with pytest.raises(AssertionError, match="pins pyspark"):
        check_no_spark(load("storage"), "storage", read=polluted)


def test_console_script_check():
    check_console_script("waltz")
    with pytest.raises(AssertionError):
        check_console_script("waltz-nothing")


# --- the constraints, in step with pyproject.toml and the venv --------------------------


def read_pins(path: str) -> dict[str, str]:
    return pins.parse_pins((ROOT / path).read_text())


def check_pins_cover(requirements: list[str], pinned: dict[str, str], what: str) -> None:
    """Every requirement (markers for the images) pinned, and its pin satisfies it."""
    environment = pins.image_environment()
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker and not requirement.marker.evaluate(environment):
            continue
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{what}: {requirement.name} ({text}) is not pinned"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"{what}: {name}=={pinned[name]} does not satisfy pyproject.toml's {text}"
        )


def check_pins_match_the_venv(pinned: dict[str, str], what: str) -> None:
    for name, version in pinned.items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here: nothing to compare with
        assert installed == version, (
            f"{what}: {name}=={version}, the venv has {installed}: "
            f"run .venv/bin/python images/pins.py"
        )


def test_constraints_are_exact_pins():
    for path in ("images/constraints.txt", "images/spark/constraints.txt"):
        assert read_pins(path), path
    with pytest.raises(ValueError):
        pins.parse_pins("aiohttp>=3.9\n")
    with pytest.raises(ValueError):
        pins.parse_pins("aiohttp==3.*\n")


# What images/constraints.txt pins: the core and the extras the daemon and operator images
# install.
DAEMON_REQUIREMENTS = [
    *PROJECT["dependencies"],
    *PROJECT["optional-dependencies"]["daemons"],
    *PROJECT["optional-dependencies"]["operator"],
]


def test_constraints_pin_every_runtime_dependency_of_pyproject():
    daemons = read_pins("images/constraints.txt")
    check_pins_cover(
        DAEMON_REQUIREMENTS,
        daemons,
        "images/constraints.txt",
    )
    assert not SPARK_DISTRIBUTIONS & set(daemons), "images/constraints.txt pins Spark"
    spark = {**daemons, **read_pins("images/spark/constraints.txt")}
    check_pins_cover(
        PROJECT["dependencies"] + PROJECT["optional-dependencies"]["spark"],
        spark,
        "images/spark/constraints.txt",
    )
    assert not set(daemons) & set(read_pins("images/spark/constraints.txt")), (
        "images/spark/constraints.txt repeats pins of images/constraints.txt"
    )


def test_constraints_match_the_venv():
    check_pins_match_the_venv(read_pins("images/constraints.txt"), "images/constraints.txt")
    check_pins_match_the_venv(
        read_pins("images/spark/constraints.txt"), "images/spark/constraints.txt"
    )


def test_constraints_are_what_pins_py_generates():
    """The transitive closure, nothing missing or extra (as the venv resolves it)."""
    for path, text in pins.files().items():
        assert path.read_text() == text, (
            f"{path.relative_to(ROOT)} is stale: run .venv/bin/python images/pins.py"
        )


def test_constraint_checks_catch_drift():
    daemons = read_pins("images/constraints.txt")
    requirements = DAEMON_REQUIREMENTS
    with pytest.raises(AssertionError, match="not pinned"):
        check_pins_cover(requirements, {k: v for k, v in daemons.items() if k != "kazoo"}, "x")
    with pytest.raises(AssertionError, match="does not satisfy"):
        check_pins_cover(requirements, {**daemons, "aiohttp": "3.8.0"}, "x")
    with pytest.raises(AssertionError, match="the venv has"):
        check_pins_match_the_venv({**daemons, "kazoo": "2.9.0"}, "x")


def test_build_requirements_pin_the_build_backend():
    pinned = read_pins("images/build-requirements.txt")
    check_pins_cover(PYPROJECT["build-system"]["requires"], pinned, "build-requirements.txt")


def test_the_distribution_carries_every_package():
    """Every package folder is in [tool.setuptools].packages: the images install a wheel,
    not the source tree, and a package left out is missing from all of them."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    for top, folder in setuptools["package-dir"].items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            relative = init.parent.relative_to(ROOT / folder)
            package = ".".join((top, *relative.parts))
            assert package in listed, f"{package} is not in pyproject.toml's packages"


# --- what runs in the images starts without what they leave out -------------------------

BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (not in the image)")
    sys.meta_path.insert(0, Block())
    """
)


def run_without(blocked: set[str], code: str) -> subprocess.CompletedProcess:
    program = f"BLOCKED = {sorted(blocked)!r}\n{BLOCKER}\n{textwrap.dedent(code)}"
    return subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


NOT_IN_THE_DAEMON_IMAGES = {"pyspark", "pyarrow", "numpy", "py4j", "kopf", "kubernetes", "yaml"}
NOT_IN_THE_OPERATOR_IMAGE = {"pyspark", "pyarrow", "numpy", "py4j"}


def test_the_daemons_start_without_the_extras():
    result = run_without(
        NOT_IN_THE_DAEMON_IMAGES,
        """
        import contextlib, io
        from waltz_storage.main import main as storage
        from waltz_server.main import main as server
        for main in (storage, server):
            with contextlib.redirect_stdout(io.StringIO()) as out:
                try:
                    main(["--help"])
                except SystemExit as e:
                    assert e.code == 0, e.code
            assert out.getvalue().startswith("usage:"), out.getvalue()
        """,
    )
    assert result.returncode == 0, result.stderr


def test_the_operator_starts_without_spark():
    result = run_without(
        NOT_IN_THE_OPERATOR_IMAGE,
        """
        import contextlib, io
        from waltz_operator.main import parser
        import waltz_operator.handlers
        with contextlib.redirect_stdout(io.StringIO()) as out:
            try:
                parser().parse_args(["--help"])
            except SystemExit as e:
                assert e.code == 0
        assert "waltz-operator" in out.getvalue()
        """,
    )
    assert result.returncode == 0, result.stderr


def test_the_waltz_command_starts_without_the_extras():
    result = run_without(
        NOT_IN_THE_DAEMON_IMAGES,
        """
        from waltz_client.tools.cli import build_parser
        build_parser()
        """,
    )
    assert result.returncode == 0, result.stderr


# --- make images ------------------------------------------------------------------------


def make_images(path: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [shutil.which("make"), "--no-print-directory", "images", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PATH": path},
    )


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_images_without_docker_says_so_and_succeeds(tmp_path):
    for tool in ("sh", "sed", "git"):  # make's shell and the target's tools, not docker
        if shutil.which(tool):
            (tmp_path / tool).symlink_to(shutil.which(tool))
    result = make_images(str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().count("\n") == 0 and "Docker is not available" in result.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_images_builds_all_four_with_docker(tmp_path):
    log = tmp_path / "docker.log"
    fake = tmp_path / "docker"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    fake.chmod(0o755)
    path = f"{tmp_path}:{os.environ['PATH']}"
    result = make_images(path)
    assert result.returncode == 0, result.stderr
    builds = [line.split() for line in log.read_text().splitlines() if line.startswith("build")]
    version = PROJECT["version"]
    # The shared build stage first, a target each, then the images on it.
    shared, images = builds[: len(BUILD_IMAGES)], builds[len(BUILD_IMAGES) :]
    assert sorted(
        (b[b.index("-f") + 1], b[b.index("--target") + 1], b[b.index("-t") + 1], b[-1])
        for b in shared
    ) == sorted((SHARED_BUILD, t, f"{image}:{version}", ".") for image, t in BUILD_IMAGES.items())
    assert sorted((b[b.index("-f") + 1], b[b.index("-t") + 1], b[-1]) for b in images) == sorted(
        (DOCKERFILES[c], f"ghcr.io/waltz-io/waltz-{c}:{version}", ".") for c in DOCKERFILES
    )
    assert all(f"VERSION={version}" in b and f"BUILD_TAG={version}" in b for b in images)
    log.unlink()
    result = make_images(path, "IMAGE_REPOSITORY=example.com/me", "IMAGE_TAG=e2e")
    assert result.returncode == 0, result.stderr
    builds = [line.split() for line in log.read_text().splitlines() if line.startswith("build")]
    tags = {b[b.index("-t") + 1] for b in builds}
    assert tags == {f"example.com/me/waltz-{c}:e2e" for c in DOCKERFILES} | {
        f"{image}:e2e" for image in BUILD_IMAGES
    }
    assert all("BUILD_TAG=e2e" in b for b in builds[len(BUILD_IMAGES) :])


# --- built and run, where a Docker engine exists ------------------------------------------


def docker_missing() -> str | None:
    if shutil.which("docker") is None:
        return "no Docker engine: image builds run where Docker exists (no docker command)"
    try:
        answered = subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode
    except (OSError, subprocess.TimeoutExpired):
        answered = 1
    if answered != 0:
        return "no Docker engine: image builds run where Docker exists (docker info fails)"
    return None


DOCKER_MISSING = docker_missing()
needs_docker = pytest.mark.skipif(DOCKER_MISSING is not None, reason=DOCKER_MISSING or "")
TEST_TAG = "pytest"
READ_ONLY = ["--read-only", "--user", "10001:10001", "--tmpfs", "/tmp"]


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=check
    )


@pytest.fixture(scope="module")
def built():
    """component -> image, each built once (on first use) from this repository, on the
    shared build stage (its targets built first, once)."""
    images: dict[str, str] = {}

    def build(component: str) -> str:
        if not images:
            for image, target in BUILD_IMAGES.items():
                docker(
                    "build", "-f", SHARED_BUILD, "--target", target,
                    "-t", f"{image}:{TEST_TAG}", str(ROOT), timeout=3600,
                )  # fmt: skip
        if component not in images:
            tag = f"waltz-{component}:{TEST_TAG}"
            docker(
                "build", "-f", DOCKERFILES[component], "--build-arg", f"BUILD_TAG={TEST_TAG}",
                "-t", tag, str(ROOT), timeout=3600,
            )  # fmt: skip
            images[component] = tag
        return images[component]

    return build


@needs_docker
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("component", sorted(DOCKERFILES))
def test_image_runs_read_only_as_10001(built, component):
    image = built(component)
    inspected = json.loads(docker("image", "inspect", image).stdout)[0]["Config"]
    assert inspected["User"] == "10001:10001"
    for key in OCI_LABELS:
        assert inspected["Labels"].get(f"org.opencontainers.image.{key}")
    if component == "spark":
        result = docker(
            "run", "--rm", *READ_ONLY, "--entrypoint", "python3", image, "-c",
            "import pyspark, waltz_client.spark; print(pyspark.__version__)",
        )  # fmt: skip
        assert result.stdout.strip() == read_pins("images/spark/constraints.txt")["pyspark"]
        return
    result = docker("run", "--rm", *READ_ONLY, image, "--help")
    assert result.stdout.startswith("usage:"), result.stdout + result.stderr
    # Only what it runs: no Spark; the operator's dependencies in the operator's only.
    probe = "import importlib.util as u; print([m for m in MODULES if u.find_spec(m)])"
    modules = ["pyspark", "pyarrow", "numpy"] + ([] if component == "operator" else ["kopf"])
    result = docker(
        "run", "--rm", *READ_ONLY, "--entrypoint", "python", image, "-c",
        f"MODULES = {modules!r}; {probe}",
    )  # fmt: skip
    assert result.stdout.strip() == "[]", result.stdout
    # The compiled per-record loops where the image's setup says they are built.
    probe = "from waltz_client.wire.native import native; print(native is not None)"
    result = docker("run", "--rm", *READ_ONLY, "--entrypoint", "python", image, "-c", probe)
    assert result.stdout.strip() == str(NATIVE_BUILD[component] == "require"), result.stdout
    if component == "server":  # the admin and client command, as the e2e Jobs run it
        result = docker("run", "--rm", *READ_ONLY, "--entrypoint", "waltz", image, "--help")
        assert result.returncode == 0, result.stderr


@needs_docker
@pytest.mark.timeout(3600)
def test_the_storage_daemon_stops_on_sigterm_within_the_grace_period(built):
    image = built("storage")
    container = docker(
        "run", "-d", *READ_ONLY, image,
        "--cluster-key", "00000000-0000-4000-8000-000000000001", "--num-partitions", "2",
    ).stdout.strip()  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "serving partitions" not in docker("logs", container).stderr:
            state = json.loads(docker("inspect", container).stdout)[0]["State"]
            assert state["Running"], docker("logs", container).stderr
            assert time.monotonic() < deadline, docker("logs", container).stderr
            time.sleep(0.5)
        started = time.monotonic()
        docker("stop", "--time", "20", container, timeout=60)
        took = time.monotonic() - started
        state = json.loads(docker("inspect", container).stdout)[0]["State"]
        # SIGTERM reached the daemon: it exited 0 by itself, well before SIGKILL (137).
        assert state["ExitCode"] == 0 and took < 15, (state, took)
    finally:
        docker("rm", "-f", "-v", container, check=False)
