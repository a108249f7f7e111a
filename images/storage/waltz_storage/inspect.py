"""Read-only inspection of storage files for the offline tools: never modifies anything."""

from __future__ import annotations

import os
import re
import struct
import uuid
from array import array
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from waltz_client.wire.records import NO_TIMESTAMP, Record, ReqId

from .control_file import (
    CONTROL_FILE_NAME,
    ENTRY_BYTES,
    FORMAT_VERSION,
    HEADER_BYTES,
    INFO_BYTES,
    NO_TRANSACTION,
    PartitionInfo,
    entry_offset,
)
from .errors import CorruptSegment
from .log_start import DamagedLogStart, read_log_start
from .partition import DEFAULT_MAX_TORN_BYTES
from .recovery import refusal, scan_partition
from .segment import scan_segment_file
from .segment_format import (
    HEADER_BYTES as SEGMENT_HEADER_BYTES,
)
from .segment_format import (
    decode_header,
    disk_head_bytes,
    record_format_of,
)

_SEGMENT_NAME = re.compile(r"^(\d{19})\.seg$")


@dataclass
class SegmentReport:
    path: str
    first_txid: int = -1
    format_version: int = 0  # the header's (0: no valid header)
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
            "format_version": self.format_version,
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
            version, _, _, _, first = decode_header(header, path)
        except CorruptSegment as e:
            report.problems.append(str(e))
            return report
        report.first_txid = first
        report.format_version = version
        size = os.fstat(fd).st_size
        offsets, offset, problem, size = scan_segment_file(
            fd, size, first, record_format_of(version)
        )
        if problem is not None:
            report.problems.append(
                f"transaction {first + len(offsets)} at offset {offset}: {problem} "
                f"({size - offset} bytes from there to the end)"
            )
        report.records = len(offsets)
    finally:
        os.close(fd)
    _verify_index(path[: -len(".seg")] + ".idx", header, offsets, report)
    return report


def _verify_index(path: str, data_header: bytes, offsets: array, report: SegmentReport) -> None:
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


@dataclass
class PartitionReport:
    """What a node would decide on opening a partition directory (``recovery.refusal``)."""

    path: str
    partition: int
    recovered_end: int  # the last transaction of the intact log from transaction 0
    local_low_water_mark: int  # from the control file (-1 without one)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {
            "path": self.path,
            "partition": self.partition,
            "ok": self.ok,
            "recovered_end": self.recovered_end,
            "local_low_water_mark": self.local_low_water_mark,
            "problems": self.problems,
        }


def partition_dirs(target: str) -> list[tuple[str, int, str | None]]:
    """(directory, partition ID, control file or None) of the partition directories that a
    verify target names: a storage directory's, or the target itself."""
    if not os.path.isdir(target):
        return []
    names = os.listdir(target)
    control = os.path.join(target, CONTROL_FILE_NAME)
    if os.path.isfile(control) or not any(_SEGMENT_NAME.match(n) for n in names):
        return [
            (os.path.join(target, n), int(n), control if os.path.isfile(control) else None)
            for n in sorted(names, key=lambda n: (len(n), n))
            if n.isdigit() and os.path.isdir(os.path.join(target, n))
        ] or _as_partition_dir(target)
    return _as_partition_dir(target)


def _as_partition_dir(target: str) -> list[tuple[str, int, str | None]]:
    name = os.path.basename(os.path.normpath(target))
    if not name.isdigit():
        return []
    control = os.path.join(os.path.dirname(os.path.abspath(target)), CONTROL_FILE_NAME)
    return [(target, int(name), control if os.path.isfile(control) else None)]


def local_low_water_mark(control_path: str | None, partition_id: int) -> int:
    """The newest valid struct's local low-water mark, as the node reads it; -1 if none."""
    if control_path is None:
        return NO_TRANSACTION
    try:
        report = read_control_file(control_path)
    except OSError:
        return NO_TRANSACTION
    if not report.header_ok or partition_id >= len(report.partitions):
        return NO_TRANSACTION
    valid = [s for s in report.partitions[partition_id]["slots"] if s is not None]
    if not valid:
        return NO_TRANSACTION
    # The higher sequence wins; on a tie slot 1 (the later in the list), as read_partition.
    return max(reversed(valid), key=lambda s: s["sequence"])["local_low_water_mark"]


def verify_partition(
    directory: str,
    partition_id: int,
    control_path: str | None,
    max_torn_bytes: int = DEFAULT_MAX_TORN_BYTES,
) -> PartitionReport:
    """Would a node open this partition? The same scan and decision as on open, read-only."""
    floor = local_low_water_mark(control_path, partition_id)
    try:
        log_start = read_log_start(directory)
    except DamagedLogStart as e:
        return PartitionReport(directory, partition_id, -1, floor, [str(e)])
    scan = scan_partition(
        directory, partition_id, None, max_torn_bytes=max_torn_bytes, log_start=log_start
    )
    reason = refusal(scan, floor)
    return PartitionReport(directory, partition_id, scan.end, floor, [reason] if reason else [])


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


def commit_time_text(ms: int) -> str:
    """A record's commit time as ISO 8601 UTC with milliseconds, "-" for none (a record
    of format 1); a value no date can hold as its milliseconds ("<n>ms")."""
    if ms == NO_TIMESTAMP:
        return "-"
    try:
        moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    except OverflowError:
        return f"{ms}ms"
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def read_records(
    path: str, from_txid: int | None = None, count: int | None = None
) -> list[tuple[int, Record | None, str | None]]:
    """(offset, record, problem) for the records of a segment (of either format: a record
    of format 1 has the time ``NO_TIMESTAMP``); stops after the first problem."""
    out: list[tuple[int, Record | None, str | None]] = []
    with open(path, "rb") as f:
        data = f.read()
    version, _, _, _, first = decode_header(data[:SEGMENT_HEADER_BYTES], path)
    fmt = record_format_of(version)
    fd = os.open(path, os.O_RDONLY)
    try:
        offsets, end, problem, _ = scan_segment_file(fd, len(data), first, fmt)
    finally:
        os.close(fd)
    start = 0 if from_txid is None else max(0, from_txid - first)
    head_bytes = disk_head_bytes(fmt)
    for i in range(start, len(offsets)):
        if count is not None and len(out) >= count:
            return out
        offset = offsets[i]
        # The wire head; format 2's ends in the commit time.
        _, c, g, p, s, header, n, *timed = fmt.head.unpack_from(data, offset)
        body = data[offset + head_bytes : offset + head_bytes + n]
        record = Record(first + i, ReqId(c, g, p, s), header, body, *timed)
        out.append((offset, record, None))
    if problem is not None and (count is None or len(out) < count):
        out.append((end, None, problem))
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
    problems: list[str] = field(default_factory=list)  # what makes the file unusable


def read_control_file(directory: str) -> ControlReport:
    """Decode the control file without opening it for writing; bad structs are reported."""
    import zlib

    path = os.path.join(directory, CONTROL_FILE_NAME) if os.path.isdir(directory) else directory
    with open(path, "rb") as f:
        data = f.read()
    head = struct.Struct(">iq16si")
    if len(data) < HEADER_BYTES:
        return ControlReport(
            path, -1, -1, None, 0, False, [], [f"{len(data)} bytes: shorter than the header"]
        )
    version, created, key, n = head.unpack_from(data)
    (crc,) = struct.unpack_from(">I", data, head.size)
    header_ok = zlib.crc32(data[: head.size]) == crc
    # The daemon's open refuses the same things (ControlFile.open).
    problems = [] if header_ok else ["header checksum mismatch"]
    if header_ok and version != FORMAT_VERSION:
        problems.append(f"format version {version}, this build reads {FORMAT_VERSION}")
    if header_ok and n < 1:
        problems.append(f"invalid number of partitions {n}")
    if header_ok and n >= 1 and len(data) < entry_offset(n):
        problems.append(
            f"{len(data)} bytes, expected {entry_offset(n)} for {n} partitions (truncated)"
        )
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
    return ControlReport(
        path, version, created, uuid.UUID(bytes=key), n, header_ok, parts, problems
    )
