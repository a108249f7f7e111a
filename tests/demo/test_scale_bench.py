"""`waltz bench --scale`: the options and their defaults by mode, the partitions and tls
modes' tables from known cells, and a small run of each on real clusters (the
idle-clients and failover modes: test_idle_clients_bench.py, test_failover_time_bench.py)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from waltz_client.tools.demo import bench
from waltz_client.tools.demo.compare import Cell
from waltz_client.tools.demo.scale_partitions import reference_of, run_ratios, system_of
from waltz_client.tools.demo.scale_partitions import table as partitions_table
from waltz_client.tools.demo.scale_settings import (
    DEFAULT_IDLE_SECONDS,
    ScaleArgumentError,
    settings_of,
)
from waltz_client.tools.demo.tls_cost import run_ratios as tls_run_ratios
from waltz_client.tools.demo.tls_cost import system_name
from waltz_client.tools.demo.tls_cost import table as tls_table

pytestmark = pytest.mark.timeout(300)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def test_each_mode_defaults_to_issue_43s_full_measurement() -> None:
    s = settings_of(parse("--scale", "partitions"))
    assert (s.partitions, s.concurrency, s.seconds, s.runs) == ((1, 4, 16, 64, 256), (256,), 5, 2)
    s = settings_of(parse("--scale", "idle-clients"))
    assert (s.clients, s.partitions, s.seconds, s.tls) == ((1000, 10_000), (4,), 10, True)
    assert DEFAULT_IDLE_SECONDS == 10
    s = settings_of(parse("--scale", "failover"))
    assert (s.partitions, s.concurrency, s.session_timeout) == ((4, 64, 256), (256,), 10)
    s = settings_of(parse("--scale", "tls"))
    assert (s.partitions, s.concurrency) == ((1, 4), (1, 16, 256))
    # Given sizes win; --seconds is the idle period when given; --insecure: plain text.
    s = settings_of(
        parse("--scale", "idle-clients", "--scale-clients", "50,5", "--seconds", "2", "--insecure")
    )
    assert (s.clients, s.seconds, s.tls) == ((5, 50), 2, False)
    assert s.data_dir.endswith("scale-idle-clients")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scale", "tls", "--scale-clients", "5"], "--scale-clients do not apply to --scale tls"),
        (["--scale", "idle-clients", "--scale-concurrency", "5"], "do not apply"),
        (["--scale", "partitions", "--scale-session-timeout", "4"], "do not apply"),
        (["--scale", "partitions", "--scale-partitions", "1,x"], "comma-separated integers"),
        (["--scale", "partitions", "--scale-partitions", "0"], "at least 1"),
        (["--scale", "failover", "--scale-session-timeout", "1"], "must be 2 to 60 s"),
        (["--scale", "tls", "--runs", "0"], "--runs and --size must be at least 1"),
        (["--scale", "tls", "--compare"], "separate measurements"),
        (["--scale", "tls", "--floor"], "separate measurements"),
        (["--scale", "tls", "--compare-partitions", "2"], "only apply with --compare"),
        (["--scale", "idle-clients", "--scale-partitions", "2000"], "at most 1024"),
    ],
)
def test_bad_scale_arguments_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ScaleArgumentError, match=message):
        settings_of(parse(*argv))


def waltz(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "waltz_client.tools.cli", "bench", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_command_line_refuses_scale_options_without_scale() -> None:
    result = waltz("--scale-clients", "5", "--scale-partitions", "2", timeout=60)
    assert result.returncode == 2
    assert "waltz bench: error: --scale-partitions, --scale-clients only apply with --scale" in (
        result.stdout
    )
    result = waltz("--scale", "tls", "--scale-clients", "5", timeout=60)
    assert result.returncode == 2 and "do not apply to --scale tls" in result.stdout


def cell(system: str, c: int, writes: int, run: int = 0, cpu: float = 1.0) -> Cell:
    x = Cell(system, c, writes, 2.0, sorted(float(i) for i in range(1, 101)), cpu)
    x.run = run
    return x


def test_the_partitions_table_compares_each_cell_with_4_partitions() -> None:
    cells = [
        cell(system_of(1), 256, 20_000),
        cell(system_of(4), 256, 10_000),
        cell(system_of(64), 256, 8_000, cpu=0.8),
    ]
    assert system_of(1) == "waltz, 1 partition" and system_of(64) == "waltz, 64 partitions"
    lines = partitions_table(cells, [1, 4, 64], [256]).splitlines()
    assert lines[0] == (
        "| partitions | C | writes/s | p50 ms | p99 ms | cluster CPU ms/write | / 4 partitions |"
    )
    # 16,000 writes in 2 s against 5,000: 0.80x; 0.8 s of CPU over 8,000 writes.
    assert lines[4] == "| 64 | 256 | 4,000 | 51.00 | 100.00 | 0.100 | 0.80x |"
    assert lines[2].endswith("| 2.00x |") and lines[3].endswith("| 1.00x |")
    # Without a 4-partition cell, the fewest partitions are the reference.
    assert reference_of([16, 64]) == 16 and reference_of([1, 4, 16]) == 4


def test_each_run_gives_its_own_ratio_to_4_partitions() -> None:
    cells = [
        cell(system_of(4), 256, 10_000, run=0),
        cell(system_of(64), 256, 7_000, run=0),
        cell(system_of(4), 256, 12_000, run=1),
        cell(system_of(64), 256, 12_000, run=1),
    ]
    # The medians (the upper of two): 12,000 / 12,000.
    assert run_ratios(cells, [4, 64], [256]) == [
        "C=256: 64 / 4 partitions = 1.00x (each run: 0.70x, 1.00x)"
    ]
    assert run_ratios([c for c in cells if c.run == 0], [4, 64], [256]) == []


def test_the_tls_table_gives_each_pair_s_ratio() -> None:
    plain, secure = system_name(False, 1), system_name(True, 1)
    assert (plain, secure) == ("waltz plain, 1 partition", "waltz TLS, 1 partition")
    assert system_name(True, 4) == "waltz TLS, 4 partitions"
    cells = [
        cell(plain, 16, 10_000, cpu=0.5),
        cell(secure, 16, 8_500, cpu=0.6),
        cell(plain, 256, 20_000, run=1),
        cell(secure, 256, 20_000, run=1),
    ]
    lines = tls_table(cells, [1], [16, 256]).splitlines()
    assert lines[0].startswith("| partitions | C | plain writes/s | TLS writes/s | TLS / plain |")
    assert lines[2] == (
        "| 1 | 16 | 5,000 | 4,250 | 0.85x | 51.00 / 100.00 | 51.00 / 100.00 | 0.050 / 0.071 |"
    )
    assert lines[3].startswith("| 1 | 256 | 10,000 | 10,000 | 1.00x |")
    assert tls_run_ratios(cells, [1], [16]) == [
        "1 partition(s), C=16: TLS / plain = 0.85x (each run: 0.85x)"
    ]


def test_a_small_partitions_curve_on_real_clusters(tmp_path, zookeeper_available) -> None:
    out = tmp_path / "cells.json"
    result = waltz(
        "--scale", "partitions", "--scale-partitions", "1,4", "--scale-concurrency", "8",
        "--seconds", "1", "--runs", "1", "--data-dir", str(tmp_path / "data"),
        "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "the --compare sweep's cells (1 server, plain text" in result.stdout
    assert "| partitions | C | writes/s | p50 ms | p99 ms | cluster CPU ms/write |" in result.stdout
    assert "| 4 | 8 | " in result.stdout and "| 1.00x |" in result.stdout
    assert "| CPU a write, a process | C=8 |" in result.stdout
    doc = json.loads(out.read_text())
    assert doc["mode"] == "partitions" and doc["settings"]["partitions"] == [1, 4]
    cells = {c["partitions"]: c for c in doc["cells"]}
    assert set(cells) == {1, 4}
    for c in cells.values():
        assert c["concurrency"] == 8 and c["writes"] > 0 and c["p99_ms"] > 0
        assert c["role_processes"] == {"server": 1, "storage": 3, "load": 2}
        assert c["cpu_ms_per_write"] > 0


def test_a_small_tls_comparison_on_real_clusters(tmp_path, zookeeper_available) -> None:
    out = tmp_path / "cells.json"
    result = waltz(
        "--scale", "tls", "--scale-partitions", "1", "--scale-concurrency", "2",
        "--seconds", "1", "--runs", "1", "--data-dir", str(tmp_path / "data"),
        "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "| 1 | 2 | " in result.stdout and "x | " in result.stdout
    cells = {c["tls"]: c for c in json.loads(out.read_text())["cells"]}
    assert set(cells) == {False, True}
    # The same load code on both sides; only the TLS one dialled with a certificate.
    assert cells[True]["load_client"] == "WaltzClient on TLS"
    assert cells[False]["load_client"] == "WaltzClient plain"
    assert all(c["writes"] > 0 and c["partitions"] == 1 for c in cells.values())
