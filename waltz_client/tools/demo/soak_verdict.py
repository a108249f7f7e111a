"""The verdict of ``waltz soak``, pure arithmetic on its samples: did a process's RSS grow
after the warm-up by more than the limit (``verdict``), and did the cluster keep
committing (``load_verdict``)? ``soak`` explains the choice of medians, warm-up and
limits.
"""

from __future__ import annotations

import statistics


def median_before(
    samples: list[dict], name: str, until: float, window: float, key: str = "rss_mb"
) -> float | None:
    """Median RSS (MB; or another ``key``) of ``name`` over the samples in ``[until -
    window, until]`` (at least the latest sample at or before ``until``)."""
    before = [s for s in samples if s["elapsed"] <= until + 1e-6]
    picked = [s for s in before if s["elapsed"] >= until - window] or before[-1:]
    values = [s[key][name] for s in picked if s.get(key, {}).get(name) is not None]
    return statistics.median(values) if values else None


def _slope_mb_per_hour(samples: list[dict], name: str, since: float) -> float | None:
    points = [
        (s["elapsed"], s["rss_mb"][name])
        for s in samples
        if s["elapsed"] >= since and s["rss_mb"].get(name) is not None
    ]
    if len(points) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    var = sum((x - mx) ** 2 for x, _ in points)
    if var == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / var * 3600


def verdict(
    samples: list[dict],
    names: list[str],
    duration: float,
    *,
    warm_up: float = 0.5,
    max_growth_mb: float = 10.0,
    max_growth_pct: float = 10.0,
) -> list[dict]:
    """Per process: RSS at the end of the warm-up and at the end, growth, PASS/FAIL.
    Samples: ``{"elapsed": s, "rss_mb": {name: MB or None}}`` in time order."""
    warm_at = duration * warm_up
    window = duration / 10
    results = []
    for name in names:
        warm = median_before(samples, name, warm_at, window)
        end = median_before(samples, name, duration, window)
        alive = bool(samples) and samples[-1]["rss_mb"].get(name) is not None
        if warm is None or end is None or not alive:
            results.append(
                {
                    "process": name,
                    "warm_mb": warm,
                    "end_mb": end,
                    "growth_mb": None,
                    "growth_pct": None,
                    "slope_mb_per_h": None,
                    "limit_mb": None,
                    "pass": False,
                    "why": "not running at the end" if not alive else "no samples",
                }
            )
            continue
        growth = end - warm
        limit = max(max_growth_mb, warm * max_growth_pct / 100)
        slope = _slope_mb_per_hour(samples, name, warm_at)
        results.append(
            {
                "process": name,
                "warm_mb": round(warm, 1),
                "end_mb": round(end, 1),
                "growth_mb": round(growth, 1),
                "growth_pct": round(100 * growth / warm, 1) if warm else None,
                "slope_mb_per_h": None if slope is None else round(slope, 1),
                "limit_mb": round(limit, 1),
                "pass": growth < limit,
                "why": None if growth < limit else f"grew {growth:.1f} MB (limit {limit:.1f})",
            }
        )
    return results


def load_verdict(samples: list[dict], duration: float, warm_up: float, rate: float) -> dict:
    """Did the cluster keep committing after the warm-up (at least 80% of the target)?"""
    warm_at = duration * warm_up
    after = [s for s in samples if s["elapsed"] >= warm_at - 1e-6]
    if len(after) < 2:
        return {"tx_per_s": None, "target": rate, "pass": False, "why": "too few samples"}
    span = after[-1]["elapsed"] - after[0]["elapsed"]
    committed = after[-1]["committed"] - after[0]["committed"]
    achieved = committed / span if span > 0 else 0.0
    ok = achieved >= 0.8 * rate
    return {
        "tx_per_s": round(achieved, 1),
        "target": rate,
        "pass": ok,
        "why": None if ok else f"{achieved:.0f} tx/s after the warm-up, under 80% of {rate:g}",
    }
