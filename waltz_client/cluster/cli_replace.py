"""``waltz cluster replace-storage``: move a lost (or retiring) storage node's replicas to
the other nodes, by the steps of ``replace_storage``; and the replacements part of
``waltz cluster show``."""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime

from kazoo.client import KazooClient

from .errors import ClusterError
from .metadata import StorageReplacements
from .partition_ranges import format_partition_ranges
from .replace_storage import ReplacementStep, read_replacements, replace_storage_step

POLL_SECONDS = 1.0


def cmd_replace_storage(zk: KazooClient, args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise ClusterError(f"--timeout must be a number of seconds above 0, got {args.timeout}")
    deadline = time.monotonic() + args.timeout
    said: list[str] = []
    while True:
        record, _ = read_replacements(zk, args.root)
        others = set(record.replacing) - {args.address}  # not a home for its replicas
        step = replace_storage_step(
            zk,
            args.root,
            args.address,
            unusable=others,
            reason=args.reason or "waltz cluster replace-storage",
            automatic=False,
        )
        lines = _step_lines(step)
        if not args.json and lines != said:
            for line in lines:
                print(line, flush=True)
            said = lines
        stuck = step.plan is not None and bool(step.plan.no_room) and not _changed(step)
        if step.finished or not args.wait or stuck or time.monotonic() >= deadline:
            break
        time.sleep(POLL_SECONDS)
    if args.json:
        print(json.dumps(_step_doc(step), indent=2, sort_keys=True))
    if step.finished:
        if not args.json:
            print(f"{args.address} is replaced: it left the replica assignment")
        return 0
    if args.wait and not args.json:
        print(
            f"{args.address} is not replaced yet"
            + (
                " (no other node can take some partitions)"
                if stuck
                else f" after {args.timeout:g} s"
            )
            + "; run the command again to go on"
        )
    return 1 if (args.wait or stuck) else 0


def _changed(step: ReplacementStep) -> bool:
    plan = step.plan
    return plan is not None and bool(plan.assign or plan.unassign)


def _step_lines(step: ReplacementStep) -> list[str]:
    if step.plan is None:
        return []
    return [f"replacing {step.lost}: {line}" for line in step.plan.describe()]


def _step_doc(step: ReplacementStep) -> dict[str, object]:
    plan = step.plan
    return {
        "storage": step.lost,
        "finished": step.finished,
        "assigned": {s: sorted(ps) for s, ps in plan.assign.items()} if plan else {},
        "unassigned": sorted(plan.unassign) if plan else [],
        "waiting": list(plan.waiting) if plan else [],
        "no_room": list(plan.no_room) if plan else [],
    }


def replacements_doc(record: StorageReplacements) -> dict[str, object]:
    """The record as ``waltz cluster show --json`` prints it: its znode's document,
    without the codec's kind and version."""
    doc: dict[str, object] = json.loads(record.encode())
    return {k: v for k, v in doc.items() if k not in ("kind", "version")}


def replacement_lines(record: StorageReplacements, last: int = 10) -> list[str]:
    """The record as ``waltz cluster show`` prints it: what is under way, then the latest
    steps (none when nothing was ever replaced)."""
    if not record.replacing and not record.events:
        return []
    lines = ["", "storage replacements"]
    for s, r in sorted(record.replacing.items()):
        who = "automatic" if r.automatic else "by hand"
        lines.append(f"  replacing {s} since {_when(r.since_ms)} ({who}): {r.reason}")
    for e in record.events[-last:]:
        what = e.action
        if e.partitions:
            what += f" partitions {format_partition_ranges(list(e.partitions))}"
        if e.to:
            what += f" to {e.to}"
        if e.detail:
            what += f" ({e.detail})"
        lines.append(f"  {_when(e.time_ms)}  {e.storage}: {what}")
    return lines


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
