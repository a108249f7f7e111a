"""``waltz cluster secure``: the metadata ACL on every node of a cluster created open,
while it serves (docs/security.md#securing-an-existing-cluster).

The safe order: every server (and admin) first gets the credential (a session that adds
digest auth can still write open nodes), then this sets the ACL, node by node. Servers
publish who they are to ZooKeeper in their registration (``zk_auth``), so a live server
that would lose the right to write is found before anything changes. The cluster node
is changed first: the nodes servers create from then on copy its ACL
(``acl.readopt_open_acl``). Nodes created meanwhile with the old ACL are caught by walking
the tree again, a little later, until a pass changes nothing.

The decisions (which node needs which ACL, which server is not a writer) are pure
functions; ``secure_cluster`` is the ZooKeeper shell around them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError
from kazoo.security import ACL

from .acl import acl_writers, principal
from .errors import ClusterError
from .metadata import MetadataError, ServerRegistration
from .paths import ClusterPaths

# A node created with the old ACL by a server that read the cluster ACL just before it
# changed shows up within a ZooKeeper round trip or two: the confirming pass waits this.
SETTLE_SECONDS = 1.0
MAX_PASSES = 20


@dataclass(frozen=True)
class AclChange:
    path: str
    before: tuple[ACL, ...]
    after: tuple[ACL, ...]
    version: int  # the ACL version read, so that a concurrent change is not overwritten


@dataclass
class SecureReport:
    root: str
    dry_run: bool
    nodes: int = 0  # nodes seen in the last pass
    changed: list[AclChange] = field(default_factory=list)
    passes: int = 0
    writers: list[str] = field(default_factory=list)
    servers: dict[str, list[str]] = field(default_factory=dict)  # live server -> its ids
    not_writers: dict[str, str] = field(default_factory=dict)  # server -> why (with force)


def same_acl(a: Sequence[ACL], b: Sequence[ACL]) -> bool:
    """Equal as sets of (scheme, id, permissions): ZooKeeper keeps the order given."""

    def key(x: ACL) -> tuple[str, str, int]:
        return (x.id.scheme, x.id.id, x.perms)

    return sorted(map(key, a)) == sorted(map(key, b))


def wanted_acl(
    paths: ClusterPaths, path: str, metadata: Sequence[ACL], client_ids: Sequence[ACL]
) -> tuple[ACL, ...]:
    """The ACL CreateCluster would have given ``path``: anyone may also create and delete
    children of ``client-ids`` (clients allocate their IDs there)."""
    return tuple(client_ids if path == paths.client_ids else metadata)


def plan_changes(
    nodes: Mapping[str, tuple[Sequence[ACL], int]],
    paths: ClusterPaths,
    metadata: Sequence[ACL],
    client_ids: Sequence[ACL],
) -> list[AclChange]:
    """The nodes (path -> (ACL, ACL version)) whose ACL is not the wanted one; the cluster
    node first (servers copy it onto the nodes they create), then in path order."""
    changes = []
    for path, (acl, version) in nodes.items():
        wanted = wanted_acl(paths, path, metadata, client_ids)
        if not same_acl(acl, wanted):
            changes.append(AclChange(path, tuple(acl), wanted, version))
    changes.sort(key=lambda c: (c.path != paths.cluster, c.path))
    return changes


def servers_not_writers(
    registrations: Mapping[str, ServerRegistration | None], writers: set[str]
) -> dict[str, str]:
    """Live servers that would lose the right to write the metadata, and why. ``None``: a
    registration that does not decode."""
    out = {}
    for server_id, reg in sorted(registrations.items()):
        if reg is None:
            out[server_id] = "its registration does not decode"
        elif not reg.zk_auth:
            out[server_id] = (
                "it authenticates to ZooKeeper with nothing (no zk_auth_file), or predates "
                "publishing it"
            )
        elif not writers.intersection(map(principal, reg.zk_auth)):
            out[server_id] = f"it authenticates as {', '.join(reg.zk_auth)}, none of them a writer"
    return out


def describe_acl(acl: Sequence[ACL]) -> str:
    return ", ".join(f"{principal(f'{a.id.scheme}:{a.id.id}')} {'|'.join(a.acl_list)}" for a in acl)


def read_acls(zk: KazooClient, root: str) -> dict[str, tuple[list[ACL], int]]:
    """path -> (ACL, ACL version) of ``root`` and every node below it (nodes that vanish
    while walking are left out)."""
    out: dict[str, tuple[list[ACL], int]] = {}
    stack = [root]
    while stack:
        path = stack.pop()
        try:
            acl, stat = zk.get_acls(path)
            children = zk.get_children(path)
        except NoNodeError:
            continue
        out[path] = (list(acl), stat.aversion)
        stack.extend(f"{path}/{c}" for c in children)
    return out


def read_registrations(
    zk: KazooClient, paths: ClusterPaths
) -> dict[str, ServerRegistration | None]:
    out: dict[str, ServerRegistration | None] = {}
    try:
        children = zk.get_children(paths.servers)
    except NoNodeError:
        return out
    for server_id in children:
        try:
            data, _ = zk.get(paths.server(server_id))
        except NoNodeError:
            continue  # gone: its session ended
        try:
            out[server_id] = ServerRegistration.decode(data)
        except MetadataError:
            out[server_id] = None
    return out


def secure_cluster(
    zk: KazooClient,
    root: str,
    metadata: Sequence[ACL],
    client_ids: Sequence[ACL],
    *,
    dry_run: bool = False,
    force: bool = False,
    settle: float = SETTLE_SECONDS,
    max_passes: int = MAX_PASSES,
    progress: Callable[[str], None] = lambda message: None,
) -> SecureReport:
    """Give every node under ``root`` its metadata ACL (``client-ids``: ``client_ids``).
    Refuses (ClusterError, nothing changed) when a live server is not one of the new
    ACL's writers, unless ``force``. ``zk`` must be allowed to change the ACLs: any
    session may on open nodes; on secured ones, a writer."""
    paths = ClusterPaths.of(root)
    if not zk.exists(paths.cluster):
        raise ClusterError(f"no cluster at {paths.root} (nothing at {paths.cluster})")
    writers = acl_writers(metadata)
    if not writers:
        raise ClusterError("the new ACL names no writer: give --zk-auth-file or --writer")
    report = SecureReport(paths.root, dry_run, writers=sorted(writers))
    registrations = read_registrations(zk, paths)
    report.servers = {s: list(r.zk_auth) if r else [] for s, r in registrations.items()}
    report.not_writers = servers_not_writers(registrations, writers)
    if report.not_writers and not force:
        lines = "; ".join(f"{s}: {why}" for s, why in report.not_writers.items())
        raise ClusterError(
            f"refused, nothing changed: {len(report.not_writers)} live server(s) would lose "
            f"the right to write the metadata ({lines}). Restart each with the credential "
            f"(zk_auth_file, WALTZ_SERVER_ZK_AUTH_FILE) or a writer's certificate, then run "
            f"this again (--force skips this check)"
        )
    for server_id, why in report.not_writers.items():
        progress(f"WARNING: {server_id} will get NoAuth on its next write: {why}")
    while True:
        nodes = read_acls(zk, paths.root)
        report.nodes = len(nodes)
        report.passes += 1
        changes = plan_changes(nodes, paths, metadata, client_ids)
        if dry_run:
            report.changed = changes
            return report
        done = 0
        for change in changes:
            try:
                zk.set_acls(change.path, list(change.after), version=change.version)
            except (NoNodeError, BadVersionError):
                continue  # gone, or changed meanwhile: the next pass looks again
            report.changed.append(change)
            done += 1
        progress(f"pass {report.passes}: {done} of {len(nodes)} nodes changed")
        if not changes:
            return report
        if report.passes >= max_passes:
            raise ClusterError(
                f"nodes under {paths.root} still had another ACL after {max_passes} passes "
                f"(the last: {', '.join(c.path for c in changes[:5])}); something keeps "
                f"creating them with another ACL: a server or admin of an older version?"
            )
        time.sleep(settle)
