"""The compiled per-record loops are built wherever a C compiler is (setup.py builds them
optionally, so a broken build would fail silently and leave every hot loop in Python),
and WALTZ_PURE_PYTHON=1 turns them off."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

PROBE = "from waltz_client.wire.native import native; print(native is not None)"


def probe(**env: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env={**os.environ, **env}
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_built_wherever_a_compiler_is():
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) here: the pure-Python loops are expected")
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    if not headers.is_file():
        pytest.skip(f"no Python headers ({headers}) here: the pure-Python loops are expected")
    assert probe() == "True", "a C compiler is here but waltz_client.wire._native is not built"


def test_waltz_pure_python_turns_them_off():
    assert probe(WALTZ_PURE_PYTHON="1") == "False"


def describe(**env: str) -> str:
    code = "from waltz_client.wire.native import describe; print(describe())"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_describe_names_which_loops_run():
    assert describe(WALTZ_PURE_PYTHON="1") == "Python (WALTZ_PURE_PYTHON)"
    if probe() == "True":
        assert describe().startswith("compiled, CRC-32 by ")
    else:
        assert describe() == "Python (the compiled ones are not built)"
