"""`waltz bench --scale idle-clients`: reading RSS, splitting the clients, the table from
known runs, and a small run on a real cluster whose clients stay mounted and silent."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from waltz_client.tools.demo.idle_clients import (
    IdleCell,
    load_processes_for,
    parse_vm_rss,
    rss_bytes,
    server_args,
    shares,
    table,
)

pytestmark = pytest.mark.timeout(300)

STATUS = """Name:\tpython3
VmPeak:\t  300000 kB
VmRSS:\t   61852 kB
RssAnon:\t   40000 kB
"""


def test_rss_is_read_from_proc_status() -> None:
    assert parse_vm_rss(STATUS) == 61852 * 1024
    with pytest.raises(ValueError, match="no VmRSS"):
        parse_vm_rss("Name:\tkthreadd\n")
    assert rss_bytes(os.getpid()) > 1 << 20


def test_clients_are_split_over_up_to_4_load_processes() -> None:
    assert [load_processes_for(n) for n in (1, 50, 2500, 2501, 10_000, 50_000)] == [
        1, 1, 1, 2, 4, 4,
    ]  # fmt: skip
    assert shares(10, 4) == [3, 3, 2, 2] and sum(shares(10_000, 4)) == 10_000
    # The server's limits fit the clients on one address and one certificate.
    args = server_args(10_000)
    for flag in ("--max-connections", "--max-connections-per-address",
                 "--max-feeds-per-partition", "--client-id-quota"):  # fmt: skip
        assert int(args[args.index(flag) + 1]) >= 10_000


def idle(clients: int, before: int, after: int, baseline: float, busy: float, run: int) -> IdleCell:
    return IdleCell(
        clients, 4, True, 10.0, 1, 3.0, before, after, after, baseline, busy, clients, 0, run
    )


def test_the_table_shows_the_median_run_of_each_cell() -> None:
    mib = 1 << 20
    cells = [
        idle(1000, 60 * mib, 62 * mib, 0.010, 0.030, 0),  # 2,097 bytes a client
        idle(1000, 60 * mib, 61 * mib, 0.010, 0.020, 1),  # 1,049
        idle(1000, 60 * mib, 64 * mib, 0.010, 0.050, 2),  # 4,194
    ]
    # 0.02 s of CPU above the baseline over 1,000 clients and 10 s: 2 us a client a second.
    assert cells[0].bytes_per_client == pytest.approx(2097.152)
    assert cells[0].cpu_us_per_client_second == pytest.approx(2.0)
    lines = table(cells).splitlines()
    assert lines[0].startswith("| clients | partitions each | link | server RSS MiB before")
    assert lines[2] == (
        "| 1,000 | 4 | mutual TLS | 60.0 / 62.0 / 62.0 | 2,097 | 0.010 / 0.030 | 2.000 | 0 |"
    )


def test_idle_clients_on_a_real_cluster(tmp_path, zookeeper_available) -> None:
    out = tmp_path / "cells.json"
    result = subprocess.run(
        [
            sys.executable, "-m", "waltz_client.tools.cli", "bench", "--scale", "idle-clients",
            "--scale-clients", "50", "--scale-partitions", "2", "--seconds", "1", "--runs", "1",
            "--data-dir", str(tmp_path / "data"), "--json", str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "a client = one connection to the server with its own client ID" in result.stdout
    assert "| 50 | 2 | mutual TLS | " in result.stdout
    (cell,) = json.loads(out.read_text())["cells"]
    assert cell["clients"] == 50 and cell["partitions"] == 2 and cell["tls"] is True
    # Every client stayed connected, and its feeds sent nothing while it was idle.
    assert cell["still_open"] == 50 and cell["messages_while_idle"] == 0
    assert cell["rss_after"] > cell["rss_before"] > 0 and cell["bytes_per_client"] > 0
    assert cell["cpu_baseline_s"] >= 0 and cell["cpu_idle_s"] >= 0
