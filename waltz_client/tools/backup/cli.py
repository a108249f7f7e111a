"""``waltz backup PATH`` and ``waltz restore PATH`` (registered as entry points of the
``waltz.commands`` group, see pyproject.toml)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from waltz_client.client import WaltzError
from waltz_client.cluster.acl import credential_from_setting
from waltz_client.cluster.errors import ClusterError
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect
from waltz_client.config import WaltzClientConfig, WaltzConfigError
from waltz_client.runtime import event_loop
from waltz_client.runtime.settings import parse_size, zookeeper_address
from waltz_client.runtime.tls import TlsFiles

from .backup import BackupSettings, run_backup
from .format import BackupError, verify_backup
from .restore import StorageTarget, check_zookeeper_target, plan_restore, restore

DEFAULT_ROOT = "/waltz"


def _zookeeper_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--zookeeper",
        "-z",
        default=os.environ.get("WALTZ_ZOOKEEPER"),
        help="ZooKeeper connect string (env WALTZ_ZOOKEEPER)",
    )
    p.add_argument(
        "--root",
        default=os.environ.get("WALTZ_ROOT", DEFAULT_ROOT),
        help=f"cluster root znode (env WALTZ_ROOT, default {DEFAULT_ROOT})",
    )
    p.add_argument(
        "--zk-auth-file",
        default=os.environ.get("WALTZ_ZK_AUTH_FILE", ""),
        help="file holding user:password of the cluster's ZooKeeper credential "
        "(env WALTZ_ZK_AUTH_FILE)",
    )
    _tls_options(p, "zk-tls", "ZooKeeper's TLS port")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _tls_options(p: argparse.ArgumentParser, prefix: str, what: str) -> None:
    for part, kind in (("cert", "certificate"), ("key", "private key"), ("ca", "CA bundle")):
        env = f"WALTZ_{prefix.upper().replace('-', '_')}_{part.upper()}"
        p.add_argument(
            f"--{prefix}-{part}",
            default=os.environ.get(env, ""),
            help=f"PEM {kind} to reach {what} (env {env})",
        )


def _files(args: argparse.Namespace, prefix: str) -> TlsFiles | None:
    parts = [getattr(args, f"{prefix}_{part}") or None for part in ("cert", "key", "ca")]
    return TlsFiles(*parts) if any(parts) else None


def register_backup(groups: argparse._SubParsersAction) -> None:
    p = groups.add_parser(
        "backup",
        help="copy every partition's committed log into a backup directory (incremental)",
        description="Copy every partition's committed transactions, up to the high-water "
        "mark recorded at the start of the run, into PATH, through the servers while the "
        "cluster keeps serving. A later run into the same PATH copies only what is new. "
        "With --verify, check every byte of an existing backup instead (no cluster needed).",
    )
    p.add_argument("path", metavar="PATH", help="the backup directory (created if missing)")
    _zookeeper_options(p)
    _tls_options(p, "tls", "the servers over TLS")
    p.add_argument(
        "--verify",
        action="store_true",
        help="only check the backup at PATH: the manifest and every byte of every chunk",
    )
    p.add_argument(
        "--chunk-size",
        default="64MiB",
        help="start a new chunk file once one reaches this size (default 64MiB)",
    )
    p.add_argument("--parallel", type=int, default=4, help="partitions copied at once (default 4)")
    p.add_argument(
        "--in-flight", type=int, default=4, help="range reads under way per partition (default 4)"
    )
    p.set_defaults(func=cmd_backup)


def register_restore(groups: argparse._SubParsersAction) -> None:
    p = groups.add_parser(
        "restore",
        help="build a new cluster holding a backup's transactions under the same IDs",
        description="Check every byte of the backup at PATH, then write the storage "
        "directories of a new cluster (one per --storage) and create the cluster in "
        "ZooKeeper at --root. Then start a storage node on each directory, listening on "
        "its address, and the servers. Refuses non-empty storage directories and a root "
        "that holds anything; on any failure, removes what it wrote.",
    )
    p.add_argument("path", metavar="PATH", help="the backup directory")
    _zookeeper_options(p)
    p.add_argument(
        "--storage",
        action="append",
        default=[],
        metavar="HOST:PORT[@GROUP]=DIR",
        help="a storage node of the new cluster: the address it will serve on, its failure "
        "domain, and the (empty) directory it will be started with (repeat)",
    )
    p.add_argument("--name", help="cluster name (default: the backed-up cluster's)")
    p.add_argument(
        "--replicas",
        type=int,
        help="replicas per partition (default: the backed-up cluster's, at most the nodes)",
    )
    p.add_argument("--key", type=uuid.UUID, help="cluster key (default: a new random UUID)")
    p.add_argument(
        "--segment-size",
        default="1GiB",
        help="segment size of the written logs (default 1GiB, as the storage node's)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the backup and the targets and print the plan; write nothing",
    )
    p.set_defaults(func=cmd_restore)


def _error(command: str, message: str, code: int) -> int:
    print(f"waltz {command}: error: {message}", file=sys.stderr)
    return code


def _connect(args: argparse.Namespace) -> KazooClient:
    zookeeper_address(args.zookeeper)
    credential = credential_from_setting(args.zk_auth_file, "--zk-auth-file")
    tls = _files(args, "zk_tls")
    if tls is not None:
        tls.check("zk_tls", listening=False)
    return connect(args.zookeeper, credential=credential, tls=tls)


def _say(args: argparse.Namespace):
    if args.json:
        return lambda message: print(message, file=sys.stderr)
    return print


def cmd_backup(args: argparse.Namespace) -> int:
    if args.verify:
        try:
            checked = verify_backup(args.path, _say(args))
        except BackupError as e:
            return _error("backup", f"DAMAGED: {e}", 1)
        m = checked.manifest
        if args.json:
            print(
                json.dumps(
                    {
                        "ok": True,
                        "records": checked.records,
                        "bytes": checked.bytes,
                        "files": checked.files,
                        "partitions": {
                            str(p): [b.first, b.high_water_mark]
                            for p, b in sorted(m.partitions.items())
                        },
                    },
                    indent=2,
                )
            )
        else:
            print(
                f"OK: backup of {m.source.name!r} ({m.source.root}), {checked.files} files, "
                f"{checked.records} records, {checked.bytes} bytes, {len(m.runs)} runs"
            )
        return 0
    if not args.zookeeper:
        return _error(
            "backup", "no ZooKeeper: pass --zookeeper HOST:PORT or set WALTZ_ZOOKEEPER", 2
        )
    try:
        settings = BackupSettings(
            chunk_bytes=parse_size(args.chunk_size),
            in_flight=args.in_flight,
            parallel=args.parallel,
        )
        if settings.chunk_bytes < 1 or settings.in_flight < 1 or settings.parallel < 1:
            raise ValueError("--chunk-size, --in-flight and --parallel must be positive")
        root = ClusterPaths.of(args.root).root
        config = WaltzClientConfig(
            args.zookeeper,
            zk_root=root,
            feed=False,
            tls=_files(args, "tls"),
            zk_tls=_files(args, "zk_tls"),
        )
        zk = _connect(args)
    except (ClusterError, ValueError, WaltzConfigError) as e:
        return _error("backup", str(e), 2)
    try:
        result = event_loop.run(run_backup(args.path, zk, config, settings, _say(args)))
    except (BackupError, WaltzError, ClusterError) as e:
        return _error("backup", str(e), 1)
    finally:
        close(zk)
    m = result.manifest
    for problem in result.problems:
        print(f"waltz backup: error: {problem}", file=sys.stderr)
    if args.json:
        print(
            json.dumps(
                {
                    "ok": not result.problems,
                    "problems": result.problems,
                    "partitions": {
                        str(r.partition): {
                            "first": m.partitions[r.partition].first,
                            "high_water_mark": m.partitions[r.partition].high_water_mark,
                            "copied": [r.copied_from, r.copied_to] if r.records else None,
                            "records": r.records,
                            "bytes": r.bytes,
                        }
                        for r in result.runs
                    },
                },
                indent=2,
            )
        )
    else:
        records = sum(r.records for r in result.runs)
        size = sum(r.bytes for r in result.runs)
        print(
            f"{'FAILED' if result.problems else 'OK'}: {records} records ({size} bytes) copied "
            f"into {result.directory}; the backup holds "
            + ", ".join(
                f"{p}: {b.first}..{b.high_water_mark}" for p, b in sorted(m.partitions.items())
            )
        )
    return 1 if result.problems else 0


def cmd_restore(args: argparse.Namespace) -> int:
    if not args.zookeeper:
        return _error(
            "restore", "no ZooKeeper: pass --zookeeper HOST:PORT or set WALTZ_ZOOKEEPER", 2
        )
    try:
        targets = [StorageTarget.parse(value) for value in args.storage]
        segment_bytes = parse_size(args.segment_size)
        if segment_bytes < 4096:
            raise ValueError("--segment-size must be at least 4096 bytes")
        if args.replicas is not None and args.replicas < 1:
            raise ValueError("--replicas must be at least 1")
        if not targets:
            raise ValueError("name the new cluster's storage nodes: --storage HOST:PORT=DIR")
        root = ClusterPaths.of(args.root).root
    except (BackupError, ValueError) as e:
        return _error("restore", str(e), 2)
    say = _say(args)
    try:
        zk = _connect(args)
    except (ClusterError, ValueError) as e:
        return _error("restore", str(e), 2)
    try:
        check_zookeeper_target(zk, root)
        plan = plan_restore(
            args.path,
            targets,
            name=args.name,
            num_replicas=args.replicas,
            key=args.key,
            progress=say,
        )
        if args.dry_run:
            written = {
                t.directory: sorted(plan.assignment.storages[t.address]) for t in plan.targets
            }
        else:
            written = restore(plan, zk, root, segment_bytes=segment_bytes, progress=say).written
    except (BackupError, ClusterError, OSError) as e:
        text = str(e)
        if "nothing was restored" not in text:
            text += " (nothing was restored)"
        return _error("restore", text, 1)
    except NoAuthError:
        return _error(
            "restore",
            f"ZooKeeper refused to create {root}: pass --zk-auth-file or --zk-tls-* with a "
            f"credential that may write there (nothing was restored)",
            1,
        )
    finally:
        close(zk)
    m = plan.manifest
    doc = {
        "dry_run": args.dry_run,
        "root": root,
        "name": plan.name,
        "key": str(plan.key),
        "replicas": plan.num_replicas,
        "storages": {
            t.address: {"directory": t.directory, "partitions": written[t.directory]}
            for t in plan.targets
        },
        "partitions": {
            str(p): [b.first, b.high_water_mark] for p, b in sorted(m.partitions.items())
        },
    }
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    verb = "would restore" if args.dry_run else "restored"
    print(
        f"{verb} {plan.records} records of {m.source.name!r} as cluster {plan.name!r} at "
        f"{root} ({m.source.num_partitions} partitions x {plan.num_replicas} replicas, "
        f"key {plan.key})"
    )
    for t in plan.targets:
        print(f"  {t.address}: {t.directory} (partitions {written[t.directory]})")
    if not args.dry_run:
        print(
            "start a storage node on each directory, listening on its address, then the "
            "servers; applications resume from their own high-water marks"
        )
    return 0
