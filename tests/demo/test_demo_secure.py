"""`waltz demo` (`make run`) runs on mutual TLS with ZooKeeper ACLs unless `--insecure`."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)


def test_the_demo_is_secure_by_default(tmp_path, zookeeper_available):
    data = tmp_path / "demo"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "waltz_client.tools.cli", "demo", "--data-dir", str(data)),
            *("--clients", "1", "--tellers", "2", "--transfers", "40", "--partitions", "1"),
            *("--accounts", "4", "--no-faults"),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert f"mutual TLS (a throw-away CA in {data}/pki), ZooKeeper ACLs" in out
    assert "security                  mutual TLS, ZooKeeper ACLs" in out
    assert "FAIL" not in out and out.count("PASS") == 7
    # Every daemon ran with TLS: none announced plain text.
    for name in ("storage-0", "storage-1", "storage-2", "server-0", "server-1"):
        assert "PLAIN TEXT" not in (data / f"{name}.log").read_text(), name
    assert (data / "pki" / "zk-auth").exists()
