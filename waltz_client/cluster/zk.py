"""Connecting to ZooKeeper with kazoo, with errors that say what failed."""

from __future__ import annotations

import atexit
import contextlib
import logging
import weakref
from typing import TYPE_CHECKING, Any

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from .acl import ZkCredential, metadata_acl
from .errors import ClusterError

if TYPE_CHECKING:
    from waltz_client.runtime.tls import TlsFiles

log = logging.getLogger(__name__)


def connect(
    connect_string: str,
    timeout: float = 15.0,
    read_only: bool = False,
    session_timeout: float = 10.0,
    credential: ZkCredential | None = None,
    tls: TlsFiles | None = None,
) -> KazooClient:
    """A started KazooClient, or ClusterError naming the ensemble that did not answer.
    With ``credential``, it authenticates, and the nodes it creates get the cluster's ACL
    (``acl.metadata_acl``). With ``tls``, it reaches ZooKeeper's secure client port over
    TLS (a client certificate for ZooKeeper's ``ssl.clientAuth=need``)."""
    if not connect_string.strip():
        raise ClusterError("no ZooKeeper connect string (host:port[,host:port...][/chroot])")
    try:
        zk = KazooClient(
            hosts=connect_string,
            timeout=session_timeout,
            read_only=read_only,
            logger=logging.getLogger("kazoo.client"),
            auth_data=credential.auth_data if credential is not None else None,
            **_tls_arguments(tls),
            default_acl=metadata_acl(credential) if credential is not None else None,
        )
    except ValueError as e:
        raise ClusterError(f"bad ZooKeeper connect string {connect_string!r}: {e}") from None
    try:
        zk.start(timeout=timeout)  # how long to wait for a first connection
    except KazooTimeoutError:
        zk.close()
        raise ClusterError(
            f"ZooKeeper at {connect_string} did not answer within {timeout:g} s"
        ) from None
    except ValueError as e:
        zk.close()
        raise ClusterError(f"bad ZooKeeper connect string {connect_string!r}: {e}") from None
    _stop_at_exit(zk)
    return zk


def _tls_arguments(tls: TlsFiles | None) -> dict[str, Any]:
    if tls is None or not tls.enabled:
        return {}
    return {
        "use_ssl": True,
        "certfile": tls.cert,
        "keyfile": tls.key,
        "ca": tls.ca,
        "verify_certs": tls.verify_peer,
        "check_hostname": tls.verify_peer,
    }


def _stop_at_exit(zk: KazooClient) -> None:
    """Stop ``zk`` when the interpreter exits, if nobody closed it. kazoo's handler joins
    its callback thread at exit, and a watch callback stuck reading a ZooKeeper that is
    gone (kazoo retries a watch's read forever) would hang the exit for good; stopping
    the client fails that read. atexit runs the newest hook first: this one runs before
    the handler's, which ``zk.start()`` registered."""
    client = weakref.ref(zk)

    def stop() -> None:
        live = client()
        if live is not None:
            with contextlib.suppress(Exception):
                live.stop()

    zk._waltz_stop_at_exit = stop
    atexit.register(stop)


def close(zk: KazooClient) -> None:
    hook = getattr(zk, "_waltz_stop_at_exit", None)
    if hook is not None:
        atexit.unregister(hook)
    try:
        zk.stop()
    finally:
        zk.close()
