"""The backup directory: its manifest and chunk files, written and checked.

Layout (docs/backup.md has the full description)::

    PATH/
        waltz-backup.json                   the manifest
        partition-0/
            <first>-<last>.chunk            records first..last (19-digit, zero-padded IDs)
            ...
        partition-1/
        ...

A chunk file is a 32-byte header, ``magic | i32 partition | i64 first | i64 last |
u32 CRC-32 of the 28 bytes before``, then the records ``first..last`` back to back in
the wire layout of ``waltz_client.wire.records``, exactly as a range read returned them.
The magic names the record format: ``"WALTZBK2"``, format 2 (i64 transaction ID, ReqId
as 4 x i32, i32 header, i32 data length, i64 commit time, data, u32 CRC-32 of the
data), what this build writes; ``"WALTZBK1"``, format 1 (no commit time), what backups
of manifest version 1 hold and this build still reads. A manifest of version 2 may list
chunks of both kinds (a backup begun by an older build, continued by this one).

The manifest lists every chunk with its size and SHA-256, and
carries the SHA-256 of its own content, so any changed byte of any file is found and
the file named.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from waltz_client.runtime.files import fsync_directory
from waltz_client.wire.records import (
    CRC,
    DEFAULT_FORMAT,
    DEFAULT_MAX_DATA_BYTES,
    FORMAT_1,
    FORMAT_2,
    RecordBatch,
    RecordFormat,
)

MANIFEST_NAME = "waltz-backup.json"
FORMAT_NAME = "waltz-backup"
FORMAT_VERSION = 2  # what this build writes: chunks may hold records with commit times
READ_VERSIONS = (1, 2)

CHUNK_MAGIC = b"WALTZBK2"  # what this build writes: records of format 2
CHUNK_FORMATS = {b"WALTZBK1": FORMAT_1, CHUNK_MAGIC: FORMAT_2}
_CHUNK_HEAD = struct.Struct(">8siqq")
CHUNK_HEADER_BYTES = _CHUNK_HEAD.size + CRC.size  # 32
CHUNK_SUFFIX = ".chunk"
CHUNK_NAME = re.compile(r"^(\d{19})-(\d{19})\.chunk$")
READ_BLOCK = 4 * 1024 * 1024


class BackupError(Exception):
    """A backup that cannot be written, continued, verified or restored; the message
    names the file or partition and says why."""


def partition_dir(partition: int) -> str:
    return f"partition-{partition}"


def chunk_name(partition: int, first: int, last: int) -> str:
    """The chunk's path relative to the backup directory (always with ``/``)."""
    return f"{partition_dir(partition)}/{first:019d}-{last:019d}{CHUNK_SUFFIX}"


def encode_chunk_header(partition: int, first: int, last: int) -> bytes:
    head = _CHUNK_HEAD.pack(CHUNK_MAGIC, partition, first, last)
    return head + CRC.pack(zlib.crc32(head))


# --- the manifest -----------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkFile:
    name: str  # relative to the backup directory
    first: int
    last: int
    bytes: int
    sha256: str

    @property
    def records(self) -> int:
        return self.last - self.first + 1


@dataclass
class PartitionBackup:
    """What the backup holds of one partition: transactions ``first..high_water_mark``."""

    partition: int
    # The first transaction the backup holds: where the source's log started when the
    # backup began, and where the restored log starts.
    first: int
    # The last transaction copied: the partition's high-water mark recorded at the start
    # of the last run (first - 1 while the backup holds nothing).
    high_water_mark: int
    # The source's log start seen by the last run (retention may have moved it since
    # ``first``); later runs must find it at or below high_water_mark + 1.
    source_log_start: int
    # The highest ReqId generation among the records (a restore starts above it, so that
    # no new append can carry the ReqId of a restored one).
    max_generation: int = 0
    files: list[ChunkFile] = field(default_factory=list)

    @property
    def records(self) -> int:
        return self.high_water_mark - self.first + 1

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)


@dataclass(frozen=True)
class SourceCluster:
    name: str
    root: str
    key_fingerprint: str  # the cluster key's SHA-256 prefix, never the key
    num_partitions: int
    num_replicas: int


@dataclass
class Manifest:
    source: SourceCluster
    created: str
    partitions: dict[int, PartitionBackup]
    runs: list[dict[str, Any]] = field(default_factory=list)
    # As read (1: an older build's backup, every chunk of format 1); a run of this build
    # writes FORMAT_VERSION.
    version: int = FORMAT_VERSION

    # --- encoding ---

    def body(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": self.version,
            "created": self.created,
            "source": {
                "name": self.source.name,
                "root": self.source.root,
                "key_fingerprint": self.source.key_fingerprint,
                "num_partitions": self.source.num_partitions,
                "num_replicas": self.source.num_replicas,
            },
            "partitions": [
                {
                    "partition": b.partition,
                    "first": b.first,
                    "high_water_mark": b.high_water_mark,
                    "source_log_start": b.source_log_start,
                    "max_generation": b.max_generation,
                    "files": [
                        {
                            "name": f.name,
                            "first": f.first,
                            "last": f.last,
                            "bytes": f.bytes,
                            "sha256": f.sha256,
                        }
                        for f in b.files
                    ],
                }
                for _, b in sorted(self.partitions.items())
            ],
            "runs": self.runs,
        }

    def encode(self) -> bytes:
        body = self.body()
        doc = {"checksum": "sha256:" + _digest(body), "manifest": body}
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

    def write(self, directory: str) -> None:
        """Atomically replace the manifest (temporary file, fsync, rename, fsync)."""
        path = os.path.join(directory, MANIFEST_NAME)
        temporary = path + ".tmp"
        with open(temporary, "wb") as f:
            f.write(self.encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
        fsync_directory(directory)

    @classmethod
    def read(cls, directory: str) -> Manifest:
        """The manifest, checked: BackupError names it when it is missing, damaged or
        edited, or does not describe a whole backup."""
        path = os.path.join(directory, MANIFEST_NAME)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise BackupError(f"{path}: no backup manifest (is {directory} a backup?)") from None
        except OSError as e:
            raise BackupError(f"{path}: cannot read the manifest: {e}") from None
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BackupError(f"{path}: damaged: not a JSON document ({e})") from None
        if not isinstance(doc, dict) or set(doc) != {"checksum", "manifest"}:
            raise BackupError(f"{path}: damaged: not a waltz backup manifest")
        body = doc["manifest"]
        if doc["checksum"] != "sha256:" + _digest(body):
            raise BackupError(
                f"{path}: checksum mismatch: the manifest was damaged or edited; "
                f"refusing to use this backup"
            )
        try:
            manifest = cls._decode(body)
        except (KeyError, TypeError, ValueError) as e:
            raise BackupError(f"{path}: not a valid manifest: {e}") from None
        if manifest.encode() != raw:
            raise BackupError(
                f"{path}: damaged: its bytes differ from the manifest they encode "
                f"(changed since `waltz backup` wrote it)"
            )
        problem = manifest.problem()
        if problem:
            raise BackupError(f"{path}: {problem}")
        return manifest

    @classmethod
    def _decode(cls, body: Any) -> Manifest:
        if not isinstance(body, dict):
            raise TypeError("the manifest is not an object")
        if body.get("format") != FORMAT_NAME:
            raise ValueError(f"format {body.get('format')!r} is not {FORMAT_NAME!r}")
        version = body.get("version")
        if version not in READ_VERSIONS:
            raise ValueError(
                f"version {version!r} is not supported (this build reads "
                f"{', '.join(map(str, READ_VERSIONS))})"
            )
        src = body["source"]
        source = SourceCluster(
            _str(src, "name"),
            _str(src, "root"),
            _str(src, "key_fingerprint"),
            _int(src, "num_partitions", 1),
            _int(src, "num_replicas", 1),
        )
        partitions: dict[int, PartitionBackup] = {}
        for entry in body["partitions"]:
            b = PartitionBackup(
                _int(entry, "partition", 0),
                _int(entry, "first", 0),
                _int(entry, "high_water_mark", -1),
                _int(entry, "source_log_start", 0),
                _int(entry, "max_generation", 0),
                [
                    ChunkFile(
                        _str(f, "name"),
                        _int(f, "first", 0),
                        _int(f, "last", 0),
                        _int(f, "bytes", CHUNK_HEADER_BYTES),
                        _str(f, "sha256"),
                    )
                    for f in entry["files"]
                ],
            )
            if b.partition in partitions:
                raise ValueError(f"partition {b.partition} is listed twice")
            partitions[b.partition] = b
        runs = body["runs"]
        if not isinstance(runs, list):
            raise TypeError("runs is not a list")
        return cls(source, _str(body, "created"), partitions, runs, version)

    def problem(self) -> str | None:
        """Why the manifest does not describe a gap-free backup of every partition."""
        n = self.source.num_partitions
        if sorted(self.partitions) != list(range(n)):
            return f"lists partitions {sorted(self.partitions)}, the source has 0..{n - 1}"
        for p, b in sorted(self.partitions.items()):
            if b.high_water_mark < b.first - 1:
                return f"partition {p}: high-water mark {b.high_water_mark} is below {b.first}"
            expected = b.first
            for f in b.files:
                if f.name != chunk_name(p, f.first, f.last):
                    return f"partition {p}: chunk {f.name!r} is not named by its range"
                if f.first != expected or f.last < f.first:
                    return (
                        f"partition {p}: chunk {f.name} holds {f.first}..{f.last}, "
                        f"expected it to start at {expected}"
                    )
                if not re.fullmatch(r"[0-9a-f]{64}", f.sha256):
                    return f"partition {p}: chunk {f.name} has no SHA-256"
                expected = f.last + 1
            if expected != b.high_water_mark + 1:
                return (
                    f"partition {p}: the chunks end at {expected - 1}, the high-water mark "
                    f"is {b.high_water_mark}"
                )
        return None


def _digest(body: Any) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()


def _int(doc: dict, name: str, minimum: int) -> int:
    value = doc[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _str(doc: dict, name: str) -> str:
    value = doc[name]
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {value!r}")
    return value


# --- writing chunks ---------------------------------------------------------------------


class ChunkWriter:
    """Writes one chunk file: records appended in order, then ``finish`` fsyncs it and
    moves it to its final name. Until then it is ``<name>.tmp``."""

    def __init__(self, directory: str, partition: int, first: int) -> None:
        self.directory = directory
        self.partition = partition
        self.first = first
        self.last = first - 1
        folder = os.path.join(directory, partition_dir(partition))
        if not os.path.isdir(folder):
            os.makedirs(folder)
            fsync_directory(directory)
        self._temporary = os.path.join(folder, f"{first:019d}.chunk.tmp")
        self._file = open(self._temporary, "wb")  # noqa: SIM115 (closed in finish/abort)
        self.bytes = 0
        self._write(encode_chunk_header(partition, first, -1))  # the last is set in finish

    def _write(self, data: bytes) -> None:
        self._file.write(data)
        self.bytes += len(data)

    def append(self, batch: RecordBatch) -> None:
        batch = batch.convert(DEFAULT_FORMAT)  # as the magic says (a no-op from a new server)
        if batch.first_txid != self.last + 1:
            raise BackupError(
                f"partition {self.partition}: got transaction {batch.first_txid}, "
                f"expected {self.last + 1}"
            )
        self._write(batch.buf)
        self.last = batch.last_txid

    def finish(self) -> ChunkFile:
        """Seal the chunk: header with its last transaction, fsync, final name."""
        header = encode_chunk_header(self.partition, self.first, self.last)
        self._file.seek(0)
        self._file.write(header)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        # The digest of the whole file as it now is (`sha256sum` shows the same), read
        # back from the page cache: the header was rewritten last.
        sha = hashlib.sha256()
        with open(self._temporary, "rb") as f:
            while block := f.read(READ_BLOCK):
                sha.update(block)
        name = chunk_name(self.partition, self.first, self.last)
        os.replace(self._temporary, os.path.join(self.directory, name))
        fsync_directory(os.path.dirname(os.path.join(self.directory, name)))
        return ChunkFile(name, self.first, self.last, self.bytes, sha.hexdigest())

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._temporary)


# --- reading and checking chunks --------------------------------------------------------


@dataclass
class ChunkReport:
    name: str
    records: int
    max_generation: int


def read_chunk(
    directory: str,
    partition: int,
    chunk: ChunkFile,
    *,
    block: int = READ_BLOCK,
    max_data_bytes: int = DEFAULT_MAX_DATA_BYTES,
    report: ChunkReport | None = None,
) -> Iterator[RecordBatch]:
    """The chunk's records as record batches of about ``block`` bytes, every byte
    checked: size, header, each record's data CRC-32 and transaction ID, and in the
    end the SHA-256 (the last batch is yielded only after it matched). BackupError
    names the file."""
    path = os.path.join(directory, chunk.name)
    try:
        f = open(path, "rb")  # noqa: SIM115
    except FileNotFoundError:
        raise BackupError(f"{path}: missing (the manifest lists it)") from None
    except OSError as e:
        raise BackupError(f"{path}: cannot read: {e}") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size != chunk.bytes:
            what = "truncated" if size < chunk.bytes else "extended"
            raise BackupError(f"{path}: {what}: {size} bytes, the manifest says {chunk.bytes}")
        sha = hashlib.sha256()
        head = f.read(CHUNK_HEADER_BYTES)
        sha.update(head)
        if len(head) < CHUNK_HEADER_BYTES:
            raise BackupError(f"{path}: damaged header (cut short)")
        magic, p, first, last = _CHUNK_HEAD.unpack_from(head)
        (crc,) = CRC.unpack_from(head, _CHUNK_HEAD.size)
        fmt = CHUNK_FORMATS.get(magic)
        if fmt is None or zlib.crc32(head[: _CHUNK_HEAD.size]) != crc:
            raise BackupError(f"{path}: damaged header (magic or CRC-32 mismatch)")
        if (p, first, last) != (partition, chunk.first, chunk.last):
            raise BackupError(
                f"{path}: the header says partition {p}, transactions {first}..{last}; "
                f"the manifest says partition {partition}, {chunk.first}..{chunk.last}"
            )
        expected = first
        max_generation = 0
        pending: RecordBatch | None = None
        rest = b""
        offset = CHUNK_HEADER_BYTES  # of ``rest`` in the file
        eof = False
        while expected <= last:
            data = f.read(block)
            if data:
                sha.update(data)
            else:
                eof = True
            buf = rest + data if rest else data
            spans, used, generation = _scan(
                buf, expected, last, offset, path, max_data_bytes, fmt, final=eof
            )
            max_generation = max(max_generation, generation)
            if spans:
                if pending is not None:
                    yield pending
                pending = RecordBatch(buf[:used], spans, fmt)
                expected = spans[-1][0] + 1
            rest = buf[used:]
            offset += used
            if eof:
                break
        if expected != last + 1:
            raise BackupError(
                f"{path}: ends after transaction {expected - 1}, the manifest says {last}"
            )
        if rest or f.read(1):
            raise BackupError(f"{path}: bytes after transaction {last} (damaged)")
        if sha.hexdigest() != chunk.sha256:
            raise BackupError(
                f"{path}: SHA-256 mismatch: the file was damaged or changed since the "
                f"backup wrote it"
            )
        if report is not None:
            report.records = last - first + 1
            report.max_generation = max_generation
        if pending is not None:
            yield pending


def _scan(
    buf: bytes,
    expected: int,
    last: int,
    offset: int,
    path: str,
    max_data_bytes: int,
    fmt: RecordFormat,
    *,
    final: bool,
) -> tuple[list[tuple[int, int, int]], int, int]:
    """Whole records (of record format ``fmt``) at the start of ``buf``: (spans, bytes
    used, highest generation). An incomplete record at the end is left for the next
    read, unless ``final``."""
    spans: list[tuple[int, int, int]] = []
    head = fmt.head
    pos = 0
    end = len(buf)
    generation = 0
    view = memoryview(buf)
    while expected <= last and end - pos >= head.size:
        txid, _, gen, _, _, _, length, *_ = head.unpack_from(buf, pos)
        if txid != expected:
            raise BackupError(
                f"{path}: transaction {txid} at offset {offset + pos} where {expected} "
                f"was expected (damaged)"
            )
        if length < 0 or length > max_data_bytes:
            raise BackupError(
                f"{path}: transaction {txid} at offset {offset + pos}: data length {length} "
                f"is outside 0..{max_data_bytes} (damaged)"
            )
        data_end = pos + head.size + length
        if end - data_end < CRC.size:
            break  # the rest of it is in the next block
        (stored,) = CRC.unpack_from(buf, data_end)
        if zlib.crc32(view[pos + head.size : data_end]) != stored:
            raise BackupError(
                f"{path}: transaction {txid} at offset {offset + pos}: data CRC-32 mismatch "
                f"(damaged)"
            )
        spans.append((txid, pos, length))
        generation = max(generation, gen)
        pos = data_end + CRC.size
        expected += 1
    if final and not spans and expected <= last:
        raise BackupError(
            f"{path}: cut short at offset {offset + pos}: transaction {expected} is "
            f"incomplete and {last - expected + 1} records are missing"
        )
    return spans, pos, generation


def read_chunk_whole(directory: str, partition: int, chunk: ChunkFile) -> ChunkReport:
    """Check every byte of one chunk (``read_chunk`` to the end)."""
    report = ChunkReport(chunk.name, 0, 0)
    for _ in read_chunk(directory, partition, chunk, report=report):
        pass
    return report


@dataclass
class VerifyResult:
    manifest: Manifest
    records: int
    bytes: int
    files: int


def verify_backup(
    directory: str, progress: Callable[[str], None] = lambda message: None
) -> VerifyResult:
    """Check the whole backup (the manifest, then every byte of every chunk); BackupError
    names the first damaged file."""
    manifest = Manifest.read(directory)
    records = size = files = 0
    for p, b in sorted(manifest.partitions.items()):
        generation = 0
        for chunk in b.files:
            report = read_chunk_whole(directory, p, chunk)
            generation = max(generation, report.max_generation)
            records += report.records
            size += chunk.bytes
            files += 1
        if generation > b.max_generation:
            raise BackupError(
                f"{os.path.join(directory, MANIFEST_NAME)}: partition {p}: records carry "
                f"generation {generation}, the manifest says at most {b.max_generation}"
            )
        progress(f"partition {p}: {b.first}..{b.high_water_mark} OK ({len(b.files)} files)")
    return VerifyResult(manifest, records, size, files)


def check_listed_files(directory: str, manifest: Manifest) -> None:
    """A cheap check before a backup continues: every listed chunk is there, with its
    size (``verify_backup`` reads them all)."""
    for b in manifest.partitions.values():
        for chunk in b.files:
            path = os.path.join(directory, chunk.name)
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                raise BackupError(f"{path}: missing (the manifest lists it)") from None
            if size != chunk.bytes:
                raise BackupError(
                    f"{path}: {size} bytes, the manifest says {chunk.bytes} (damaged); "
                    f"refusing to continue this backup"
                )


def leftover_files(directory: str, manifest: Manifest | None) -> list[str]:
    """Chunk files (and temporary ones) the manifest does not list: left by a run that
    stopped before recording them. Relative paths."""
    listed = {f.name for b in (manifest.partitions.values() if manifest else ()) for f in b.files}
    found = []
    for entry in sorted(os.listdir(directory)):
        m = re.fullmatch(r"partition-(\d+)", entry)
        folder = os.path.join(directory, entry)
        if not m or not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            relative = f"{entry}/{name}"
            if relative in listed:
                continue
            if CHUNK_NAME.match(name) or name.endswith(".chunk.tmp"):
                found.append(relative)
    return found


def with_files(b: PartitionBackup, chunk: ChunkFile, generation: int) -> PartitionBackup:
    return replace(
        b,
        files=[*b.files, chunk],
        high_water_mark=chunk.last,
        max_generation=max(b.max_generation, generation),
    )
