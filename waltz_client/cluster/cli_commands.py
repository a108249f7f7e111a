"""The bodies of ``waltz cluster``'s commands on the cluster itself: create and secure
it, show and list it, change its storage nodes and partitions' replicas, delete it.

Each takes the connected ZooKeeper client and the parsed arguments and returns the exit
code; ``cli`` builds the parsers and connects."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from kazoo.client import KazooClient
from kazoo.security import Id

from waltz_client.cluster.partition_ranges import format_partition_ranges, parse_partition_ranges

from . import admin
from .acl import client_ids_acl_of, credential_from_setting, metadata_acl, parse_writer
from .cli_replace import replacement_lines, replacements_doc
from .errors import ClusterError
from .metadata import ReplicaAssignment
from .paths import ClusterPaths
from .placement import quorum
from .replace_storage import read_replacements
from .secure import describe_acl, secure_cluster


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
    replacements, _ = read_replacements(zk, args.root)
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
                "replacements": replacements_doc(replacements),
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
    for line in replacement_lines(replacements):
        print(line)
    print("\nservers")
    _table(
        ["server", "endpoint", "http"],
        [(sid, r.endpoint, r.http_port) for sid, r in st.servers.items()] or [("-", "-", "-")],
    )
    for problem in st.problems:
        print(f"PROBLEM: {problem}")
    return 0 if not st.problems else 1


def _table(header: list[str], rows: Sequence[tuple[object, ...]]) -> None:
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


def cmd_add_partitions(zk: KazooClient, args: argparse.Namespace) -> int:
    if args.to < 1:
        raise ClusterError(f"--to must be a partition count of at least 1, got {args.to}")
    grown = admin.add_partitions(zk, args.root, args.to)
    new = list(range(grown.before, grown.params.num_partitions))
    if args.json:
        _print_json(
            {
                "grown": grown.grown,
                "before": grown.before,
                "partitions": grown.params.num_partitions,
                "new": {p: grown.assignment.replicas_of(p) for p in new},
            }
        )
    elif not grown.grown:
        print(f"the cluster already has {grown.before} partitions: nothing to do")
    else:
        print(
            f"grew from {grown.before} to {grown.params.num_partitions} partitions; "
            "storage nodes, servers and clients take the new ones as they see the count"
        )
        _table(["address", "group", "partitions"], _assignment_rows(grown.assignment))
    return 0


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
