"""The bodies of ``waltz cluster``'s commands on the cluster's policies: which client
identities may read or append (``access``, ``grant``, ``revoke``, ``open-access``) and
how much of each partition's log is kept (``retention``, ``truncate-before``)."""

from __future__ import annotations

import argparse
import json

from kazoo.client import KazooClient

from waltz_client.cluster.partition_ranges import parse_partition_ranges
from waltz_client.runtime.settings import parse_size

from . import admin
from .access import AccessPolicy
from .retention import RetentionPolicy, RetentionRule, parse_duration


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
