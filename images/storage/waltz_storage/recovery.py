"""Recovery on open: what a partition's files hold, and whether they may be served.

Nothing here writes a file. ``scan_partition`` checks every record of every
segment and finds where the intact log, counted from transaction 0, ends;
``refusal`` decides, as a pure function of that scan and the local low-water
mark, whether the partition may open. ``PartitionLog.open`` then applies the
only repairs there are (cutting a torn tail, recreating a segment whose
creation was interrupted), and ``waltz storage verify`` reports the same
decision.

The rules:

- The local low-water mark in the control file is the floor of what this
  replica acknowledged as committed. A log that ends below it, for any reason
  (a missing segment, damage, a cut file), is refused: never cut, never served.
- Segments follow each other from transaction 0 without gaps.
- Zeros after the last record are space the segment wrote ahead of its records:
  the file is taken to end at its last non-zero byte.
- Only the last write group can be torn by a crash, at the end of the last
  segment. Damage is a torn tail, which may be cut, only when it is in the last
  segment, within one write group (``max_torn_bytes``) of the end of the file,
  not a record the index shows was synced, and not followed by an intact
  record. Anything else is corruption, refused whatever the low-water mark.
"""

from __future__ import annotations

import os
import re
import struct
import uuid
from array import array
from dataclasses import dataclass

from waltz_client.cluster.metadata import key_fingerprint
from waltz_client.wire.records import FORMAT_1, RecordFormat

from . import segment as seg
from .errors import CorruptSegment
from .log_start import leftover_segments
from .segment_format import (
    DATA_LENGTH,
    HEADER_BYTES,
    check_record,
    decode_header,
    disk_head_bytes,
    disk_overhead,
    record_format_of,
    segment_stem,
)
from .segment_scan import Damage, SegmentScan

SEGMENT_NAME = re.compile(r"^(\d{19})\.seg$")
INDEX_NAME = re.compile(r"^(\d{19})\.idx$")
# After a damaged record, the IDs of this many next transactions are looked for: enough
# for the records a zeroed 4 KiB page can destroy (at least 40 bytes each).
SEARCH_TXIDS = 256
_TXID = struct.Struct(">q")
_CUT_SHORT = ("record head cut short", "record cut short")


@dataclass(frozen=True, slots=True)
class PartitionScan:
    """A partition's segments as found on disk, up to the first problem (read-only)."""

    directory: str
    partition_id: int
    segments: list[SegmentScan]
    end: int  # the last transaction of the intact log from its start (-1: none)
    problem: str | None  # corruption: why these files cannot be served, whatever the mark
    torn_creation: int | None  # first transaction of a last segment cut inside its header
    orphan_indexes: list[str]  # .idx files whose .seg is missing

    @property
    def torn_tail(self) -> Damage | None:
        """Damage at the end of the last segment that may be cut (when nothing is wrong)."""
        if self.problem is None and self.segments:
            return self.segments[-1].damage
        return None


# --- the decisions (pure) -------------------------------------------------------------------


def torn_tail_reason(
    *, is_last: bool, synced: bool, cut_short_last_hint: bool, cut: int, max_torn_bytes: int
) -> str | None:
    """Why damage with ``cut`` bytes from it to the end of the file cannot be a torn write
    (None: it can, unless an intact record follows it)."""
    if not is_last:
        return "a segment before the last cannot have a torn tail"
    # A synced record cut short by the end of the file, with no later index entry, is
    # still a tail (the file itself was cut); anything else synced is corruption.
    if synced and not cut_short_last_hint:
        return (
            "the index shows this record was synced (acknowledged), so this is corruption, "
            "not a torn write"
        )
    if cut > max_torn_bytes:
        return (
            f"with {cut} bytes after it, more than one write group ({max_torn_bytes} bytes) "
            f"could leave unsynced: this is corruption, not a torn write"
        )
    return None


def refusal(scan: PartitionScan, floor: int) -> str | None:
    """Why the partition must not open (None: it may, cutting ``scan.torn_tail`` if any).

    ``floor`` is the local low-water mark recorded in the control file.
    """
    p = scan.partition_id
    if scan.end < floor:
        return (
            f"partition {p}: the log on disk ends at transaction {scan.end}, below the local "
            f"low-water mark {floor} recorded in the control file: this replica acknowledged "
            f"transactions up to {floor} as committed ({_cause(scan)}); refusing to open. "
            + repair_hint(scan.directory)
        )
    if scan.problem is not None:
        named = scan.problem.startswith((f"partition {p} ", f"partition {p}:"))
        problem = scan.problem if named else f"partition {p}: {scan.problem}"
        return (
            f"{problem}; the intact log ends at transaction {scan.end} (local low-water mark "
            f"{floor}); refusing to open (inspect with `waltz storage verify`). "
            + repair_hint(scan.directory)
        )
    return None


def repair_hint(directory: str) -> str:
    return (
        f"To repair: stop the node, move {directory} aside and start the node again; the "
        f"partition starts empty and the server's recovery copies it back from the other "
        f"replicas (docs/operations.md, Corrupt segment data)"
    )


def _cause(scan: PartitionScan) -> str:
    torn = scan.torn_tail
    if scan.problem is not None:
        cause = scan.problem
    elif torn is not None:
        cause = f"{torn.where}, which only a torn tail could explain"
    elif scan.torn_creation is not None:
        cause = f"{segment_stem(scan.torn_creation)}.seg is shorter than its header"
    elif not scan.segments:
        cause = "no segment file"
    else:
        cause = f"the last segment file is {scan.segments[-1].name}"
    if scan.orphan_indexes:
        cause += f"; index files without their segment file: {', '.join(scan.orphan_indexes)}"
    return cause


# --- reading the files ----------------------------------------------------------------------


def scan_partition(
    directory: str,
    partition_id: int,
    cluster_key: uuid.UUID | None,
    *,
    max_torn_bytes: int,
    log_start: int = 0,
) -> PartitionScan:
    """Check every segment in ``directory``, in order, up to the first problem.

    ``cluster_key`` None: do not check the segments' key (the offline tools).
    ``log_start``: retention deleted what is below it. Segments wholly below it are
    leftovers of an interrupted deletion and are skipped; the first segment kept may
    start anywhere up to it (at it, for a replica that skipped ahead to it).
    """
    names = set(os.listdir(directory)) if os.path.isdir(directory) else set()
    firsts = sorted(int(m.group(1)) for n in names if (m := SEGMENT_NAME.match(n)))
    leftovers = set(leftover_segments(firsts, log_start))
    firsts = [first for first in firsts if first not in leftovers]
    orphans = sorted(
        n
        for n in names
        if (m := INDEX_NAME.match(n))
        and n[:-4] + ".seg" not in names
        and int(m.group(1)) not in leftovers
    )
    scans: list[SegmentScan] = []
    end = firsts[0] - 1 if firsts and 0 < firsts[0] <= log_start else -1
    problem = None
    torn_creation = None
    for i, first in enumerate(firsts):
        is_last = i == len(firsts) - 1
        name = segment_stem(first) + ".seg"
        size = os.path.getsize(os.path.join(directory, name))
        gap = _gap(partition_id, scans, end, first)
        if is_last and size < HEADER_BYTES:
            if gap is not None:
                problem = gap
                break
            # Segment.create fsyncs the .idx header before the .seg exists: an index with
            # entries shows records were written, so this is not an interrupted creation.
            entries = _index_entries(os.path.join(directory, segment_stem(first) + ".idx"))
            if entries:
                problem = (
                    f"partition {partition_id} segment {name}: {size} bytes, shorter than its "
                    f"header, but its index holds {entries} entries: records were written to "
                    f"it, so this is not an interrupted creation"
                )
            else:
                torn_creation = first
            break
        try:
            scan = scan_segment(
                directory,
                partition_id,
                cluster_key,
                first,
                is_last=is_last,
                max_torn_bytes=max_torn_bytes,
            )
        except CorruptSegment as e:
            problem = str(e)
            break
        if gap is not None:  # after the header checks, which say more about a misnamed file
            problem = gap
            break
        scans.append(scan if is_last else scan.offsets_left_in_index())
        if scan.damage is None:
            end = scan.last_txid
            continue
        end = scan.damage.txid - 1
        if scan.damage.reason is not None:
            problem = f"{scan.damage.where}: {scan.damage.reason}"
        break
    return PartitionScan(directory, partition_id, scans, end, problem, torn_creation, orphans)


def _gap(partition_id: int, scans: list[SegmentScan], end: int, first: int) -> str | None:
    if first == end + 1:
        return None
    if scans:
        return (
            f"partition {partition_id}: {scans[-1].name} ends at transaction {end} but the "
            f"next segment starts at {first}: a segment is missing"
        )
    return (
        f"partition {partition_id}: the first segment is {segment_stem(first)}.seg: the "
        f"segments before transaction {first} are missing"
    )


def scan_segment(
    directory: str,
    partition_id: int,
    cluster_key: uuid.UUID | None,
    first_txid: int,
    *,
    is_last: bool,
    max_torn_bytes: int,
) -> SegmentScan:
    """Check a segment's header and every record; classify damage. CorruptSegment for a
    header that is damaged or belongs elsewhere."""
    stem = os.path.join(directory, segment_stem(first_txid))
    path = stem + ".seg"
    fd = os.open(path, os.O_RDONLY)
    try:
        header = os.pread(fd, HEADER_BYTES, 0)
        version, created, key, stored_partition, stored_first = decode_header(header, path)
        fmt = record_format_of(version)  # the format its records are in
        if cluster_key is not None and key != cluster_key:
            raise CorruptSegment(
                f"{path}: belongs to the cluster whose key is {key_fingerprint(key)}, not "
                f"{key_fingerprint(cluster_key)}"
            )
        if stored_partition != partition_id or stored_first != first_txid:
            raise CorruptSegment(
                f"{path}: header says partition {stored_partition} first transaction "
                f"{stored_first}, file name says partition {partition_id} first {first_txid}"
            )
        size = os.fstat(fd).st_size
        hints, note = seg.read_index(stem + ".idx", header)
        # Zeros after the records are space written ahead of them, not part of the file:
        # damage is judged against the file's last non-zero byte.
        offsets, pos, problem, size = seg.scan_segment_file(fd, size, first_txid, fmt)
        where = (
            f"partition {partition_id} segment {os.path.basename(path)}: "
            f"{problem or 'the file ends'} at offset {pos} "
            f"(transaction {first_txid + len(offsets)})"
        )
        if problem is not None:
            damage = _classify(
                fd,
                pos,
                size,
                first_txid,
                offsets,
                hints,
                problem,
                where,
                is_last,
                max_torn_bytes,
                fmt,
            )
        else:
            damage = _synced_past_the_end(pos, first_txid, offsets, hints, where)
        return SegmentScan(first_txid, header, created, size, offsets, hints, note, damage, version)
    finally:
        os.close(fd)


def _classify(
    fd: int,
    pos: int,
    size: int,
    first_txid: int,
    offsets: array,
    hints: array,
    problem: str,
    where: str,
    is_last: bool,
    max_torn_bytes: int,
    fmt: RecordFormat,
) -> Damage:
    k = len(offsets)  # the damaged record's position in the segment (and in the index)
    txid = first_txid + k
    synced = k < len(hints) and hints[k] == pos and hints[:k] == offsets
    reason = torn_tail_reason(
        is_last=is_last,
        synced=synced,
        cut_short_last_hint=problem.startswith(_CUT_SHORT) and k == len(hints) - 1,
        cut=size - pos,
        max_torn_bytes=max_torn_bytes,
    )
    if reason is None:
        found = intact_record_after(os.pread(fd, size - pos, pos), txid, fmt)
        if found is not None:
            later, rel = found
            reason = (
                f"transaction {later} at offset {pos + rel} after it is intact: a torn write "
                f"damages only the end of the file, so this is corruption"
            )
    return Damage(pos, txid, size - pos, where, reason)


def _synced_past_the_end(
    size: int, first_txid: int, offsets: array, hints: array, where: str
) -> Damage | None:
    """Index entries past the last record, the first at the end of the file, agreeing with
    every record before: the file was cut at a record boundary after those records were
    synced. (One such entry is the last record cut whole, which is let pass like a cut
    short last record.)"""
    n = len(offsets)
    if len(hints) > n + 1 and hints[n] == size and hints[n + 1] > size and hints[:n] == offsets:
        reason = (
            f"the index holds {len(hints) - n} entries past it, so records that were synced "
            f"(acknowledged) are missing: this is corruption, not a torn write"
        )
        return Damage(size, first_txid + n, 0, where, reason)
    return None


def intact_record_after(
    buf: bytes, txid: int, fmt: RecordFormat = FORMAT_1
) -> tuple[int, int] | None:
    """(transaction, offset in ``buf``) of an intact record (of record format ``fmt``, the
    segment's) after the damaged record of ``txid`` at ``buf[0]``, or None.

    Looked for where the damaged record's length says the next one starts, then wherever
    the 8-byte ID of one of the next ``SEARCH_TXIDS`` transactions appears.
    """
    if len(buf) >= disk_head_bytes(fmt):
        (length,) = DATA_LENGTH.unpack_from(buf, 0)
        nxt = disk_overhead(fmt) + length
        if length >= 0 and nxt < len(buf) and check_record(buf, nxt, txid + 1, fmt) is None:
            return txid + 1, nxt
    last = min(txid + SEARCH_TXIDS, 2**63 - 1)
    for m in _txid_pattern(txid + 1, last).finditer(buf, 1):
        (found,) = _TXID.unpack_from(buf, m.start())
        if check_record(buf, m.start(), found, fmt) is None:
            return found, m.start()
    return None


def _txid_pattern(lo: int, hi: int) -> re.Pattern[bytes]:
    """Matches the big-endian i64 encoding of any ID in ``lo..hi`` (``hi - lo < 256``)."""
    parts = []
    a = lo
    while a <= hi:
        b = min(hi, a | 0xFF)  # the same top seven bytes
        top = b"".join(b"\\x%02x" % c for c in _TXID.pack(a)[:7])
        parts.append(top + b"[\\x%02x-\\x%02x]" % (a & 0xFF, b & 0xFF))
        a = b + 1
    return re.compile(b"|".join(parts), re.DOTALL)


def _index_entries(path: str) -> int:
    try:
        return max(0, (os.path.getsize(path) - HEADER_BYTES) // 8)
    except FileNotFoundError:
        return 0
