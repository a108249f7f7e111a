"""The Spark example pipeline (examples/spark/run_demo.py) on its own local cluster: the
bank's databases, the batch report and the streaming table, SIGKILLed mid-stream and
restarted, agree."""

from __future__ import annotations

import os
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "spark")

pytestmark = pytest.mark.timeout(600)


def test_the_example_pipeline_agrees_with_the_bank(spark, tmp_path, zookeeper_available, capsys):
    sys.path.insert(0, os.path.abspath(EXAMPLES))
    try:
        import run_demo
    finally:
        sys.path.pop(0)
    code = run_demo.main(
        ["--data-dir", str(tmp_path / "demo"), "--transfers", "200", "--no-faults",
         "--max-per-trigger", "100"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    report = out.split("=== waltz spark demo report ===")[1]
    assert "FAIL" not in out and report.count("PASS") == 4, report
    killed = [line for line in out.splitlines() if "killed after" in line]
    assert killed and "killed after 0 " not in killed[0]
