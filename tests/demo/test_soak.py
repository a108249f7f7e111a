"""`waltz soak`: the verdict on RSS samples, and a run of a few seconds with retention
deleting segments under slow consumers (the real soak is a benchmark: 30 minutes)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from waltz_client.tools.demo.soak_verdict import load_verdict, verdict

NAMES = ["zookeeper", "storage-0", "server-0", "load"]


def samples(rss_at, seconds: int = 300, every: int = 15, rate: float = 100.0) -> list[dict]:
    """A sample every ``every`` s; ``rss_at(name, t)`` gives each process's MB."""
    return [
        {
            "elapsed": float(t),
            "rss_mb": {n: rss_at(n, t) for n in NAMES},
            "committed": int(rate * t),
        }
        for t in range(0, seconds + 1, every)
    ]


def by_process(results: list[dict]) -> dict[str, dict]:
    return {r["process"]: r for r in results}


def test_flat_after_the_warm_up_passes_whatever_the_warm_up_did():
    # Every process doubles during the warm-up (caches filling), then moves by noise.
    def rss(name: str, t: int) -> float:
        base = 150.0 if name == "zookeeper" else 50.0
        return base * min(2.0, 1 + t / 80) + (1.5 if t % 30 else -1.5)

    results = by_process(verdict(samples(rss), NAMES, 300))
    assert all(r["pass"] for r in results.values()), results
    assert 95 < results["storage-0"]["warm_mb"] < 102
    assert abs(results["storage-0"]["growth_mb"]) < 5


def test_growth_beyond_the_limit_fails_and_the_limit_is_the_larger_of_mb_and_percent():
    # Each grows 15 MB after the warm-up: over 10 MB for a 50 MB process, under 10% of
    # a 400 MB one.
    def rss(name: str, t: int) -> float:
        base = 400.0 if name == "zookeeper" else 50.0
        return base + 15 * max(0, t - 100) / 200

    results = by_process(verdict(samples(rss), NAMES, 300, warm_up=1 / 3))
    assert results["zookeeper"]["pass"] and results["zookeeper"]["limit_mb"] == 40.0
    server = results["server-0"]
    assert not server["pass"] and server["limit_mb"] == 10.0
    assert server["growth_mb"] == pytest.approx(14.2, abs=1)  # medians over the last 30 s
    assert server["slope_mb_per_h"] == pytest.approx(15 / 200 * 3600, rel=0.01)
    assert "grew" in server["why"]
    # A more generous limit passes it.
    assert all(
        r["pass"] for r in verdict(samples(rss), NAMES, 300, warm_up=1 / 3, max_growth_mb=20)
    )
    # A warm-up of half the run leaves less growth after it, but still too much.
    assert not by_process(verdict(samples(rss), NAMES, 300))["server-0"]["pass"]


def test_a_process_gone_at_the_end_fails():
    def rss(name: str, t: int) -> float | None:
        return None if name == "storage-0" and t > 250 else 50.0

    results = by_process(verdict(samples(rss), NAMES, 300))
    assert not results["storage-0"]["pass"]
    assert results["storage-0"]["why"] == "not running at the end"
    assert results["load"]["pass"]


def test_the_load_must_keep_committing_after_the_warm_up():
    flat = samples(lambda n, t: 50.0, rate=1000)
    assert load_verdict(flat, 300, 1 / 3, 1000)["pass"]
    stalled = samples(lambda n, t: 50.0, rate=1000)
    for s in stalled:
        s["committed"] = min(s["committed"], 120_000)  # nothing commits after 2:00
    result = load_verdict(stalled, 300, 1 / 3, 1000)
    assert not result["pass"] and "under 80%" in result["why"]


@pytest.mark.timeout(120)
def test_a_short_soak_reports_rss_retention_and_skips(tmp_path, zookeeper_available):
    """Small segments and retention of a few of them, retention steps every half
    second, and slow consumers far below the load: within seconds the log start moves,
    both kinds of slow consumer fall below it and skip."""
    doc_path = tmp_path / "soak.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "waltz_client.tools.cli",
            "soak",
            "--data-dir",
            str(tmp_path / "soak"),
            "--minutes",
            "0.2",
            "--partitions",
            "2",
            "--rate",
            "300",
            "--size",
            "512",
            "--segment-bytes",
            "16KiB",
            "--retention-bytes",
            "48KiB",
            "--retention-interval",
            "0.5",
            "--consumer-rate",
            "20",
            "--sample-every",
            "2",
            "--max-growth-mb",
            "1000",  # a few seconds are all warm-up: the verdict's arithmetic is tested above
            "--json",
            str(doc_path),
        ],
        capture_output=True,
        text=True,
        timeout=110,
    )
    out = result.stdout
    doc = json.loads(doc_path.read_text())
    assert result.returncode == (0 if doc["verdict"]["pass"] else 1), out + result.stderr
    names = ["zookeeper", "storage-0", "storage-1", "storage-2", "server-0", "load"]
    assert doc["processes"] == names

    # The table: a header naming every process, then one row per sample with an RSS each.
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("|  elapsed |"))
    assert [c.strip() for c in lines[header].strip("|").split("|")][1:7] == names
    rows = []
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    assert len(rows) == len(doc["samples"]) >= 7  # 0:00, then every 2 s to 0:12
    assert rows[0][0] == "0:00" and rows[-1][0] == "0:12"
    for row in rows:
        assert all(float(mb) > 1 for mb in row[1:7]), row

    samples_ = doc["samples"]
    assert all(v is not None and v > 1 for s in samples_ for v in s["rss_mb"].values())
    last = samples_[-1]
    assert last["committed"] > 1000 and doc["final"]["failed"] == 0
    # Retention moved every partition's log start, and kept the disk bounded.
    for p in last["partitions"]:
        assert p["log_start"] > 0, p
        assert max(p["disk_bytes"]) < 48 * 1024 + 3 * 16 * 1024 + 8192, p
    consumers = {c["name"]: c for c in last["consumers"]}
    assert set(consumers) == {"live-0", "slow-0", "slow-1"}
    assert consumers["live-0"]["skipped"] == 0
    for name in ("slow-0", "slow-1"):  # the feed consumer and the range reader
        assert consumers[name]["skips"] > 0 and consumers[name]["skipped"] > 0, consumers
        assert consumers[name]["errors"] == 0

    # The end: partitions, retention over time, consumers, and a verdict per process.
    for title in ("Partitions at the end", "Retention over time", "Consumers at the end"):
        assert title in out
    verdict_at = next(i for i, line in enumerate(lines) if line.startswith("Verdict:"))
    per_process = [line for line in lines[verdict_at + 3 :] if line.startswith("|")]
    assert [row.split("|")[1].strip() for row in per_process] == names
    assert all(row.rstrip(" |").endswith("PASS") for row in per_process)
    assert {r["process"] for r in doc["verdict"]["processes"]} == set(names)
    assert lines[-1] == ("PASS" if doc["verdict"]["pass"] else "FAIL")


def test_bad_arguments_are_one_error_line():
    result = subprocess.run(
        [sys.executable, "-m", "waltz_client.tools.cli", "soak", "--warm-up", "1.5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stdout.splitlines() == [
        "waltz soak: error: --warm-up must be a fraction between 0 and 1"
    ]
