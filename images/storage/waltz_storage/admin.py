"""``waltz storage ...``: offline tools (verify, dump, control) and the benchmark."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from waltz_client.wire.records import NO_TIMESTAMP

from .inspect import (
    commit_time_text,
    partition_dirs,
    read_control_file,
    read_records,
    segment_paths,
    verify_partition,
    verify_segment,
)


def register(groups: argparse._SubParsersAction) -> None:
    storage = groups.add_parser("storage", help="storage node tools (offline and benchmark)")
    cmds = storage.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = cmds.add_parser("verify", help="check segment and index files (read-only)")
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="a .seg file, a partition directory or a storage directory",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_verify)

    p = cmds.add_parser("dump", help="print the records of a segment (read-only)")
    p.add_argument("segment", help="a .seg file")
    p.add_argument("--from", dest="from_txid", type=int, help="first transaction ID to print")
    p.add_argument("--count", type=int, help="print at most this many records")
    p.add_argument("--data", action="store_true", help="also print each record's data")
    p.add_argument("--json", action="store_true", help="one JSON object per record")
    p.set_defaults(func=cmd_dump)

    p = cmds.add_parser("control", help="print the control file (read-only)")
    p.add_argument("directory", help="storage directory or the waltz-storage.ctl file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_control)

    p = cmds.add_parser(
        "bench-sync",
        help="what making a group durable costs by the files it touched, against one journal",
    )
    p.add_argument("--dir", default=".", help="on the filesystem to measure (default: here)")
    p.add_argument(
        "--files", default="1,4,16,64", help="files a group, comma-separated (default 1,4,16,64)"
    )
    p.add_argument("--bytes", type=int, default=4096, help="bytes appended to each (4096)")
    p.add_argument("--rounds", type=int, default=300, help="groups measured a row (300)")
    p.set_defaults(func=cmd_bench_sync)

    p = cmds.add_parser(
        "bench-group",
        help="what a group of appends costs the node's I/O thread a request, by the "
        "partitions in it (in-process)",
    )
    p.add_argument("--dir", default=".", help="on the filesystem to measure (default: here)")
    p.add_argument(
        "--partitions",
        default="1,4,16,64",
        help="partitions a group, each with one append, comma-separated (default 1,4,16,64)",
    )
    p.add_argument("--records", type=int, default=2, help="records an append (2)")
    p.add_argument("--record-bytes", type=int, default=1024, help="data bytes a record (1024)")
    p.add_argument(
        "--appends",
        type=int,
        default=20000,
        help="appends measured a row, in groups of --partitions (20000)",
    )
    p.set_defaults(func=cmd_bench_group)

    p = cmds.add_parser("bench", help="append rate and latency of one storage node vs the disk")
    p.add_argument(
        "--dir",
        help="where to put the node's data (default: a temporary "
        "directory here; choose the disk you want to measure)",
    )
    p.add_argument(
        "--batch-sizes",
        default="1,10,100,1000",
        help="records per Append, comma-separated (default 1,10,100,1000)",
    )
    p.add_argument(
        "--in-flight",
        default="1,8",
        help="Appends outstanding at once, comma-separated (default 1,8)",
    )
    p.add_argument("--record-bytes", type=int, default=1024, help="data bytes per record")
    p.add_argument("--duration", type=float, default=3.0, help="seconds per measurement")
    p.add_argument(
        "--partitions",
        type=int,
        default=1,
        help="append to this many partitions at once, each on its own connection with "
        "its own in-flight window, as a server's partitions do (default 1)",
    )
    p.add_argument(
        "--no-group-sync",
        action="store_true",
        help="run the node with group_sync off: an fsync for each partition, no syncfs",
    )
    p.add_argument("--json", action="store_true", help="print results as JSON at the end")
    p.set_defaults(func=cmd_bench)


def _fail(message: str) -> int:
    print(f"waltz storage: error: {message}", file=sys.stderr)
    return 2


def cmd_verify(args: argparse.Namespace) -> int:
    reports = []
    refused = []  # partitions a node would refuse to open (recovery.refusal)
    for target in args.paths:
        if not os.path.exists(target):
            return _fail(f"{target}: no such file or directory")
        paths = segment_paths(target)
        partitions = [verify_partition(*found) for found in partition_dirs(target)]
        bad = [r for r in partitions if not r.ok]
        if not paths and not bad:
            return _fail(f"{target}: no segment files (*.seg) found")
        reports += [verify_segment(path) for path in paths]
        refused += bad
    if args.json:
        print(json.dumps([r.as_dict() for r in [*reports, *refused]], indent=2))
    else:
        for r in reports:
            status = "OK     " if r.ok else "CORRUPT"
            print(
                f"{status} {r.path}: format {r.format_version or '?'}, transactions "
                f"{r.first_txid}..{r.last_txid} ({r.records} records, "
                f"{r.index_entries} index entries)"
            )
            for problem in r.problems:
                print(f"        {problem}")
        for p in refused:
            print(
                f"REFUSED {p.path}: partition {p.partition} would not open: its log ends at "
                f"transaction {p.recovered_end}, local low-water mark {p.local_low_water_mark}"
            )
            for problem in p.problems:
                print(f"        {problem}")
    return 0 if all(r.ok for r in reports) and not refused else 1


def cmd_dump(args: argparse.Namespace) -> int:
    if not os.path.isfile(args.segment):
        return _fail(f"{args.segment}: not a file")
    try:
        rows = read_records(args.segment, args.from_txid, args.count)
    except Exception as e:  # a damaged header: say so, like verify
        return _fail(f"{args.segment}: {e}")
    status = 0
    for offset, rec, problem in rows:
        if rec is None:
            print(f"offset {offset}: {problem}", file=sys.stderr)
            status = 1
            continue
        q = rec.req_id
        timed = rec.timestamp != NO_TIMESTAMP
        if args.json:
            row = {
                "transaction_id": rec.transaction_id,
                "offset": offset,
                "req_id": [q.client_id, q.generation, q.partition_id, q.seq],
                # None: a record of format 1 (written before commit times)
                "commit_time_ms": rec.timestamp if timed else None,
                "commit_time": commit_time_text(rec.timestamp) if timed else None,
                "header": rec.header,
                "length": len(rec.data),
                "crc32": rec.checksum,
            }
            if args.data:
                row["data_hex"] = rec.data.hex()
            print(json.dumps(row))
        else:
            line = (
                f"txid={rec.transaction_id} offset={offset} reqid={q.client_id}/"
                f"{q.generation}/{q.partition_id}/{q.seq} "
                f"time={commit_time_text(rec.timestamp)} header={rec.header} "
                f"length={len(rec.data)} crc32={rec.checksum:#010x}"
            )
            if args.data:
                line += f" data={rec.data[:64]!r}" + ("..." if len(rec.data) > 64 else "")
            print(line)
    return status


def cmd_control(args: argparse.Namespace) -> int:
    try:
        report = read_control_file(args.directory)
    except OSError as e:
        return _fail(f"{args.directory}: {e.strerror}")
    if args.json:
        print(
            json.dumps(
                {
                    "path": report.path,
                    "version": report.version,
                    "created_ms": report.created_ms,
                    "cluster_key": str(report.cluster_key),
                    "num_partitions": report.num_partitions,
                    "header_ok": report.header_ok,
                    "problems": report.problems,
                    "partitions": report.partitions,
                },
                indent=2,
            )
        )
    else:
        if report.cluster_key is None:
            print(f"{report.path}: DAMAGED: {'; '.join(report.problems)}")
            return 1
        created = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(report.created_ms / 1000))
        state = "ok" if not report.problems else "DAMAGED: " + "; ".join(report.problems)
        print(
            f"{report.path}: format {report.version}, created {created}, "
            f"cluster key {report.cluster_key}, {report.num_partitions} partitions, {state}"
        )
        for part in report.partitions:
            for k, slot in enumerate(part["slots"]):
                if slot is None:
                    print(f"  partition {part['partition']} slot {k}: CHECKSUM MISMATCH")
                else:
                    print(
                        f"  partition {part['partition']} slot {k}: seq {slot['sequence']} "
                        f"fence session {slot['fence_session_id']} session "
                        f"{slot['session_id']} low-water mark {slot['low_water_mark']} "
                        f"local {slot['local_low_water_mark']}"
                    )
    bad = bool(report.problems) or any(
        all(s is None for s in p["slots"]) for p in report.partitions
    )
    return 1 if bad else 0


def cmd_bench_sync(args: argparse.Namespace) -> int:
    from .bench import machine_summary
    from .sync_cost import HEADER, describe, measure

    try:
        files = [int(x) for x in args.files.split(",")]
    except ValueError:
        return _fail(f"--files takes comma-separated integers, got {args.files!r}")
    if any(n < 1 for n in files) or args.bytes < 1 or args.rounds < 1:
        return _fail("--files, --bytes and --rounds must be at least 1")
    if not os.path.isdir(args.dir):
        return _fail(f"--dir {args.dir}: not a directory")
    print(
        f"storage bench-sync on {machine_summary()}, in {os.path.abspath(args.dir)}: "
        f"{args.bytes} bytes a file a group, {args.rounds} groups a row"
    )
    print(HEADER)
    for n in files:
        try:
            print(describe(measure(args.dir, n, args.bytes, args.rounds)), flush=True)
        except (OSError, RuntimeError) as e:
            return _fail(str(e))
    return 0


def cmd_bench_group(args: argparse.Namespace) -> int:
    from .bench import machine_summary
    from .group_cost import HEADER, describe, measure

    try:
        partitions = [int(x) for x in args.partitions.split(",")]
    except ValueError:
        return _fail(f"--partitions takes comma-separated integers, got {args.partitions!r}")
    if any(n < 1 for n in partitions) or min(args.records, args.record_bytes, args.appends) < 1:
        return _fail("--partitions, --records, --record-bytes and --appends must be at least 1")
    if not os.path.isdir(args.dir):
        return _fail(f"--dir {args.dir}: not a directory")
    print(
        f"storage bench-group on {machine_summary()}, in {os.path.abspath(args.dir)}: "
        f"{args.records} records of {args.record_bytes} bytes an append, "
        f"about {args.appends:,} appends a row"
    )
    print(HEADER)
    for n in partitions:
        try:
            groups = -(-args.appends // n)  # rounded up
            cost = measure(args.dir, n, args.records, args.record_bytes, groups)
        except (OSError, RuntimeError) as e:
            return _fail(str(e))
        print(describe(cost), flush=True)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import HEADER, StorageDidNotStart, machine_summary, results_json, run_bench

    try:
        batches = [int(x) for x in args.batch_sizes.split(",")]
        inflights = [int(x) for x in args.in_flight.split(",")]
    except ValueError:
        return _fail("--batch-sizes and --in-flight take comma-separated integers")
    if any(b < 1 for b in batches + inflights) or args.record_bytes < 0 or args.duration <= 0:
        return _fail("batch sizes and in-flight counts must be >= 1, duration > 0")
    if args.partitions < 1:
        return _fail("--partitions must be >= 1")
    spread = (
        f", {args.partitions} partitions at once (in flight: each)" if args.partitions > 1 else ""
    )
    sync = ", group_sync off" if args.no_group_sync else ""
    print(
        f"storage bench on {machine_summary()}: {args.record_bytes}-byte records, fsync on, "
        f"{args.duration:g} s per row{spread}{sync}"
    )
    print(HEADER)
    try:
        results = run_bench(
            args.dir,
            batches,
            args.record_bytes,
            args.duration,
            inflights,
            partitions=args.partitions,
            group_sync=not args.no_group_sync,
        )
    except StorageDidNotStart as e:  # its own error (a bad WALTZ_STORAGE_* setting) is above
        return _fail(str(e))
    if args.json:
        print(results_json(results))
    return 0
