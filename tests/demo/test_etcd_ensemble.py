"""The local etcd cluster of `waltz bench --compare`'s etcd column: a real 3-member cluster
takes fsync'd puts through the sweep's load function and stops leaving no process; a
missing binary and a member that exits are clear errors."""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import signal
import threading
import urllib.request

import pytest

from waltz_client.tools.demo.compare import EtcdConnection, _etcd_load, etcd_missing
from waltz_client.tools.local import etcd_ensemble
from waltz_client.tools.local.etcd_ensemble import EtcdEnsemble, EtcdUnavailable

pytestmark = pytest.mark.timeout(120)

needs_etcd = pytest.mark.skipif(
    shutil.which("etcd") is None,
    reason="etcd is not on PATH (`make etcd-deps` installs Debian's etcd-server)",
)


def wal_fsyncs(url: str) -> int:
    """How many times the member has fsync'd its write-ahead log (its /metrics)."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    name = "etcd_disk_wal_fsync_duration_seconds_count "
    (line,) = (line for line in text.splitlines() if line.startswith(name))
    return int(float(line[len(name) :]))


def keys_under(url: str, prefix: bytes) -> int:
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    body = {
        "key": base64.b64encode(prefix).decode(),
        "range_end": base64.b64encode(end).decode(),
        "count_only": True,
    }
    request = urllib.request.Request(f"{url}/v3/kv/range", json.dumps(body).encode())
    answer = json.loads(urllib.request.urlopen(request, timeout=10).read())
    return int(answer.get("count", 0))


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def etcd_processes_in(path: str) -> list[int]:
    """Processes whose command line names ``path`` (an etcd member left behind)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if path.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


@needs_etcd
def test_three_members_take_fsynced_puts_from_the_load_and_stop_clean(tmp_path) -> None:
    ensemble = EtcdEnsemble(str(tmp_path / "etcd"))
    ensemble.start()
    try:
        pids = ensemble.pids
        assert len(set(pids)) == 3 and all(running(pid) for pid in pids)
        urls = ensemble.client_urls
        before = [wal_fsyncs(url) for url in urls]
        out: queue.Queue = queue.Queue()
        # 4 writes in flight for half a second, as a load process of the sweep runs them.
        _etcd_load(",".join(urls), "/t", 0, 4, 100, threading.Barrier(1), 0.5, out)  # type: ignore[arg-type]
        writes, latencies, client = out.get_nowait()
        assert writes > 0 and len(latencies) == writes and min(latencies) > 0
        assert client in ("HTTP/1.1 JSON gateway on uvloop", "HTTP/1.1 JSON gateway on asyncio")
        # Every counted put is in the store (and so are the 4 connections' warm-ups and
        # the puts that completed after the clock stopped), read on any member.
        assert keys_under(urls[1], b"/t/bench/") >= writes + 4
        # Committed means fsync'd in the write-ahead logs of a majority (fsync on).
        grew = [wal_fsyncs(url) - b for url, b in zip(urls, before, strict=True)]
        assert sum(g > 0 for g in grew) >= 2, grew
        ensemble.check_running()
    finally:
        ensemble.stop()
    assert ensemble.pids == []
    assert not any(running(pid) for pid in pids)
    assert etcd_processes_in(str(tmp_path)) == []


@needs_etcd
def test_the_http_client_gets_the_gateway_s_answers(tmp_path) -> None:
    import asyncio

    async def talk(url: str) -> tuple[tuple[int, bytes], tuple[int, bytes]]:
        conn = EtcdConnection(url)
        try:
            good = await conn.post("/v3/kv/put", b'{"key":"YQ==","value":"Yg=="}')
            bad = await conn.post("/v3/kv/put", b"{not json")  # same connection, kept alive
            return good, bad
        finally:
            conn.close()

    with EtcdEnsemble(str(tmp_path / "etcd"), members=1) as ensemble:
        (status, body), (bad_status, _) = asyncio.run(talk(ensemble.client_urls[0]))
    assert status == 200 and "revision" in json.loads(body)["header"]
    assert bad_status == 400


def test_no_etcd_on_path_is_one_clear_line(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EtcdUnavailable, match=r"`etcd` is not on PATH: `make etcd-deps`"):
        EtcdEnsemble(str(tmp_path / "etcd")).start()
    reason = etcd_missing()
    assert reason is not None and "\n" not in reason and "etcd-server" in reason


@needs_etcd
def test_a_member_that_cannot_start_is_reported_with_its_log(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(etcd_ensemble, "SNAPSHOT_COUNT", "many")  # etcd refuses the flag
    ensemble = EtcdEnsemble(str(tmp_path / "etcd"))
    with pytest.raises(EtcdUnavailable, match=r"exited with code") as caught:
        ensemble.start(timeout=20)
    assert "last lines of" in str(caught.value) and "snapshot-count" in str(caught.value)
    assert ensemble.pids == [] and etcd_processes_in(str(tmp_path)) == []


@needs_etcd
def test_a_member_that_dies_later_is_reported(tmp_path) -> None:
    with EtcdEnsemble(str(tmp_path / "etcd")) as ensemble:
        os.kill(ensemble.pids[2], signal.SIGKILL)
        ensemble.members[2].proc.wait(10)  # type: ignore[union-attr]
        with pytest.raises(EtcdUnavailable, match=r"member-3 .* exited with code -9"):
            ensemble.check_running()
    assert etcd_processes_in(str(tmp_path)) == []
