"""``waltz cluster ...``: create, inspect and change a cluster's metadata in ZooKeeper.

This module builds each command's parser and runs it on a ZooKeeper connection; the
commands' bodies are in ``cli_commands`` (the cluster itself) and ``cli_policies``
(client access and retention)."""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import Callable
from typing import TypeAlias

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from waltz_client.runtime.settings import zookeeper_address
from waltz_client.runtime.tls import TlsFiles

from .acl import adopt_cluster_acl, credential_from_setting
from .cli_commands import (
    check_create_is_secured,
    cmd_add_partitions,
    cmd_add_storage,
    cmd_assign,
    cmd_create,
    cmd_delete,
    cmd_key,
    cmd_list,
    cmd_remove_storage,
    cmd_secure,
    cmd_show,
    cmd_unassign,
)
from .cli_policies import (
    cmd_access,
    cmd_grant,
    cmd_open_access,
    cmd_retention,
    cmd_revoke,
    cmd_truncate_before,
)
from .cli_replace import cmd_replace_storage
from .errors import ClusterError
from .paths import ClusterPaths
from .zk import close, connect

DEFAULT_ROOT = "/waltz"

Command = Callable[[KazooClient, argparse.Namespace], int]
# a parser's subcommands (``waltz``'s groups, ``waltz cluster``'s commands)
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def register(groups: Subparsers) -> None:
    cluster = groups.add_parser("cluster", help="cluster metadata in ZooKeeper")
    cmds = cluster.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_create(cmds)
    _add_secure(cmds)
    _add_inspection(cmds)
    _add_storage_commands(cmds)
    _add_access_commands(cmds)
    _add_retention_commands(cmds)
    _add_delete(cmds)


# -- the parsers -----------------------------------------------------------------


def _command(
    cmds: Subparsers, name: str, help_: str, func: Command, needs_root: bool = True
) -> argparse.ArgumentParser:
    """A subcommand with the connection flags every one takes, running ``func``."""
    p = cmds.add_parser(name, help=help_)
    _add_connection_flags(p, needs_root)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=lambda args: _run(args, func))
    return p


def _add_connection_flags(p: argparse.ArgumentParser, needs_root: bool) -> None:
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


def _add_create(cmds: Subparsers) -> None:
    p = _command(cmds, "create", "create a cluster (idempotent)", cmd_create)
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


def _add_secure(cmds: Subparsers) -> None:
    p = _command(
        cmds,
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


def _add_inspection(cmds: Subparsers) -> None:
    """``show``, ``list`` and ``key``."""
    _command(cmds, "show", "parameters, assignment, partition metadata, servers, owners", cmd_show)
    p = _command(cmds, "list", "list the clusters under a znode", cmd_list, needs_root=False)
    p.add_argument("--under", default="/", help="where to look (default /)")
    _command(cmds, "key", "print the cluster key", cmd_key)


def _add_storage_commands(cmds: Subparsers) -> None:
    """``add-storage``, ``add-partitions``, ``remove-storage``, ``assign``, ``unassign``."""
    p = _command(cmds, "add-storage", "add a storage node", cmd_add_storage)
    p.add_argument("address", metavar="HOST:PORT")
    p.add_argument("--group", type=int, default=0, help="failure domain (default 0)")
    p.add_argument("--partitions", default="", help="partitions it holds, e.g. 0-6,9")

    p = _command(
        cmds,
        "add-partitions",
        "grow the cluster's partitions online (never fewer)",
        cmd_add_partitions,
    )
    p.add_argument(
        "--to", type=int, required=True, metavar="N", help="the partition count to grow to"
    )

    p = _command(
        cmds,
        "remove-storage",
        "remove a storage node (refused below the replica count)",
        cmd_remove_storage,
    )
    p.add_argument("address", metavar="HOST:PORT")

    p = _command(
        cmds,
        "replace-storage",
        "move a lost storage node's replicas to the other nodes, then remove it",
        cmd_replace_storage,
    )
    p.add_argument("address", metavar="HOST:PORT")
    p.add_argument(
        "--wait",
        action="store_true",
        help="repeat the steps until the node has left (new replicas copied in first)",
    )
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds --wait waits (default 600)"
    )
    p.add_argument("--reason", default="", help="why, for the record `show` prints")

    for name, func, help_ in (
        ("assign", cmd_assign, "assign partitions to a storage node"),
        ("unassign", cmd_unassign, "unassign partitions from a node"),
    ):
        p = _command(cmds, name, help_, func)
        p.add_argument("address", metavar="HOST:PORT")
        p.add_argument("partitions", help="partition IDs and ranges, e.g. 0-6,9")


def _add_access_commands(cmds: Subparsers) -> None:
    """``access``, ``grant``, ``revoke`` and ``open-access``."""
    _command(cmds, "access", "show which client identities may read or append", cmd_access)
    for name, func, help_ in (
        ("grant", cmd_grant, "let a client identity (pattern) read and/or append partitions"),
        ("revoke", cmd_revoke, "take a client identity (pattern) off partitions' rules"),
    ):
        p = _command(cmds, name, help_, func)
        p.add_argument("identity", help="certificate identity or shell pattern, e.g. audit-*")
        _access_targets(p)
        p.add_argument("--read", action="store_true", help="reading data (and the feed)")
        p.add_argument("--append", action="store_true", help="appending (and the feed)")
    p = _command(
        cmds,
        "open-access",
        "remove partitions' rules: open to every client (or to the default rule)",
        cmd_open_access,
    )
    _access_targets(p)


def _access_targets(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--partitions",
        required=True,
        metavar="IDS|all|default",
        help="partition IDs and ranges (0-6,9), all, or default: the rule for partitions "
        "without their own",
    )


def _add_retention_commands(cmds: Subparsers) -> None:
    """``retention`` and ``truncate-before``."""
    p = _command(
        cmds,
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
    p = _command(
        cmds,
        "truncate-before",
        "let a partition's log go below a transaction the application has checkpointed",
        cmd_truncate_before,
    )
    p.add_argument("partition", type=int)
    p.add_argument("transaction_id", type=int, metavar="TXID")


def _add_delete(cmds: Subparsers) -> None:
    p = _command(cmds, "delete", "delete the cluster's metadata (guarded)", cmd_delete)
    p.add_argument(
        "--confirm", required=True, metavar="NAME", help="the cluster's name, to confirm"
    )
    p.add_argument("--force", action="store_true", help="even while servers are registered")


# -- running a command -----------------------------------------------------------


def _run(args: argparse.Namespace, func: Command) -> int:
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
