"""How the reconciler reaches each cluster: the monitor's pace, ZooKeeper's timeout, the
storage nodes' readiness URLs, where ZooKeeper's certificates are written."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

from .monitor import MonitorSettings
from .spec import STORAGE_HTTP_PORT


def default_storage_http(address: str, scheme: str = "http") -> str:
    """A storage node's readiness URL: its pod's stable name, the HTTP port."""
    host = address.rsplit(":", 1)[0]
    return f"{scheme}://{host}:{STORAGE_HTTP_PORT}/readyz"


@dataclass(frozen=True)
class ReconcileSettings:
    monitor: MonitorSettings = field(default_factory=MonitorSettings)
    zk_timeout: float = 10.0
    # A storage node's readiness URL from its address (tests map it to local ports).
    storage_http: Callable[[str], str | None] = default_storage_http
    # Storage addresses by ordinal instead of the pods' DNS names (spec.address_book).
    address_book: tuple[str, ...] = ()
    # Where the certificates of spec.zookeeper.tlsSecret are written for kazoo.
    secret_dir: str = field(
        default_factory=lambda: os.path.join(tempfile.gettempdir(), "waltz-operator-secrets")
    )
