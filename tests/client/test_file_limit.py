"""The daemons' open-files limit: the soft limit raised to the hard one at start, by the
pure choice and in real processes (a storage node and a server started with a low soft
limit run with the hard one, and say so)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from waltz_client.runtime.file_limit import UNLIMITED_TARGET, chosen_soft_limit

INFINITY = resource.RLIM_INFINITY
KEY = "6d2f1a52-3c1e-4f7a-9b0e-7a3f5c2d9e10"


def test_the_soft_limit_goes_up_to_the_hard_one_and_never_down():
    assert chosen_soft_limit(1024, 524288) == 524288
    assert chosen_soft_limit(1024, 1024) == 1024
    assert chosen_soft_limit(1024, INFINITY) == UNLIMITED_TARGET
    assert chosen_soft_limit(2 * UNLIMITED_TARGET, INFINITY) == 2 * UNLIMITED_TARGET
    assert chosen_soft_limit(INFINITY, INFINITY) == INFINITY


def low_soft_limit(soft: int):
    """A child's ``preexec_fn``: start it with ``soft`` open files under the same hard limit."""

    def lower() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return lower


def soft_limit_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no Max open files line")


def test_raise_open_files_limit_in_a_process_started_low():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard <= 256:
        pytest.skip(f"the hard limit here is {hard}: nothing to raise to")
    code = (
        "from waltz_client.runtime.file_limit import raise_open_files_limit as r; print(list(r()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=low_soft_limit(256),
        check=True,
    ).stdout
    before, now, problem = json.loads(out.replace("None", "null"))
    assert (before, problem) == (256, None)
    assert now == (UNLIMITED_TARGET if hard == INFINITY else hard)


def test_a_storage_node_started_low_runs_with_the_hard_limit(tmp_path: Path):
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard <= 256:
        pytest.skip(f"the hard limit here is {hard}: nothing to raise to")
    ready = tmp_path / "ready.json"
    args = [
        "--directory", str(tmp_path / "data"), "--cluster-key", KEY, "--num-partitions", "1",
        "--host", "127.0.0.1", "--port", "0", "--http-port", "0", "--ready-file", str(ready),
    ]  # fmt: skip
    log = (tmp_path / "node.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "waltz_storage.main", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        preexec_fn=low_soft_limit(256),
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.exists(), (tmp_path / "node.log").read_text()
        wanted = UNLIMITED_TARGET if hard == INFINITY else hard
        assert soft_limit_of(proc.pid) == wanted
        assert (
            f"open files: limit raised from 256 to {wanted}" in (tmp_path / "node.log").read_text()
        )
        port = json.loads(ready.read_text())["http_port"]
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read()
        lines = metrics.decode().splitlines()
        assert f"process_max_fds {float(wanted)}" in lines
        assert any(line.startswith("process_open_fds ") for line in lines)
        assert any(line.startswith("process_resident_memory_bytes ") for line in lines)
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
