"""What ``waltz fuzz`` prints of a run against one daemon: the summary of its
``FuzzStats`` (``connections``), and a progress line now and then.
"""

from __future__ import annotations

from collections.abc import Callable

from .connections import FuzzStats


def _mib(kib: int | None) -> str:
    return "?" if kib is None else f"{kib / 1024:,.1f} MiB"


def describe_stats(s: FuzzStats) -> list[str]:
    alive = {True: "alive", False: "EXITED", None: "alive: unknown (no pid)"}[s.alive_after]
    answered = {True: "answers", False: "DOES NOT ANSWER", None: "not probed"}[s.answered_after]
    lines = [
        f"{s.name} ({s.protocol} protocol, {s.address}): {s.frames:,} frames "
        f"({s.mutated:,} mutated, {s.bytes_sent / 1e6:,.1f} MB) in {s.seconds:.1f} s: "
        f"{s.frames_per_s:,.0f} frames/s over {s.connections:,} connections"
        + (
            f" ({s.tls_strangers:,} with a mutated TLS handshake, {s.tls_no_cert:,} "
            f"without a client certificate)"
            if s.tls_strangers or s.tls_no_cert
            else ""
        ),
        f"  {s.unsent:,} frames not written (the daemon had closed the connection); "
        f"connections refused {s.refused:,}, reset {s.reset:,}, writes stalled "
        f"{s.write_stalls:,}, kept open past our EOF {s.close_timeouts:,}; probes "
        f"{s.probes - s.probe_failures}/{s.probes} answered (slowest "
        f"{s.probe_max_seconds:.2f} s)",
        f"  after: {alive}, {answered}; RSS {_mib(s.rss_before_kib)} -> "
        f"{_mib(s.rss_after_kib)} (peak {_mib(s.peak_rss_kib)})",
    ]
    if s.stopped:
        lines.append(f"  STOPPED: {s.stopped} (seed {s.seed})")
        replay = (
            f"waltz fuzz --target {s.address} --protocol {s.protocol} "
            f"--num-partitions {s.num_partitions}"
            + (" --cluster-key KEY" if s.protocol == "storage" else "")
        )
        lines.append(f"  suspect connections (under way, then the last ones): {replay} --replay")
        lines += [f"    #{index}: {seed}" for index, seed in s.suspects]
    return lines


def every_ten_probes(announce: Callable[[str], None]) -> Callable[[FuzzStats], None]:
    """A progress line every ten probes (about ten seconds)."""

    def progress(stats: FuzzStats) -> None:
        if stats.probes % 10 == 0:
            announce(f"  ... {stats.name}: {stats.frames:,} frames")

    return progress
