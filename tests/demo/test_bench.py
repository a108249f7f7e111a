"""`waltz bench` (the plain run): a real local cluster takes the load, a consumer catches
up, and the report gives rates, latencies and what the client itself spent."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)


def test_a_small_bench_reports_every_figure(tmp_path) -> None:
    result = subprocess.run(
        [
            sys.executable, "-m", "waltz_client.tools.cli", "bench", "--insecure",
            "--transactions", "400", "--concurrency", "40", "--partitions", "2",
            "--data-dir", str(tmp_path / "bench"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert re.search(r"^committed 400 in [\d.]+ s: [\d,]+ tx/s, .* 0 failed$", out, re.M), out
    assert re.search(r"^commit latency \(submit -> committed\): p50 [\d.]+ ms", out, re.M), out
    assert re.search(r"^consumers catching up from the start: [\d,]+ tx/s", out, re.M), out
    cpu = re.search(
        r"^client CPU: ([\d.]+) us a committed transaction \(producing\), ([\d.]+) us a row",
        out,
        re.M,
    )
    assert cpu, out
    assert float(cpu[1]) > 0 and float(cpu[2]) > 0
