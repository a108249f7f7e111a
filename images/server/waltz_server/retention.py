"""Retention for one owned partition: move its log start up, as the policy says.

One step, run by the partition every ``retention_interval`` seconds while its store
session is active: ask one member for its segments (their sizes and ages), decide the
new log start (``waltz_client.cluster.retention.next_log_start``: whole segments,
never past the committed high-water mark), record it in the partition's metadata by
compare-and-set, publish it to the partition (reads below it are refused from then
on), and only then tell every member, which deletes the segments wholly below it. A
storage node moves its log start only as far as the metadata records, so the order
matters: ZooKeeper first.

Replicas outside the session get the log start at the next recovery (which also
skips an empty or far-behind replica ahead to it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace

from waltz_client.cluster.retention import RetentionPolicy, SegmentInfo, next_log_start
from waltz_client.wire.errors import describe

from .recovery_manager import MetadataStore
from .store_session import StoreSession

log = logging.getLogger(__name__)


async def retention_step(
    *,
    session: StoreSession,
    metadata: MetadataStore,
    generation: int,
    policy: RetentionPolicy,
    current: int,
    high_water_mark: int,
    now_ms: int,
    publish: Callable[[int], None],
) -> int:
    """The partition's log start after one step (``current`` when nothing moved)."""
    p = session.partition_id
    rule, floor = policy.rule_for(p), policy.floor(p)
    if rule.keeps_everything and floor <= current:
        return current
    members = [m for m in session.members.values() if not m.closed and m.client.speaks_retention]
    if not members:
        return current
    segments: list[SegmentInfo] = []
    if not rule.keeps_everything:
        info = await members[0].client.log_info(session.session_id, p)
        segments = [
            SegmentInfo(s.first_txid, s.records, s.size_bytes, s.modified_ms, s.last_commit_ms)
            for s in info.segments
        ]
    start = next_log_start(
        rule,
        floor,
        segments,
        now_ms=now_ms,
        high_water_mark=high_water_mark,
        current=current,
    )
    if start <= current:
        return current
    meta, version = await metadata.read(p)
    if meta.generation != generation or meta.session_id != session.session_id:
        return current  # another session (or owner) took over meanwhile: its call
    if meta.log_start < start:
        await metadata.write(p, replace(meta, log_start=start), version)
    publish(start)
    results = await asyncio.gather(
        *(m.client.set_log_start(session.session_id, p, start) for m in members),
        return_exceptions=True,
    )
    for member, result in zip(members, results, strict=True):
        if isinstance(result, BaseException):
            log.warning(
                "partition %d: replica %s did not move its log start to %d: %s",
                p,
                member.address,
                start,
                describe(result),
            )
    return start
