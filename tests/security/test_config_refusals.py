"""Bad configuration is refused clearly: one line naming the setting, exit status 2, and
at once (a malformed ZooKeeper address used to be retried for ever); a damaged control
file is reported as damaged. Real console scripts, real files."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from waltz_client import WaltzClientConfig
from waltz_client.config import WaltzConfigError
from waltz_client.runtime.settings import host_name, zookeeper_address
from waltz_storage.control_file import ControlFile

KEY = "c0ffee00-1111-4222-8333-444455556666"
BIN = Path(sys.executable).parent


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def refused(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # one line, no traceback
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def storage(*extra: str, tmp: Path) -> subprocess.CompletedProcess:
    return run(
        str(BIN / "waltz-storage"),
        "--directory",
        str(tmp / "data"),
        "--cluster-key",
        KEY,
        "--num-partitions",
        "1",
        "--port",
        "0",
        "--http-port",
        "0",
        *extra,
    )


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--ready-file", "/nonexistent-dir/ready.json"], ["setting ready_file", "does not exist"]),
        (["--ready-file", "/tmp"], ["setting ready_file", "is a directory"]),
        (["--segment-bytes", "100GiB"], ["setting segment_bytes", "at most 64GiB"]),
        (["--queue-max-bytes", "2048GiB"], ["setting queue_max_bytes", "at most 1TiB"]),
        (["--host", "bad host"], ["setting host", "expected a host name or IP address"]),
        (["--zookeeper", ":::::"], ["setting zookeeper", "bad hostname"]),
    ],
)
def test_the_storage_daemon_refuses_bad_settings(tmp_path, args, fragments):
    refused(storage(*args, tmp=tmp_path), "waltz-storage: error:", *fragments)


def test_a_bad_event_loop_choice_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("WALTZ_EVENT_LOOP", "tokio")  # the daemon inherits it
    refused(
        storage(tmp=tmp_path),
        "waltz-storage: error: WALTZ_EVENT_LOOP='tokio'",
        "expected one of uvloop, asyncio",
    )
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    ("zookeeper", "fragment"),
    [
        (":::::", "bad hostname"),
        ("host:notaport", "notaport"),
        ("zk:99999", "out of range"),
        ("zk 1:2181", "got 'zk 1:2181'"),
    ],
)
def test_a_malformed_zookeeper_address_exits_2_at_once(zookeeper, fragment):
    result = run(str(BIN / "waltz-server"), "--zookeeper", zookeeper, "--port", "0")
    refused(result, "waltz-server: error: setting zookeeper", fragment)
    cli = run(str(BIN / "waltz"), "cluster", "show", "--zookeeper", zookeeper)
    refused(cli, "waltz cluster: error: --zookeeper:", fragment)
    with pytest.raises(WaltzConfigError, match=r"WaltzClientConfig\.zookeeper: expected host:port"):
        WaltzClientConfig(zookeeper)


def test_the_server_refuses_sizes_and_hosts_out_of_bounds():
    base = [str(BIN / "waltz-server"), "--zookeeper", "127.0.0.1:1"]
    refused(run(*base, "--data-cache-bytes", "999999GiB"), "setting data_cache_bytes", "1TiB")
    refused(run(*base, "--advertised-host", "a b"), "setting advertised_host")
    refused(run(*base, "--ready-file", "/nonexistent-dir/r.json"), "setting ready_file")


def test_well_formed_values_pass():
    for good in ("zk1:2181,zk2:2181/chroot", "[::1]:2181", "zk-0.zk.svc:2181", "10.0.0.1:1"):
        assert zookeeper_address(good) == good
    for good in ("0.0.0.0", "::", "::1", "waltz-storage-0.waltz", "[fe80::1]", "localhost"):
        assert host_name(good) == good
    for bad in ("", " ", "a b", "a..b", "-x"):
        with pytest.raises(ValueError):
            host_name(bad)


def test_a_truncated_control_file_is_reported_damaged(tmp_path):
    ControlFile.create(str(tmp_path), uuid.UUID(KEY), 8).close()
    path = tmp_path / "waltz-storage.ctl"
    path.write_bytes(path.read_bytes()[:200])  # the header and part of one entry
    result = run(str(BIN / "waltz"), "storage", "control", str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "DAMAGED: 200 bytes, expected" in result.stdout
    assert "for 8 partitions (truncated)" in result.stdout
    assert " ok" not in result.stdout.splitlines()[0]
