"""``waltz storage verify|dump|control|bench`` on the files of a real storage node."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import signal
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import pytest

from waltz_client.wire.records import Record, ReqId, crc32
from waltz_client.wire.storage_client import StorageFailure
from waltz_client.wire.storage_messages import StorageError
from waltz_storage.group_sync import load_write_back

T = TypeVar("T")
SESSION = 42
RECORD_BYTES = 300
TIME = 1_767_225_600_000  # 2026-01-01 UTC: partition 0's commit times count up from it


def run(coro: Awaitable[T], timeout: float = 30.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


@pytest.fixture
def filled(storage_factory):
    """A stopped node whose partition 0 spans several small segments; partition 1 has a few."""
    node = storage_factory(extra=["--segment-bytes", "4096"])
    rng = random.Random(2024)
    written = {
        0: [
            Record(i, ReqId(5, 6, 0, i), i * 3, rng.randbytes(RECORD_BYTES + i % 7), TIME + i)
            for i in range(60)
        ],
        1: [Record(i, ReqId(5, 6, 1, i), 0, rng.randbytes(50)) for i in range(4)],
    }

    async def write():
        async with await node.client() as c:
            for p, recs in written.items():
                for i in range(0, len(recs), 4):
                    await c.append(SESSION, p, recs[i : i + 4])

    run(write())
    assert node.stop() == 0
    node.written = written
    return node


def segments(node, partition: int) -> list[Path]:
    return sorted((node.directory / str(partition)).glob("*.seg"))


def dump_json(waltz, seg: Path, *args: str) -> list[dict]:
    result = waltz("storage", "dump", str(seg), "--json", *args)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_verify_healthy_directory(filled, waltz):
    segs0 = segments(filled, 0)
    assert len(segs0) >= 3, "the test wants records spread over several segments"
    result = waltz("storage", "verify", str(filled.directory))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    all_segs = sorted(filled.directory.glob("*/*.seg"))
    assert len(lines) == len(all_segs)
    assert all(line.startswith("OK") for line in lines), result.stdout
    for seg in all_segs:
        assert any(line.startswith(f"OK      {seg}: format 2, ") for line in lines), lines

    # --json: every record counted once, first/last IDs chain across segments.
    result = waltz("storage", "verify", "--json", str(filled.directory / "0"))
    assert result.returncode == 0, result.stderr
    reports = json.loads(result.stdout)
    assert [r["path"] for r in reports] == [str(s) for s in segs0]
    assert all(r["ok"] and not r["problems"] for r in reports)
    assert all(r["format_version"] == 2 for r in reports)
    assert sum(r["records"] for r in reports) == 60
    assert reports[0]["first_txid"] == 0 and reports[-1]["last_txid"] == 59
    for a, b in itertools.pairwise(reports):
        assert b["first_txid"] == a["last_txid"] + 1
        assert Path(b["path"]).name == f"{b['first_txid']:019d}.seg"

    # A single segment file.
    result = waltz("storage", "verify", str(segs0[1]))
    assert result.returncode == 0 and result.stdout.startswith("OK"), result.stdout


def test_verify_detects_a_flipped_byte_and_names_the_transaction(filled, waltz):
    segs0 = segments(filled, 0)
    target = segs0[1]  # not the last segment: nothing on open would cut it as a torn tail
    rows = dump_json(waltz, target)
    victim = rows[len(rows) // 2]
    txid = victim["transaction_id"]
    middle = victim["offset"] + 36 + victim["length"] // 2  # inside the record's data
    with open(target, "r+b") as f:
        f.seek(middle)
        byte = f.read(1)
        f.seek(middle)
        f.write(bytes([byte[0] ^ 0x40]))

    result = waltz("storage", "verify", str(filled.directory))
    assert result.returncode == 1, result.stdout + result.stderr
    bad = [line for line in result.stdout.splitlines() if line.startswith("CORRUPT")]
    assert len(bad) == 1 and str(target) in bad[0], result.stdout
    assert f"transaction {txid}" in result.stdout, result.stdout
    assert "checksum" in result.stdout
    # The other segments are still reported sound.
    ok = [line for line in result.stdout.splitlines() if line.startswith("OK")]
    assert len(ok) == len(sorted(filled.directory.glob("*/*.seg"))) - 1

    # dump stops at the damaged record and says so, exit 1.
    result = waltz("storage", "dump", str(target), "--json")
    assert result.returncode == 1
    good = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["transaction_id"] for r in good] == list(range(rows[0]["transaction_id"], txid))
    assert f"transaction {txid}" in result.stderr or str(victim["offset"]) in result.stderr

    # A node on these files never serves the damaged record as if it were whole.
    filled.start()

    async def read():
        async with await filled.client() as c:
            with pytest.raises(StorageFailure) as info:
                await c.record(SESSION, 0, txid)
            assert info.value.error in (
                StorageError.IO_ERROR,
                StorageError.PARTITION_UNAVAILABLE,
            )
            # Partition 1 is untouched.
            assert await c.record(SESSION, 1, 2) == filled.written[1][2]

    run(read())


def test_dump_prints_records_as_json(filled, waltz):
    seg = segments(filled, 0)[1]
    first = int(seg.stem)
    assert first > 0
    rows = dump_json(waltz, seg, "--count", "3")
    assert len(rows) == 3
    assert [r["transaction_id"] for r in rows] == [first, first + 1, first + 2]
    for r in rows:
        rec = filled.written[0][r["transaction_id"]]
        assert r["req_id"] == [5, 6, 0, rec.transaction_id]
        assert r["header"] == rec.header
        assert r["length"] == len(rec.data)
        assert r["crc32"] == crc32(rec.data)
        assert r["commit_time_ms"] == rec.timestamp
        assert r["commit_time"] == f"2026-01-01T00:00:00.{rec.transaction_id:03d}Z"
    assert rows[0]["offset"] == 128  # right after the segment header
    assert rows[1]["offset"] == 128 + 48 + rows[0]["length"]  # a format-2 record

    # --from and --data.
    rows = dump_json(waltz, seg, "--from", str(first + 2), "--count", "2", "--data")
    assert [r["transaction_id"] for r in rows] == [first + 2, first + 3]
    for r in rows:
        assert bytes.fromhex(r["data_hex"]) == filled.written[0][r["transaction_id"]].data

    # Without --count: the whole segment; the text form has one line per record.
    everything = dump_json(waltz, seg)
    nxt = segments(filled, 0)[2]
    assert len(everything) == int(nxt.stem) - first
    result = waltz("storage", "dump", str(seg), "--count", "2")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"txid={first} ")
    assert f" time=2026-01-01T00:00:00.{first:03d}Z " in lines[0]


def test_control_shows_cluster_key_and_fence_session(filled, waltz):
    result = waltz("storage", "control", str(filled.directory), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["cluster_key"] == str(filled.key)
    assert report["num_partitions"] == 4
    assert report["header_ok"] is True
    assert [p["partition"] for p in report["partitions"]] == [0, 1, 2, 3]
    for p, expected in ((0, SESSION), (1, SESSION), (2, -1)):
        slots = [s for s in report["partitions"][p]["slots"] if s is not None]
        assert len(slots) == 2
        newest = max(slots, key=lambda s: s["sequence"])
        assert newest["fence_session_id"] == expected

    # The text form, on the control file itself.
    result = waltz("storage", "control", str(filled.directory / "waltz-storage.ctl"))
    assert result.returncode == 0, result.stderr
    assert str(filled.key) in result.stdout
    assert f"fence session {SESSION}" in result.stdout


def test_control_reflects_a_newer_session_after_sigkill(storage_node, waltz):
    async def go():
        async with await storage_node.client() as c:
            assert await c.max_transaction_id(77, 3) == -1

    run(go())
    storage_node.kill(signal.SIGKILL)
    result = waltz("storage", "control", str(storage_node.directory), "--json")
    assert result.returncode == 0, result.stderr
    slots = json.loads(result.stdout)["partitions"][3]["slots"]
    assert max(s["fence_session_id"] for s in slots if s) == 77


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["verify", "{missing}"], ["no such file"]),
        (["verify", "{empty}"], ["no segment files"]),
        (["dump", "{missing}"], ["not a file"]),
        (["dump", "{empty}"], ["not a file"]),
        (["control", "{missing}"], ["no such file"]),
        (["bench", "--batch-sizes", "a,b"], ["--batch-sizes"]),
        (["bench", "--in-flight", "0"], ["in-flight"]),
        (["bench", "--duration", "0"], ["duration"]),
        (["bench-sync", "--files", "a"], ["--files"]),
        (["bench-sync", "--rounds", "0"], ["--rounds"]),
        (["bench-sync", "--dir", "{missing}"], ["not a directory"]),
        (["bench-group", "--partitions", "a"], ["--partitions"]),
        (["bench-group", "--appends", "0"], ["--appends"]),
        (["bench-group", "--dir", "{missing}"], ["not a directory"]),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(tmp_path, waltz, args, words):
    (tmp_path / "empty").mkdir()
    paths = {"missing": str(tmp_path / "nope" / "missing"), "empty": str(tmp_path / "empty")}
    args = [a.format(**paths) for a in args]
    result = waltz("storage", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    err = result.stderr.strip()
    assert err.startswith("waltz storage: error:"), err
    assert len(err.splitlines()) == 1, err
    for word in words:
        assert word.lower() in err.lower(), err
    for path in paths.values():
        if path in args:
            assert path in err
    assert not list(tmp_path.glob("waltz-bench-*")), "a refused bench left files behind"


def test_usage_errors_exit_2(waltz):
    for args in (["storage"], ["storage", "frobnicate"], ["storage", "dump"]):
        result = waltz(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert "usage:" in result.stderr


def test_dump_of_a_file_that_is_not_a_segment(tmp_path, waltz):
    bogus = tmp_path / "0000000000000000000.seg"
    bogus.write_bytes(b"\x00" * 64)
    result = waltz("storage", "dump", str(bogus))
    assert result.returncode == 2
    assert str(bogus) in result.stderr and "header" in result.stderr
    result = waltz("storage", "verify", str(bogus))
    assert result.returncode == 1
    assert result.stdout.startswith("CORRUPT")


def run_bench(tmp_path, waltz, *args: str):
    """``waltz storage bench --json`` with ``args`` in ``tmp_path``: its output and rows."""
    result = waltz(
        "storage", "bench", "--dir", str(tmp_path / "bench"), *args, "--json",
        cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout, json.loads(result.stdout[result.stdout.index("\n[") + 1 :])


def test_bench_runs_and_reports_positive_rates(tmp_path, waltz):
    _, rows = run_bench(
        tmp_path, waltz, "--duration", "0.2", "--batch-sizes", "1,10", "--in-flight", "1,2"
    )
    assert [(r["batch"], r["inflight"]) for r in rows] == [(1, 1), (1, 2), (10, 1), (10, 2)]
    for r in rows:
        assert r["records_per_s"] > 0
        assert r["mb_per_s"] > 0
        assert r["raw_records_per_s"] > 0
        assert 0 < r["p50_ms"] <= r["p99_ms"]
        assert r["ratio"] == pytest.approx(r["records_per_s"] / r["raw_records_per_s"])
        # The node's own CPU, measured on its process: every append costs some.
        assert 0 < r["node_cpu_us_per_record"] < 1e6
    # The bench cleans up its node's data; no process is left (it waits for it).
    assert not list((tmp_path / "bench").glob("run-*"))


@pytest.mark.parametrize("group_sync", [True, False])
def test_bench_appends_to_several_partitions_at_once(tmp_path, waltz, group_sync):
    """--partitions N: N appenders at once, a partition each, on one node (the node is
    started with N partitions; an append to a partition it lacks would fail the run)."""
    out, (row,) = run_bench(
        tmp_path, waltz, "--duration", "0.3", "--batch-sizes", "5", "--in-flight", "2",
        "--partitions", "3", *([] if group_sync else ["--no-group-sync"]),
    )  # fmt: skip
    assert "3 partitions at once" in out
    assert ("group_sync off" in out) is not group_sync
    assert (row["batch"], row["inflight"]) == (5, 2)
    assert row["records_per_s"] > 0


def test_bench_refuses_no_partitions(tmp_path, waltz):
    result = waltz("storage", "bench", "--partitions", "0", cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    assert "--partitions must be >= 1" in result.stderr


def test_bench_says_why_its_node_did_not_start(tmp_path, waltz):
    """A bad WALTZ_STORAGE_* setting stops the bench's node: the node names the setting,
    and the bench ends with one line of its own, not a traceback."""
    result = waltz(
        "storage", "bench", "--dir", str(tmp_path / "bench"), "--duration", "0.1",
        "--batch-sizes", "1", "--in-flight", "1",
        cwd=tmp_path, timeout=60, env={"WALTZ_STORAGE_GROUP_SYNC": "maybe"},
    )  # fmt: skip
    assert result.returncode == 2
    assert "group_sync" in result.stderr and "'maybe'" in result.stderr
    assert "the storage process exited with status 2 before it was ready" in result.stderr
    assert "Traceback" not in result.stderr


def table_rows(output: str) -> list[str]:
    """A benchmark's Markdown table: its header and rows, without the alignment line."""
    return [line for line in output.splitlines() if line.startswith("| ") and "---" not in line]


@pytest.mark.skipif(load_write_back() is None, reason="needs Linux 5.8+ (sync_file_range)")
def test_bench_sync_compares_a_file_each_with_one_journal(tmp_path, waltz):
    """What making a group durable costs by the files it touched: a row a file count,
    both ways measured, and nothing left behind."""
    result = waltz(
        "storage", "bench-sync", "--dir", str(tmp_path), "--files", "1,3", "--bytes", "512",
        "--rounds", "5", cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rows = table_rows(result.stdout)
    assert [row.split("|")[1].strip() for row in rows[1:]] == ["1", "3"]
    for row in rows[1:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == f"{int(cells[0]) * 512:,}"
        assert float(cells[2]) > 0 and float(cells[4]) > 0
    assert list(tmp_path.iterdir()) == []


def test_bench_group_reports_a_row_a_group_size_and_leaves_nothing(tmp_path, waltz):
    """What a group of appends costs the I/O thread, by the partitions in it: a row each,
    the user and system CPU a request and the wall time a group, and no files left."""
    result = waltz(
        "storage", "bench-group", "--dir", str(tmp_path), "--partitions", "1,3",
        "--records", "2", "--record-bytes", "100", "--appends", "12", cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rows = table_rows(result.stdout)
    assert [row.split("|")[1].strip() for row in rows[1:]] == ["1", "3"]
    for row in rows[1:]:
        cells = [float(c.strip()) for c in row.strip("|").split("|")]
        assert cells[1] == 2
        assert cells[2] + cells[3] > 0 and cells[4] > 0
    assert list(tmp_path.iterdir()) == []
