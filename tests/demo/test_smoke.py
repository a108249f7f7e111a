"""`waltz smoke`, a short run: appends under storage, server and ZooKeeper faults, then
every invariant of the log is verified (the command exits 0 only if all hold)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_short_smoke_run_passes_under_faults(tmp_path, zookeeper_available, tls):
    """Once on plain TCP, once with every link on mutual TLS."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "waltz_client.tools.cli",
            "smoke",
            "--data-dir",
            str(tmp_path / "smoke"),
            "--duration",
            "12",
            "--fault-every",
            "1.5",
            "--clients",
            "2",
            "--writers",
            "4",
            "--seed",
            "7",
            *([] if tls else ["--insecure"]),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-3000:]
    assert out.count("fault: ") >= 3
    assert "=== waltz smoke report ===" in out
    assert "FAIL" not in out
    assert out.count("PASS") == 8
