"""``waltz check`` against a running cluster: appends with contended locks, follows the
feed, reads back, and says PASS; a cluster that is not there is one error line."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)


def waltz_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "waltz_client.cli", "check", *args],
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_check_passes_on_a_running_cluster(make_cluster):
    cluster = make_cluster(partitions=3)
    proc = waltz_check(
        "-z", cluster.zookeeper_connect, "--root", cluster.layout.root, "--transactions", "300"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("appended 300 of 300 in ")
    assert "lock retries" in lines[0]
    assert lines[1] == "feed: 300 transactions applied, 0 gaps; range reads: 300 found"
    assert lines[-1] == "PASS"
    # Again: it starts from where the log is now.
    again = waltz_check("-z", cluster.zookeeper_connect, "--root", cluster.layout.root)
    assert again.returncode == 0 and again.stdout.splitlines()[-1] == "PASS"


def test_check_without_a_cluster_is_one_error_line(zookeeper):
    proc = waltz_check("-z", zookeeper.connect_string, "--root", "/no-such-cluster")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("waltz check:")]
    assert errors and "no Waltz cluster at /no-such-cluster" in errors[0], proc.stderr
