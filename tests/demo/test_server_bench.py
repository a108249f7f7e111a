"""`waltz server bench` and `waltz server bench-catch-up` run as a user runs them: each
starts its own local cluster, drives the server at the protocol level and reports."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)

WALTZ = [sys.executable, "-m", "waltz_client.tools.cli"]


def run(args: list[str], tmp_path) -> str:
    out = subprocess.run(
        [*WALTZ, "server", *args, "--data-dir", str(tmp_path / "cluster")],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_the_commit_bench_commits_every_transaction_it_sends(tmp_path) -> None:
    out = run(["bench", "--transactions", "400", "--clients", "2", "--partitions", "2"], tmp_path)
    assert re.search(r"^committed 400 in [\d.]+ s: [\d,]+ tx/s", out, re.M), out
    assert re.search(r"commit latency \(send -> feed\): p50 [\d.]+ ms", out), out


def test_the_catch_up_bench_adds_a_replica_that_becomes_a_member(tmp_path) -> None:
    out = run(["bench-catch-up", "--transactions", "2000", "--size", "128"], tmp_path)
    copied = re.search(r"^copied ([\d,]+) transactions in .* a member [\d.]+ s after", out, re.M)
    assert copied, out
    assert int(copied.group(1).replace(",", "")) >= 2000, out


@pytest.mark.parametrize("args", [["bench", "--clients", "0"], ["bench", "--size", "-1"]])
def test_bad_arguments_are_refused_before_any_cluster_starts(args: list[str], tmp_path) -> None:
    out = subprocess.run(
        [*WALTZ, "server", *args, "--data-dir", str(tmp_path / "cluster")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "waltz server bench: error:" in out.stdout + out.stderr
    assert not (tmp_path / "cluster").exists()
