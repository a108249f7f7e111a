"""`waltz bench --compare`: the sweep's table and ratios from known cells, its argument
checks, and one small real cell against a local cluster."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from waltz_client.tools.demo import compare
from waltz_client.tools.demo.compare import (
    ETCD,
    ZOOKEEPER,
    Cell,
    cpu_table,
    median_cell,
    ratios,
    table,
)

pytestmark = pytest.mark.timeout(300)


def cell(system: str, c: int, writes: int, cpu: float = 1.0) -> Cell:
    return Cell(system, c, writes, 2.0, sorted(float(i) for i in range(1, 101)), cpu)


def test_the_cpu_split_is_a_write_s_cpu_a_process_of_each_role() -> None:
    one = Cell(
        "waltz, 1 partition", 16, 10_000, 2.0, [1.0], 1.3,
        {"server": 0.6, "storage": 0.9, "load": 0.5}, {"server": 1, "storage": 3, "load": 2},
    )  # fmt: skip
    # 0.9 s over 3 nodes and 10,000 writes: 30 us a write a node.
    assert one.cpu_split() == "server 60 us, storage 3 x 30 us, load 2 x 25 us"
    zk = Cell(ZOOKEEPER, 16, 1000, 2.0, [1.0], 0.3, {"zookeeper": 0.3}, {"zookeeper": 3})
    lines = cpu_table([one, zk], [1, 16]).splitlines()
    assert lines[0] == "| CPU a write, a process | C=1 | C=16 |"
    assert lines[2] == "| waltz, 1 partition |  | server 60 us, storage 3 x 30 us, load 2 x 25 us |"
    assert lines[3] == f"| {ZOOKEEPER} |  | zookeeper 3 x 100 us |"


def test_median_cell_is_the_middle_rate() -> None:
    cells = [cell("a", 1, w) for w in (300, 100, 200)]
    assert median_cell(cells).writes == 200


def test_table_and_ratios() -> None:
    one, four = "waltz, 1 partition", "waltz, 4 partitions"
    cells = [
        cell(one, 1, 2000),
        cell(one, 16, 20000, cpu=0.6),
        cell(four, 1, 1000),
        cell(four, 16, 10000),
        cell(ZOOKEEPER, 1, 1000),
        cell(ZOOKEEPER, 16, 4000),
    ]
    text = table(cells, [1, 16])
    lines = text.splitlines()
    assert lines[0].startswith("| system | C=1 writes/s | C=16 writes/s | C=16 p99 ms")
    assert lines[2] == "| waltz, 1 partition | 1,000 | 10,000 | 100.0 | 51.00 | 0.030 |"
    assert ratios(cells) == [
        f"C=1: {four} / {one} = 0.50x",
        f"C=1: {one} / {ZOOKEEPER} = 2.00x",
        f"C=16: {four} / {one} = 0.50x",
        f"C=16: {one} / {ZOOKEEPER} = 5.00x",
    ]


def test_ratios_of_each_run_show_the_spread() -> None:
    one, four = "waltz, 1 partition", "waltz, 4 partitions"
    cells = []
    # Run 0 on a slow machine, run 1 on a fast one: each run's ratio is its own cells'.
    for run, (w1, w4, zk) in enumerate([(10_000, 6_000, 2_000), (20_000, 16_000, 2_500)]):
        for system, writes in ((one, w1), (four, w4), (ZOOKEEPER, zk)):
            c = cell(system, 16, writes)
            c.run = run
            cells.append(c)
    assert ratios(cells) == [
        # The medians (the upper of two): 32,000 / 20,000 and 20,000 / 5,000 writes a
        # 2 s cell; each run: 6,000 / 10,000 then 16,000 / 20,000, and so on.
        f"C=16: {four} / {one} = 0.80x (each run: 0.60x, 0.80x)",
        f"C=16: {one} / {ZOOKEEPER} = 8.00x (each run: 5.00x, 8.00x)",
    ]
    # A run that lacks a system's cell (an interrupted sweep) gives no ratio of its own.
    partial = [c for c in cells if not (c.run == 1 and c.system == ZOOKEEPER)]
    assert ratios(partial)[1] == f"C=16: {one} / {ZOOKEEPER} = 10.00x (each run: 5.00x)"


def test_the_etcd_rows_and_ratios_beside_zookeeper_s() -> None:
    one, four = "waltz, 1 partition", "waltz, 4 partitions"
    cells = [
        cell(one, 1, 2000),
        cell(one, 16, 20000, cpu=0.6),
        cell(four, 1, 1000),
        cell(four, 16, 10000),
        cell(ZOOKEEPER, 1, 1000),
        cell(ZOOKEEPER, 16, 4000),
        cell(ETCD, 1, 1600, cpu=0.8),
        cell(ETCD, 16, 2500, cpu=1.5),
    ]
    lines = table(cells, [1, 16]).splitlines()
    assert lines[-1] == "| etcd (3 members) | 800 | 1,250 | 100.0 | 51.00 | 0.600 |"
    assert [line.split(" | ")[0] for line in lines[2:]] == [
        f"| {one}", f"| {four}", f"| {ZOOKEEPER}", f"| {ETCD}"
    ]  # fmt: skip
    # Against each peer, then the best peer of the two: etcd at C=1, ZooKeeper at C=16.
    assert ratios(cells) == [
        f"C=1: {four} / {one} = 0.50x",
        f"C=1: {one} / {ZOOKEEPER} = 2.00x",
        f"C=1: {one} / {ETCD} = 1.25x",
        f"C=1: {one} / best peer ({ETCD}) = 1.25x",
        f"C=16: {four} / {one} = 0.50x",
        f"C=16: {one} / {ZOOKEEPER} = 5.00x",
        f"C=16: {one} / {ETCD} = 8.00x",
        f"C=16: {one} / best peer ({ZOOKEEPER}) = 5.00x",
    ]
    etcd = Cell(ETCD, 16, 1000, 2.0, [1.0], 0.9, {"etcd": 0.9, "load": 0.2}, {"etcd": 3, "load": 2})
    assert cpu_table([etcd], [16]).splitlines()[2] == (
        f"| {ETCD} | etcd 3 x 300 us, load 2 x 100 us |"
    )


def test_each_run_s_best_peer_is_the_faster_in_that_run() -> None:
    one = "waltz, 1 partition"
    cells = []
    # Run 0: ZooKeeper the faster peer; run 1: etcd; a third run lacks both peers' cells.
    for run, (w, zk, etcd) in enumerate([(10_000, 2_000, 1_000), (12_000, 2_000, 3_000)]):
        for system, writes in ((one, w), (ZOOKEEPER, zk), (ETCD, etcd)):
            c = cell(system, 16, writes)
            c.run = run
            cells.append(c)
    lonely = cell(one, 16, 9_000)
    lonely.run = 2
    # Medians (of 3 runs for waltz: 10,000; of 2 for the peers: the upper) give the best
    # peer etcd at 3,000.
    assert ratios([*cells, lonely])[-1] == (
        f"C=16: {one} / best peer ({ETCD}) = 3.33x (each run: 5.00x, 4.00x)"
    )


def test_no_etcd_on_path_skips_its_column_in_one_line(monkeypatch, capsys, tmp_path) -> None:
    from waltz_client.tools.cli import build_parser

    monkeypatch.setenv("PATH", str(tmp_path))  # no etcd here
    seen: dict[str, object] = {}

    def sweep(*args: object) -> list[Cell]:
        seen["etcd"], seen["members"] = args[-2:]
        return [cell("waltz, 1 partition", 1, 100)]

    monkeypatch.setattr(compare, "sweep", sweep)
    args = build_parser().parse_args(["bench", "--compare", "--compare-concurrency", "1"])
    assert compare.cmd_compare(args) == 0
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if "etcd" in x]
    assert line == (
        "no etcd column: `etcd` is not on PATH: `make etcd-deps` installs it (Debian's etcd-server)"
    )
    assert seen == {"etcd": False, "members": 3}
    # --no-etcd: not even looked for, so nothing to say.
    args = build_parser().parse_args(
        ["bench", "--compare", "--compare-concurrency", "1", "--no-etcd", "--etcd-members", "5"]
    )
    assert compare.cmd_compare(args) == 0
    assert "etcd" not in capsys.readouterr().out and seen == {"etcd": False, "members": 5}


def waltz(
    *args: str, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "waltz_client.tools.cli", "bench", "--compare", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--compare-concurrency", "1,x"],
        ["--compare-concurrency", "0"],
        ["--compare-partitions", "0"],
        ["--runs", "0"],
        ["--seconds", "0"],
        ["--zookeeper-members", "0"],
        ["--etcd-members", "0"],
    ],
)
def test_bad_sweep_arguments_are_refused(args: list[str]) -> None:
    result = waltz(*args, timeout=60)
    assert result.returncode == 2
    assert "waltz bench: error:" in result.stdout


def test_sweep_options_without_compare_are_refused() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "waltz_client.tools.cli", "bench", "--runs", "3", "--no-zookeeper"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--runs, --no-zookeeper only apply with --compare" in result.stdout
    etcd_only = ["bench", "--no-etcd", "--etcd-members", "5"]
    result = subprocess.run(
        [sys.executable, "-m", "waltz_client.tools.cli", *etcd_only],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--no-etcd, --etcd-members only apply with --compare" in result.stdout


def test_a_small_sweep_on_a_real_cluster(tmp_path, zookeeper_available) -> None:
    out = tmp_path / "cells.json"
    result = waltz(
        "--data-dir", str(tmp_path / "data"), "--compare-concurrency", "2",
        "--compare-partitions", "1", "--seconds", "1", "--runs", "1", "--no-zookeeper",
        "--no-etcd", "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "| waltz, 1 partition |" in result.stdout
    (only,) = json.loads(out.read_text())
    assert only["system"] == "waltz, 1 partition" and only["concurrency"] == 2
    assert only["run"] == 0
    assert only["writes"] > 0 and only["p50_ms"] > 0 and only["cpu_ms_per_write"] > 0
    # Every process's CPU is measured, the load processes' apart from the cluster's.
    assert only["role_processes"] == {"server": 1, "storage": 3, "load": 2}
    assert all(only["role_cpu_s"][role] > 0 for role in ("server", "storage", "load"))
    cluster = only["role_cpu_s"]["server"] + only["role_cpu_s"]["storage"]
    assert only["cluster_cpu_s"] == pytest.approx(cluster)
    assert "| CPU a write, a process | C=2 |" in result.stdout
    assert "storage 3 x " in result.stdout
    # The load processes drive the client on uvloop, as every waltz command does.
    assert only["load_client"] == "WaltzClient on uvloop"
    assert "waltz's load on uvloop" in result.stdout


def test_the_zookeeper_column_runs_a_three_member_ensemble(tmp_path, zookeeper_available) -> None:
    out = tmp_path / "cells.json"
    result = waltz(
        "--data-dir", str(tmp_path / "data"), "--compare-concurrency", "2",
        "--compare-partitions", "1", "--seconds", "1", "--runs", "1", "--no-etcd",
        "--json", str(out), env={"WALTZ_EVENT_LOOP": "asyncio"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"| {ZOOKEEPER} |" in result.stdout and ZOOKEEPER == "zookeeper (3 members)"
    # WALTZ_EVENT_LOOP reaches the load processes; ZooKeeper's load is kazoo's threads.
    cells = {c["system"]: c for c in json.loads(out.read_text())}
    assert cells["waltz, 1 partition"]["load_client"] == "WaltzClient on asyncio"
    assert cells[ZOOKEEPER]["load_client"] == "kazoo (threads)"
    assert "waltz's load on asyncio" in result.stdout
    assert f"C=2: waltz, 1 partition / {ZOOKEEPER} = " in result.stdout
    zk = next(c for c in json.loads(out.read_text()) if c["system"] == ZOOKEEPER)
    # The CPU of all three JVMs was counted: each spends some on every write.
    assert zk["writes"] > 0 and zk["cpu_ms_per_write"] > 0
    assert zk["role_processes"]["zookeeper"] == 3 and zk["role_cpu_s"]["zookeeper"] > 0


@pytest.mark.skipif(
    shutil.which("etcd") is None,
    reason="etcd is not on PATH (`make etcd-deps` installs Debian's etcd-server)",
)
def test_the_etcd_column_runs_a_three_member_cluster(tmp_path, zookeeper_available) -> None:
    out = tmp_path / "cells.json"
    result = waltz(
        "--data-dir", str(tmp_path / "data"), "--compare-concurrency", "1,4",
        "--compare-partitions", "1", "--seconds", "0.5", "--runs", "1", "--no-zookeeper",
        "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"| {ETCD} |" in result.stdout and ETCD == "etcd (3 members)"
    assert f"C=1: waltz, 1 partition / {ETCD} = " in result.stdout
    assert f"C=4: waltz, 1 partition / {ETCD} = " in result.stdout
    assert "best peer" not in result.stdout  # one peer only
    assert "| CPU a write, a process | C=1 | C=4 |" in result.stdout
    assert "etcd 3 x " in result.stdout
    etcd = {c["concurrency"]: c for c in json.loads(out.read_text()) if c["system"] == ETCD}
    assert sorted(etcd) == [1, 4]
    for c, load_processes in ((1, 1), (4, 2)):
        cell = etcd[c]
        assert cell["writes"] > 0 and cell["p50_ms"] > 0 and cell["cpu_ms_per_write"] > 0
        # The CPU of all three members was counted, the load processes' apart.
        assert cell["role_processes"] == {"etcd": 3, "load": load_processes}
        assert cell["role_cpu_s"]["etcd"] > 0
        assert cell["cluster_cpu_s"] == pytest.approx(cell["role_cpu_s"]["etcd"])
        assert cell["load_client"] == "HTTP/1.1 JSON gateway on uvloop"
