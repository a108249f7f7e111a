"""``waltz cluster ...``: create, inspect and change a cluster's metadata in ZooKeeper."""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import Id

from waltz_client.cluster.partition_ranges import format_partition_ranges, parse_partition_ranges
from waltz_client.runtime.settings import parse_size, zookeeper_address
from waltz_client.runtime.tls import TlsFiles

from . import admin
from .access import AccessPolicy
from .acl import (
    adopt_cluster_acl,
    client_ids_acl_of,
    credential_from_setting,
    metadata_acl,
    parse_writer,
)
from .errors import ClusterError
from .metadata import ReplicaAssignment
from .paths import ClusterPaths
from .placement import quorum
from .retention import RetentionPolicy, RetentionRule, parse_duration
from .secure import describe_acl, secure_cluster
from .zk import close, connect

DEFAULT_ROOT = "/waltz"


def register(groups: argparse._SubParsersAction) -> None:
    cluster = groups.add_parser("cluster", help="cluster metadata in ZooKeeper")
    cmds = cluster.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_: str, func: Callable, needs_root: bool = True):
        p = cmds.add_parser(name, help=help_)
        p.add_argument(
            "--zookeeper",
            "-z",
            default=os.environ.get("WALTZ_ZOOKEEPER"),
            help="ZooKeeper connect string (env WALTZ_ZOOKEEPER)",
        )
        if needs_root:
            p.add_argument(
                "--root",
                default=os.environ.get("WALTZ_ROOT", DEFAULT_ROOT),
                help=f"cluster root znode (env WALTZ_ROOT, default {DEFAULT_ROOT})",
            )
        p.add_argument(
            "--zk-auth-file",
            default=os.environ.get("WALTZ_ZK_AUTH_FILE", ""),
            help="file holding user:password of the cluster's ZooKeeper credential; create "
            "writes ACLs with it, other commands authenticate (env WALTZ_ZK_AUTH_FILE)",
        )
        for part, what in (("cert", "certificate"), ("key", "private key"), ("ca", "CA bundle")):
            p.add_argument(
                f"--zk-tls-{part}",
                default=os.environ.get(f"WALTZ_ZK_TLS_{part.upper()}", ""),
                help=f"PEM {what} for ZooKeeper's TLS port (env WALTZ_ZK_TLS_{part.upper()})",
            )
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=lambda args: _run(args, func))
        return p

    p = command("create", "create a cluster (idempotent)", cmd_create)
    p.add_argument("--name", required=True, help="cluster name")
    p.add_argument("--partitions", type=int, required=True, help="number of partitions")
    p.add_argument("--replicas", type=int, required=True, help="replicas per partition")
    p.add_argument(
        "--storage",
        action="append",
        required=True,
        metavar="HOST:PORT[@GROUP]",
        help="a storage node (repeat, or comma-separate); @GROUP is its failure domain",
    )
    p.add_argument("--key", type=uuid.UUID, help="cluster key (default: a new random UUID)")
    p.add_argument(
        "--zk-acl",
        action="append",
        default=[],
        metavar="SCHEME:ID",
        help="also let this ZooKeeper identity write the metadata (repeat): "
        "x509:<certificate subject DN> or sasl:<principal>",
    )
    p.add_argument(
        "--zk-acl-cert",
        action="append",
        default=[],
        metavar="PEM",
        help="let the holder of this certificate write the metadata over ZooKeeper's TLS "
        "port (repeat; its subject DN as an x509 ACL)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="create the metadata with ZooKeeper's open ACL: anyone who reaches ZooKeeper "
        "may change it (default: refused without --zk-auth-file or a writer)",
    )

    p = command(
        "secure",
        "put the metadata ACL on every node of a cluster created open, while it serves",
        cmd_secure,
    )
    p.add_argument(
        "--writer",
        "--zk-acl",
        dest="writers",
        action="append",
        default=[],
        metavar="SCHEME:ID",
        help="also let this ZooKeeper identity write the metadata (repeat): "
        "x509:<certificate subject DN> or sasl:<principal>",
    )
    p.add_argument(
        "--writer-cert",
        "--zk-acl-cert",
        dest="writer_certs",
        action="append",
        default=[],
        metavar="PEM",
        help="let the holder of this certificate write the metadata (repeat)",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would change; change nothing")
    p.add_argument(
        "--force",
        action="store_true",
        help="even while a live server does not say it is a writer (it will get NoAuth)",
    )

    command("show", "parameters, assignment, partition metadata, servers, owners", cmd_show)
    p = command("list", "list the clusters under a znode", cmd_list, needs_root=False)
    p.add_argument("--under", default="/", help="where to look (default /)")
    command("key", "print the cluster key", cmd_key)

    p = command("add-storage", "add a storage node", cmd_add_storage)
    p.add_argument("address", metavar="HOST:PORT")
    p.add_argument("--group", type=int, default=0, help="failure domain (default 0)")
    p.add_argument("--partitions", default="", help="partitions it holds, e.g. 0-6,9")

    p = command(
        "remove-storage",
        "remove a storage node (refused below the replica count)",
        cmd_remove_storage,
    )
    p.add_argument("address", metavar="HOST:PORT")

    for name, func, help_ in (
        ("assign", cmd_assign, "assign partitions to a storage node"),
        ("unassign", cmd_unassign, "unassign partitions from a node"),
    ):
        p = command(name, help_, func)
        p.add_argument("address", metavar="HOST:PORT")
        p.add_argument("partitions", help="partition IDs and ranges, e.g. 0-6,9")

    command("access", "show which client identities may read or append", cmd_access)
    for name, func, help_ in (
        ("grant", cmd_grant, "let a client identity (pattern) read and/or append partitions"),
        ("revoke", cmd_revoke, "take a client identity (pattern) off partitions' rules"),
    ):
        p = command(name, help_, func)
        p.add_argument("identity", help="certificate identity or shell pattern, e.g. audit-*")
        _access_targets(p)
        p.add_argument("--read", action="store_true", help="reading data (and the feed)")
        p.add_argument("--append", action="store_true", help="appending (and the feed)")
    p = command(
        "open-access",
        "remove partitions' rules: open to every client (or to the default rule)",
        cmd_open_access,
    )
    _access_targets(p)

    p = command(
        "retention",
        "show how much of each partition's log is kept; with options, change it",
        cmd_retention,
    )
    p.add_argument(
        "--partitions",
        metavar="IDS|all|default",
        help="what to change: partition IDs and ranges (0-6,9), all, or default",
    )
    p.add_argument("--max-age", metavar="DURATION", help="delete what is older (7d, 12h, 3600)")
    p.add_argument("--max-bytes", metavar="SIZE", help="keep about this much per replica (100GiB)")
    p.add_argument(
        "--keep-all",
        action="store_true",
        help="remove the partitions' own rule (default: keep everything again)",
    )
    p = command(
        "truncate-before",
        "let a partition's log go below a transaction the application has checkpointed",
        cmd_truncate_before,
    )
    p.add_argument("partition", type=int)
    p.add_argument("transaction_id", type=int, metavar="TXID")

    p = command("delete", "delete the cluster's metadata (guarded)", cmd_delete)
    p.add_argument(
        "--confirm", required=True, metavar="NAME", help="the cluster's name, to confirm"
    )
    p.add_argument("--force", action="store_true", help="even while servers are registered")


def _access_targets(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--partitions",
        required=True,
        metavar="IDS|all|default",
        help="partition IDs and ranges (0-6,9), all, or default: the rule for partitions "
        "without their own",
    )


def _run(args: argparse.Namespace, func: Callable[[KazooClient, argparse.Namespace], int]) -> int:
    if not args.zookeeper:
        print(
            "waltz cluster: error: no ZooKeeper: pass --zookeeper HOST:PORT or set WALTZ_ZOOKEEPER",
            file=sys.stderr,
        )
        return 2
    try:
        if getattr(args, "root", None) is not None:
            args.root = ClusterPaths.of(args.root).root
        try:  # a typo exits 2 instead of retrying for ever
            zookeeper_address(args.zookeeper)
        except ValueError as e:
            raise ValueError(f"--zookeeper: {e}") from None
        credential = credential_from_setting(args.zk_auth_file, "--zk-auth-file")
        if func is cmd_create:
            check_create_is_secured(args, credential is not None)
        tls = TlsFiles(args.zk_tls_cert or None, args.zk_tls_key or None, args.zk_tls_ca or None)
        if tls.enabled:
            tls.check("zk_tls", listening=False)
        zk = connect(args.zookeeper, credential=credential, tls=tls if tls.enabled else None)
    except (ClusterError, ValueError) as e:  # TlsError is a ValueError
        print(f"waltz cluster: error: {e}", file=sys.stderr)
        return 2
    try:
        if func is not cmd_create and getattr(args, "root", None) is not None:
            adopt_cluster_acl(zk, args.root)  # nodes it creates (access) get the cluster's
        return func(zk, args)
    except (ClusterError, ValueError) as e:
        print(f"waltz cluster: error: {e}", file=sys.stderr)
        return 1
    except NoAuthError:
        print(
            f"waltz cluster: error: ZooKeeper refused the change: this connection may not "
            f"write the metadata at {getattr(args, 'root', 'its root')} (pass "
            f"--zk-auth-file with the cluster's credential, or --zk-tls-* with a certificate "
            f"that is one of its writers)",
            file=sys.stderr,
        )
        return 1
    finally:
        close(zk)


def _parse_storages(values: list[str]) -> tuple[list[str], dict[str, int]]:
    storages: list[str] = []
    groups: dict[str, int] = {}
    for value in values:
        for item in value.split(","):
            address, _, group = item.strip().partition("@")
            storages.append(address)
            if group:
                if not group.isdigit():
                    raise ClusterError(f"storage {item!r}: group must be a number")
                groups[address] = int(group)
    return storages, groups


def _print_json(doc: object) -> None:
    print(json.dumps(doc, indent=2, sort_keys=True))


def check_create_is_secured(args: argparse.Namespace, has_credential: bool) -> None:
    """Metadata anyone may write only when asked for (``--insecure``): whoever can write
    it can move partitions, change the replica assignment and the access policy."""
    writers = bool(args.zk_acl or args.zk_acl_cert)
    if args.insecure and (has_credential or writers):
        raise ValueError("--insecure: not with --zk-auth-file, --zk-acl or --zk-acl-cert")
    if not (args.insecure or has_credential or writers):
        raise ValueError(
            "refusing to create metadata that anyone who reaches ZooKeeper may change: "
            "give --zk-auth-file FILE (user:password on its first line; the servers and "
            "admins use the same file), --zk-acl SCHEME:ID or --zk-acl-cert PEM, or "
            "--insecure for an open ACL (waltz cluster secure adds one later)"
        )


def _x509_writer(cert_path: str) -> Id:
    """A certificate's ZooKeeper identity; reading it takes ``cryptography``, which only
    the daemons' extra installs."""
    try:
        from .identities import x509_writer
    except ImportError as e:
        raise ClusterError(
            f"reading {cert_path} for an x509 ACL needs the cryptography package "
            f"(pip install 'waltz[daemons]'): {e}"
        ) from None
    return x509_writer(cert_path)


def cmd_create(zk: KazooClient, args: argparse.Namespace) -> int:
    storages, groups = _parse_storages(args.storage)
    writers = [parse_writer(w) for w in args.zk_acl]
    writers += [_x509_writer(path) for path in args.zk_acl_cert]
    if writers:
        credential = credential_from_setting(args.zk_auth_file, "--zk-auth-file")
        zk.default_acl = metadata_acl(credential, writers)
    result = admin.create_cluster(
        zk, args.root, args.name, args.partitions, args.replicas, storages, groups, args.key
    )
    if args.json:
        _print_json(
            {
                "created": result.created,
                "root": args.root,
                "key": str(result.params.key),
                "name": result.params.name,
            }
        )
    else:
        verb = "created" if result.created else "already exists, unchanged:"
        print(
            f"cluster {result.params.name!r} {verb} at {args.root}: "
            f"{result.params.num_partitions} partitions x {result.params.num_replicas} "
            f"replicas, key {result.params.key}"
        )
    return 0


def cmd_secure(zk: KazooClient, args: argparse.Namespace) -> int:
    credential = credential_from_setting(args.zk_auth_file, "--zk-auth-file")
    if credential is None:
        raise ValueError(
            "--zk-auth-file (or WALTZ_ZK_AUTH_FILE) is required: the credential that "
            "writes the metadata from now on, which the servers must already hold"
        )
    writers = [parse_writer(w) for w in args.writers]
    writers += [_x509_writer(path) for path in args.writer_certs]
    acl = metadata_acl(credential, writers)
    zk.default_acl = acl  # for nodes this session creates, and client_ids_acl_of
    client_ids = client_ids_acl_of(zk) or acl

    def say(message: str) -> None:
        if not args.json:
            print(message, flush=True)

    report = secure_cluster(
        zk,
        args.root,
        acl,
        client_ids,
        dry_run=args.dry_run,
        force=args.force,
        progress=say,
    )
    if args.json:
        _print_json(
            {
                "root": report.root,
                "dry_run": report.dry_run,
                "nodes": report.nodes,
                "changed": [c.path for c in report.changed],
                "passes": report.passes,
                "writers": report.writers,
                "servers": report.servers,
                "servers_not_writers": report.not_writers,
            }
        )
        return 0
    writers_text = ", ".join(report.writers)
    if report.dry_run:
        if not report.changed:
            print(f"nothing to change: all {report.nodes} nodes under {report.root} carry the ACL")
            return 0
        print(f"would set the ACL of {len(report.changed)} of {report.nodes} nodes:")
        for c in report.changed:
            print(f"  {c.path}: {describe_acl(c.before)} -> {describe_acl(c.after)}")
        return 0
    if not report.changed:
        print(f"nothing to change: all {report.nodes} nodes under {report.root} carry the ACL")
        return 0
    print(
        f"secured {report.root}: {len(report.changed)} of {report.nodes} nodes changed in "
        f"{report.passes} passes; writers {writers_text}, anyone may read; "
        f"{len(report.servers) - len(report.not_writers)} of {len(report.servers)} live "
        f"server(s) are writers"
    )
    return 0


def _assignment_rows(a: ReplicaAssignment) -> list[tuple[str, int, str]]:
    return [
        (s, a.groups.get(s, 0), format_partition_ranges(ps) or "-")
        for s, ps in sorted(a.storages.items())
    ]


def cmd_show(zk: KazooClient, args: argparse.Namespace) -> int:
    st = admin.read_cluster(zk, args.root)
    if args.json:
        _print_json(
            {
                "root": st.root,
                "name": st.params.name,
                "key": str(st.params.key),
                "num_partitions": st.params.num_partitions,
                "num_replicas": st.params.num_replicas,
                "storages": {
                    s: {"group": g, "partitions": sorted(st.assignment.storages[s])}
                    for s, g, _ in _assignment_rows(st.assignment)
                },
                "partitions": {
                    str(p): {
                        "generation": m.generation,
                        "session_id": m.session_id,
                        "replicas": {
                            s: {
                                "session_id": r.session_id,
                                "closing_high_water_mark": r.closing_high_water_mark,
                            }
                            for s, r in m.replicas.items()
                        },
                        "members": st.members(p),
                        "log_start": m.log_start,
                        "owner": st.ownership.partitions.get(p, (None, 0))[0],
                        "owner_generation": st.ownership.partitions.get(p, (None, 0))[1],
                    }
                    for p, m in st.partitions.items()
                },
                "servers": {
                    sid: {"host": r.host, "port": r.port, "http_port": r.http_port}
                    for sid, r in st.servers.items()
                },
                "still_serving": st.still_serving(),
                "problems": st.problems,
            }
        )
        return 0 if not st.problems else 1
    p = st.params
    print(f"cluster {p.name!r} at {st.root}")
    print(
        f"  key {p.key}, {p.num_partitions} partitions, {p.num_replicas} replicas "
        f"(quorum {quorum(p.num_replicas)})"
    )
    print("\nstorage nodes")
    _table(["address", "group", "partitions"], _assignment_rows(st.assignment))
    print("\npartitions")
    rows = []
    for pid, m in sorted(st.partitions.items()):
        owner, gen = st.ownership.partitions.get(pid, (None, 0))
        rows.append(
            (
                pid,
                ",".join(st.assignment.replicas_of(pid)),
                ",".join(st.members(pid)) or "-",
                owner or "-",
                gen,
                m.generation,
                m.session_id,
            )
        )
    _table(
        ["partition", "replicas", "members", "owner", "owner gen", "generation", "session"], rows
    )
    kept = st.still_serving()
    if kept:
        print("\nstill serving removed partitions for a vote (do not delete their data yet)")
        _table(
            ["address", "partitions"],
            [(a, format_partition_ranges(ps)) for a, ps in kept.items()],
        )
    print("\nservers")
    _table(
        ["server", "endpoint", "http"],
        [(sid, r.endpoint, r.http_port) for sid, r in st.servers.items()] or [("-", "-", "-")],
    )
    for problem in st.problems:
        print(f"PROBLEM: {problem}")
    return 0 if not st.problems else 1


def _table(header: list[str], rows: list[tuple]) -> None:
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for r in cells:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def cmd_list(zk: KazooClient, args: argparse.Namespace) -> int:
    found = []

    def walk(path: str, depth: int) -> None:
        try:
            children = zk.get_children(path)
        except Exception:
            return
        if "cluster" in children and path != "/":
            try:
                params = admin.read_params(zk, path)
                found.append((path, params.name, params.num_partitions, params.num_replicas))
            except ClusterError:
                pass
            return
        if depth < 4:
            for c in sorted(children):
                if path == "/" and c == "zookeeper":
                    continue
                walk(f"{path.rstrip('/')}/{c}", depth + 1)

    walk(args.under if args.under == "/" else ClusterPaths.of(args.under).root, 0)
    if args.json:
        _print_json(
            [{"root": r, "name": n, "num_partitions": p, "num_replicas": k} for r, n, p, k in found]
        )
    elif found:
        _table(["root", "name", "partitions", "replicas"], found)
    else:
        print(f"no Waltz clusters under {args.under}")
    return 0


def cmd_key(zk: KazooClient, args: argparse.Namespace) -> int:
    params = admin.read_params(zk, args.root)
    print(json.dumps({"key": str(params.key)}) if args.json else params.key)
    return 0


def _report(args: argparse.Namespace, a: ReplicaAssignment, what: str) -> int:
    if args.json:
        _print_json({s: sorted(ps) for s, ps in a.storages.items()})
    else:
        print(what)
        _table(["address", "group", "partitions"], _assignment_rows(a))
    return 0


def cmd_add_storage(zk: KazooClient, args: argparse.Namespace) -> int:
    parts = parse_partition_ranges(args.partitions) if args.partitions else set()
    a = admin.add_storage(zk, args.root, args.address, args.group, parts)
    return _report(args, a, f"added {args.address}")


def cmd_remove_storage(zk: KazooClient, args: argparse.Namespace) -> int:
    return _report(
        args, admin.remove_storage(zk, args.root, args.address), f"removed {args.address}"
    )


def cmd_assign(zk: KazooClient, args: argparse.Namespace) -> int:
    a = admin.assign_partitions(
        zk, args.root, args.address, parse_partition_ranges(args.partitions)
    )
    return _report(args, a, f"assigned {args.partitions} to {args.address}")


def cmd_unassign(zk: KazooClient, args: argparse.Namespace) -> int:
    a = admin.unassign_partitions(
        zk, args.root, args.address, parse_partition_ranges(args.partitions)
    )
    return _report(args, a, f"unassigned {args.partitions} from {args.address}")


def cmd_delete(zk: KazooClient, args: argparse.Namespace) -> int:
    admin.delete_cluster(zk, args.root, args.confirm, args.force)
    print(json.dumps({"deleted": args.root}) if args.json else f"deleted {args.root}")
    return 0


def _targets(zk: KazooClient, args: argparse.Namespace) -> list[int | None]:
    if args.partitions.strip() == "default":
        return [None]
    params = admin.read_params(zk, args.root)
    return sorted(parse_partition_ranges(args.partitions, params.num_partitions))


def _print_access(args: argparse.Namespace, policy: AccessPolicy) -> int:
    if args.json:
        print(json.dumps(json.loads(policy.encode()), indent=2, sort_keys=True))
    else:
        print("\n".join(policy.describe()))
    return 0


def cmd_access(zk: KazooClient, args: argparse.Namespace) -> int:
    admin.read_params(zk, args.root)  # a missing cluster says so
    policy, _ = admin.read_access(zk, args.root)
    return _print_access(args, policy)


def _change_access(zk: KazooClient, args: argparse.Namespace, grant: bool) -> int:
    if not (args.read or args.append):
        raise ValueError("say what to change: --read, --append or both")
    targets = _targets(zk, args)
    if grant:
        policy = admin.update_access(
            zk, args.root, lambda p: p.granted(targets, args.identity, args.read, args.append)
        )
    else:
        policy = admin.update_access(
            zk, args.root, lambda p: p.revoked(targets, args.identity, args.read, args.append)
        )
    return _print_access(args, policy)


def cmd_grant(zk: KazooClient, args: argparse.Namespace) -> int:
    return _change_access(zk, args, grant=True)


def cmd_revoke(zk: KazooClient, args: argparse.Namespace) -> int:
    return _change_access(zk, args, grant=False)


def cmd_open_access(zk: KazooClient, args: argparse.Namespace) -> int:
    targets = _targets(zk, args)
    return _print_access(args, admin.update_access(zk, args.root, lambda p: p.cleared(targets)))


def _print_retention(zk: KazooClient, args: argparse.Namespace, policy: RetentionPolicy) -> int:
    starts = {p: m.log_start for p, m in admin.read_cluster(zk, args.root).partitions.items()}
    if args.json:
        doc = json.loads(policy.encode())
        doc["log_start"] = {str(p): start for p, start in sorted(starts.items())}
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    print("\n".join(policy.describe()))
    moved = {p: start for p, start in starts.items() if start}
    for p, start in sorted(moved.items()):
        print(f"partition {p}: log starts at transaction {start}")
    if not moved:
        print("every partition's log starts at transaction 0")
    return 0


def cmd_retention(zk: KazooClient, args: argparse.Namespace) -> int:
    changing = args.max_age is not None or args.max_bytes is not None or args.keep_all
    if not changing:
        if args.partitions:
            raise ValueError("say what to change: --max-age, --max-bytes or --keep-all")
        return _print_retention(zk, args, admin.read_retention(zk, args.root)[0])
    if not args.partitions:
        raise ValueError("say which partitions: --partitions IDS, all or default")
    if args.keep_all and (args.max_age is not None or args.max_bytes is not None):
        raise ValueError("--keep-all removes the rule: give it without --max-age/--max-bytes")
    targets = _targets(zk, args)
    if args.keep_all:
        policy = admin.update_retention(zk, args.root, lambda p: p.without_rule(targets))
        return _print_retention(zk, args, policy)
    rule = RetentionRule(
        None if args.max_age in (None, "none") else parse_duration(args.max_age),
        None if args.max_bytes in (None, "none") else parse_size(args.max_bytes),
    )
    policy = admin.update_retention(zk, args.root, lambda p: p.with_rule(targets, rule))
    return _print_retention(zk, args, policy)


def cmd_truncate_before(zk: KazooClient, args: argparse.Namespace) -> int:
    params = admin.read_params(zk, args.root)
    if not 0 <= args.partition < params.num_partitions:
        raise ValueError(f"partition {args.partition} is not in 0..{params.num_partitions - 1}")
    if args.transaction_id < 0:
        raise ValueError(f"TXID must be >= 0, got {args.transaction_id}")
    policy = admin.update_retention(
        zk, args.root, lambda p: p.truncated_before(args.partition, args.transaction_id)
    )
    return _print_retention(zk, args, policy)
