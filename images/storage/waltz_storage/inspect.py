"""Read-only inspection of storage files for the offline tools: never modifies anything."""

from __future__ import annotations

import os
import re
import struct
import uuid
from dataclasses import dataclass, field

from waltz_client.wire.records import Record, ReqId

from .control_file import (
    CONTROL_FILE_NAME,
    ENTRY_BYTES,
    HEADER_BYTES,
    INFO_BYTES,
    PartitionInfo,
    entry_offset,
)
from .errors import CorruptSegment
from .segment import (
    HEADER_BYTES as SEGMENT_HEADER_BYTES,
)
from .segment import (
    RECORD_HEAD,
    RECORD_HEAD_BYTES,
    RECORD_OVERHEAD,
    _scan,
    decode_header,
)

_SEGMENT_NAME = re.compile(r"^(\d{19})\.seg$")


@dataclass
class SegmentReport:
    path: str
    first_txid: int = -1
    records: int = 0
    index_entries: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def last_txid(self) -> int:
        return self.first_txid + self.records - 1

    def as_dict(self) -> dict:
        return {
            "path": self.path,
            "ok": self.ok,
            "first_txid": self.first_txid,
            "last_txid": self.last_txid,
            "records": self.records,
            "index_entries": self.index_entries,
            "problems": self.problems,
        }


def verify_segment(path: str) -> SegmentReport:
    """Check a .seg file's header and every record, and its .idx file against the records."""
    report = SegmentReport(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        report.problems.append(f"cannot open: {e.strerror}")
        return report
    try:
        header = os.pread(fd, SEGMENT_HEADER_BYTES, 0)
        try:
            _, _, _, _, first = decode_header(header, path)
        except CorruptSegment as e:
            report.problems.append(str(e))
            return report
        report.first_txid = first
        size = os.fstat(fd).st_size
        offsets = []
        for txid, offset, _, problem in _scan(fd, SEGMENT_HEADER_BYTES, size, first):
            if problem is not None:
                report.problems.append(
                    f"transaction {txid} at offset {offset}: {problem} "
                    f"({size - offset} bytes from there to the end)"
                )
                break
            offsets.append(offset)
        report.records = len(offsets)
    finally:
        os.close(fd)
    _verify_index(path[: -len(".seg")] + ".idx", header, offsets, report)
    return report


def _verify_index(path: str, data_header: bytes, offsets: list[int], report: SegmentReport) -> None:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        report.problems.append(f"{os.path.basename(path)}: missing (rebuilt on next open)")
        return
    if data[:SEGMENT_HEADER_BYTES] != data_header:
        report.problems.append(f"{os.path.basename(path)}: header differs from the data file's")
        return
    body = data[SEGMENT_HEADER_BYTES:]
    n = len(body) // 8
    report.index_entries = n
    entries = struct.unpack(f">{n}q", body[: 8 * n])
    for i, (got, want) in enumerate(zip(entries, offsets, strict=False)):
        if got != want:
            report.problems.append(
                f"{os.path.basename(path)}: entry {i} (transaction "
                f"{report.first_txid + i}) is {got}, the record is at {want}"
            )
            return
    if n > len(offsets):
        report.problems.append(
            f"{os.path.basename(path)}: {n - len(offsets)} entries past the last record"
        )


def segment_paths(target: str) -> list[str]:
    """Segment files named by a path: a .seg file, a partition dir or a storage dir."""
    if os.path.isfile(target):
        return [target]
    names = sorted(os.listdir(target))
    segs = [os.path.join(target, n) for n in names if _SEGMENT_NAME.match(n)]
    if segs:
        return segs
    found = []
    for n in names:
        sub = os.path.join(target, n)
        if n.isdigit() and os.path.isdir(sub):
            found += [
                os.path.join(sub, m) for m in sorted(os.listdir(sub)) if _SEGMENT_NAME.match(m)
            ]
    return found


def read_records(
    path: str, from_txid: int | None = None, count: int | None = None
) -> list[tuple[int, Record | None, str | None]]:
    """(offset, record, problem) for the records of a segment; stops after the first problem."""
    out: list[tuple[int, Record | None, str | None]] = []
    with open(path, "rb") as f:
        data = f.read()
    _, _, _, _, first = decode_header(data[:SEGMENT_HEADER_BYTES], path)
    fd = os.open(path, os.O_RDONLY)
    try:
        for txid, offset, length, problem in _scan(fd, SEGMENT_HEADER_BYTES, len(data), first):
            if problem is not None:
                out.append((offset, None, problem))
                break
            if from_txid is not None and txid < from_txid:
                continue
            _, c, g, p, s, header, n, _ = RECORD_HEAD.unpack_from(data, offset)
            body = data[offset + RECORD_HEAD_BYTES : offset + RECORD_HEAD_BYTES + n]
            out.append((offset, Record(txid, ReqId(c, g, p, s), header, body), None))
            assert length == n + RECORD_OVERHEAD
            if count is not None and len(out) >= count:
                break
    finally:
        os.close(fd)
    return out


@dataclass
class ControlReport:
    path: str
    version: int
    created_ms: int
    cluster_key: uuid.UUID | None
    num_partitions: int
    header_ok: bool
    partitions: list[dict]


def read_control_file(directory: str) -> ControlReport:
    """Decode the control file without opening it for writing; bad structs are reported."""
    import zlib

    path = os.path.join(directory, CONTROL_FILE_NAME) if os.path.isdir(directory) else directory
    with open(path, "rb") as f:
        data = f.read()
    head = struct.Struct(">iq16si")
    if len(data) < HEADER_BYTES:
        return ControlReport(path, -1, -1, None, 0, False, [])
    version, created, key, n = head.unpack_from(data)
    (crc,) = struct.unpack_from(">I", data, head.size)
    header_ok = zlib.crc32(data[: head.size]) == crc
    parts = []
    for p in range(max(0, min(n, (len(data) - HEADER_BYTES) // ENTRY_BYTES))):
        base = entry_offset(p)
        (stored_id,) = struct.unpack_from(">i", data, base)
        slots = []
        for k in range(2):
            start = base + 4 + k * INFO_BYTES
            info = PartitionInfo.decode(data[start : start + INFO_BYTES])
            slots.append(
                None
                if info is None
                else {
                    "sequence": info.sequence,
                    "fence_session_id": info.fence_session_id,
                    "session_id": info.session_id,
                    "low_water_mark": info.low_water_mark,
                    "local_low_water_mark": info.local_low_water_mark,
                    "flags": info.flags,
                }
            )
        parts.append({"partition": p, "stored_id": stored_id, "slots": slots})
    return ControlReport(path, version, created, uuid.UUID(bytes=key), n, header_ok, parts)
