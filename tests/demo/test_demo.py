"""`waltz demo`, the README's main job, run for real at a small scale (faults included)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)


def test_the_demo_survives_its_faults_and_reports_pass(tmp_path, zookeeper_available):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "waltz_client.tools.cli",
            "demo",
            "--data-dir",
            str(tmp_path / "demo"),
            "--transfers",
            "600",
            "--clients",
            "2",
            "--tellers",
            "3",
            "--partitions",
            "2",
            "--accounts",
            "12",
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "SIGKILL storage-1" in out and "SIGKILL server-" in out
    assert "partition 0 moved to" in out
    assert "=== waltz demo report ===" in out
    assert "FAIL" not in out
    assert out.count("PASS") == 7
