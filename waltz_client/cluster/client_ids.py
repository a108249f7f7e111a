"""Client IDs: allocated by servers, bound to the identity that asked, within a quota per
identity, released when unused.

A client asks a server for its ID over its connection (``AllocateClientId``). The server
draws a fresh number from the cluster's counter (the sequence numbers of
``<root>/client-ids/id-`` nodes, the same counter every build has used, so IDs stay
unique across old and new allocators) and, on a mutual-TLS port, binds it to the
connection's certificate identity in one ZooKeeper transaction that also:

- creates ``<root>/client-bindings/<id>`` (data: the identity). A binding that already
  exists (bound ahead by a stranger under an older build, or by hand) makes the
  transaction fail: that number is skipped, never taken over;
- adds ``<id>`` under ``<root>/client-identities/<sha256 of the identity>`` (data: the
  identity), whose children count the identity's live IDs;
- rewrites that identity node at the version read, so two servers allocating for the
  same identity at once cannot both pass the quota check.

A binding's modification time is when it was last used: servers touch the bindings
their connections use (at most once per ``maintenance_interval``), and delete, with a
versioned delete that a touch defeats, those unused for the retention period. A released
ID is never handed out again: the counter only grows.

The decisions are the pure functions at the top; the ZooKeeper calls below them block
(run them off the event loop).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Container, Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)

from .errors import ClusterError
from .paths import ClusterPaths

MAX_CLIENT_ID = 2**31 - 1  # a ReqId field is a signed 32-bit integer
MAX_DRAW = 1000  # sequence numbers drawn in one transaction (past a run of bound IDs)
ALLOCATION_ATTEMPTS = 100  # transactions lost to races or bound IDs before giving up
MAX_MAINTENANCE_INTERVAL = 3600.0


class ClientIdRefused(ClusterError):
    """The identity may not have another client ID now (its quota is used up)."""


# --- decisions (pure) -------------------------------------------------------------------


def identity_key(identity: str) -> str:
    """The znode name of an identity: a certificate DN holds '/', ',' and '='."""
    return hashlib.sha256(identity.encode()).hexdigest()


def pick_client_id(candidates: Iterable[int], bound: Container[int]) -> int | None:
    """The first fresh sequence number that fits a ReqId and that no binding holds."""
    for candidate in candidates:
        if 0 <= candidate <= MAX_CLIENT_ID and candidate not in bound:
            return candidate
    return None


def draw_size(last: int, bound: Container[int], limit: int = MAX_DRAW) -> int:
    """How many sequence numbers to draw after ``last``, so that one draw reaches past the
    run of bound IDs that follows it (1 when none follows)."""
    n = 1
    while n < limit and last + n in bound:
        n += 1
    return n


def quota_refusal(identity: str, live: int, quota: int) -> str | None:
    """Why ``identity``, holding ``live`` client IDs, may not have another (None: it may)."""
    if live < quota:
        return None
    return (
        f"identity {identity!r} holds {live} client IDs, its quota (client_id_quota "
        f"{quota}); IDs unused for client_id_retention are released"
    )


def binding_refusal(client_id: int, identity: str, bound: str | None) -> str | None:
    """Why ``identity`` may not act as ``client_id``, bound to ``bound`` (None: no binding)."""
    if bound is None:
        return (
            f"client ID {client_id} was not allocated to identity {identity!r}; allocate one "
            f"with AllocateClientId (WaltzClient does)"
        )
    if bound != identity:
        return f"client ID {client_id} belongs to another identity"
    return None


def binding_expired(last_used: float, now: float, retention: float) -> bool:
    """A binding last used at ``last_used`` (seconds) is released at ``now``."""
    return now - last_used > retention


def maintenance_interval(retention: float) -> float:
    """How often a server touches the bindings in use and looks for unused ones: often
    enough that a binding in use is touched several times within the retention."""
    return min(MAX_MAINTENANCE_INTERVAL, retention / 4)


def touch_due(last_touched: float | None, now: float, retention: float) -> bool:
    return last_touched is None or now - last_touched >= maintenance_interval(retention)


# --- ZooKeeper (blocking) ---------------------------------------------------------------


def _sequence(node: str) -> int:
    return int(node.rsplit("-", 1)[1])


def new_client_ids(zk: KazooClient, root: str, count: int = 1) -> list[int]:
    """``count`` fresh numbers from the cluster's counter, increasing: the sequence numbers
    of ``<root>/client-ids/id-`` nodes, created and deleted (one transaction each)."""
    prefix = f"{ClusterPaths.of(root).client_ids}/id-"
    if count == 1:
        node = zk.create(prefix, b"", sequence=True)
        zk.delete(node)
        return [_sequence(node)]
    txn = zk.transaction()
    for _ in range(count):
        txn.create(prefix, b"", sequence=True)
    created = txn.commit()
    failed = [r for r in created if isinstance(r, Exception)]
    if failed:
        raise ClusterError(f"drawing {count} client IDs failed: {failed[0]!r}")
    txn = zk.transaction()
    for node in created:
        txn.delete(node)
    txn.commit()
    return sorted(_sequence(node) for node in created)


def allocate_client_id(zk: KazooClient, root: str, identity: str | None, quota: int) -> int:
    """A fresh client ID, bound to ``identity`` (None: a client without a certificate,
    nothing to bind). Raises ClientIdRefused when the identity's quota is used up."""
    if identity is None:
        return new_client_ids(zk, root)[0]
    paths = ClusterPaths.of(root)
    owner = paths.client_identity(identity_key(identity))
    name = identity.encode()
    zk.ensure_path(paths.client_bindings)
    fresh: list[int] = []  # drawn, not yet tried
    last = -1  # the last number drawn
    bound: set[int] = set()
    for _ in range(ALLOCATION_ATTEMPTS):
        try:
            _, stat = zk.get(owner)
        except NoNodeError:
            with contextlib.suppress(NodeExistsError):
                zk.create(owner, name, makepath=True)
            continue
        refusal = quota_refusal(identity, stat.numChildren, quota)
        if refusal is not None:
            raise ClientIdRefused(refusal)
        choice = pick_client_id(fresh, bound)
        if choice is None:
            fresh = new_client_ids(zk, root, draw_size(last, bound) if last >= 0 else 1)
            last = fresh[-1]
            continue
        fresh = [c for c in fresh if c > choice]
        txn = zk.transaction()
        txn.set_data(owner, name, version=stat.version)
        txn.create(paths.client_binding(choice), name)
        txn.create(f"{owner}/{choice}", b"")
        results = txn.commit()
        if not any(isinstance(r, Exception) for r in results):
            return choice
        if isinstance(results[1], NodeExistsError):
            # Bound ahead: learn every bound ID once, so the next draws skip the run.
            bound |= {int(c) for c in zk.get_children(paths.client_bindings) if c.isdigit()}
            bound.add(choice)
        # else the identity node changed (another allocation, a release): read it again
    raise ClusterError(
        f"could not allocate a client ID for {identity!r} in {ALLOCATION_ATTEMPTS} attempts "
        f"(too many concurrent allocations, or IDs bound ahead)"
    )


def read_binding(zk: KazooClient, root: str, client_id: int) -> tuple[str, float] | None:
    """The identity ``client_id`` is bound to and when it was last used (seconds since the
    epoch), or None without a binding."""
    try:
        data, stat = zk.get(ClusterPaths.of(root).client_binding(client_id))
    except NoNodeError:
        return None
    return data.decode(errors="replace"), stat.mtime / 1000


def touch_binding(zk: KazooClient, root: str, client_id: int, identity: str) -> bool:
    """Mark the binding used now (its modification time); False when it is gone."""
    path = ClusterPaths.of(root).client_binding(client_id)
    try:
        data, stat = zk.get(path)
        if data != identity.encode():
            return False
        zk.set(path, data, version=stat.version)
        return True
    except (NoNodeError, BadVersionError):
        return False  # released meanwhile (a touch racing another is as good as done)


def release_unused_bindings(
    zk: KazooClient,
    root: str,
    retention: float,
    now: float,
    keep: Container[int] = (),
) -> list[int]:
    """Delete the bindings unused for ``retention`` seconds (except ``keep``); the IDs
    released. Each delete is at the version read: a binding touched meanwhile stays."""
    paths = ClusterPaths.of(root)
    try:
        names = [c for c in zk.get_children(paths.client_bindings) if c.isdigit()]
    except NoNodeError:
        return []
    released: list[int] = []
    owners: set[str] = set()
    for start in range(0, len(names), 500):
        chunk = names[start : start + 500]
        reads = [(int(c), zk.get_async(paths.client_binding(int(c)))) for c in chunk]
        for client_id, read in reads:
            try:
                data, stat = read.get()
            except NoNodeError:
                continue
            if client_id in keep or not binding_expired(stat.mtime / 1000, now, retention):
                continue
            if _release(zk, paths, client_id, data, stat.version):
                released.append(client_id)
                owners.add(paths.client_identity(identity_key(data.decode(errors="replace"))))
    for owner in owners:  # an identity without IDs leaves nothing behind
        with contextlib.suppress(NotEmptyError, NoNodeError):
            zk.delete(owner)
    return released


def _release(
    zk: KazooClient, paths: ClusterPaths, client_id: int, data: bytes, version: int
) -> bool:
    owner = paths.client_identity(identity_key(data.decode(errors="replace")))
    txn = zk.transaction()
    txn.delete(paths.client_binding(client_id), version=version)
    txn.delete(f"{owner}/{client_id}")
    results = txn.commit()
    if not any(isinstance(r, Exception) for r in results):
        return True
    if isinstance(results[1], NoNodeError) and not isinstance(
        results[0], (BadVersionError, NoNodeError)
    ):
        # A binding from before quotas (no identity entry): delete it alone.
        try:
            zk.delete(paths.client_binding(client_id), version=version)
            return True
        except (BadVersionError, NoNodeError):
            return False
    return False


def live_client_ids(zk: KazooClient, root: str, identity: str) -> list[int]:
    """The client IDs bound to ``identity`` under its quota."""
    owner = ClusterPaths.of(root).client_identity(identity_key(identity))
    try:
        return sorted(int(c) for c in zk.get_children(owner) if c.isdigit())
    except NoNodeError:
        return []
