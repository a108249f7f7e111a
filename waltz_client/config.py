"""WaltzClientConfig: every client setting, checked when the config is made."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from .cluster.paths import normalise_root
from .runtime.settings import zookeeper_address
from .runtime.tls import TlsError, TlsFiles
from .wire.client_messages import SERVER_PROTOCOL_VERSIONS


class WaltzConfigError(ValueError):
    """A bad client setting; the message names it."""


@dataclass(frozen=True)
class WaltzClientConfig:
    zookeeper: str
    zk_root: str = "/waltz"
    partitions: frozenset[int] | None = None  # mounted for the feed; None: all of them
    max_outstanding_appends: int = 1000  # per partition; submit waits beyond it
    max_retries: int = 20  # executions of one context before it fails
    # Seconds from submit() after which a context not yet committed expires (no attempt
    # starts, no wait for one goes on; on_expiration is called). None: no deadline.
    transaction_timeout: float | None = 120.0  # as Kafka's delivery.timeout.ms
    request_timeout: float = 30.0  # RPCs (data, high-water mark, range reads), flush
    mount_timeout: float = 60.0
    retry_backoff: float = 0.05  # first pause between retries; doubles up to 2 s
    zk_session_timeout: float = 10.0
    zk_connect_timeout: float = 10.0  # start(): how long to wait for ZooKeeper
    feed: bool = True  # mount partitions and apply the feed (False: write and read only)
    tls: TlsFiles | None = None  # reach servers over TLS (a client certificate for mutual TLS)
    zk_tls: TlsFiles | None = None  # reach ZooKeeper's TLS port
    extra: dict = field(default_factory=dict, compare=False)
    # Tests only: the newest client protocol version offered to servers (None: this
    # build's), to act as an older client (2: no commit times).
    _max_protocol_version: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> WaltzConfigError:
            return WaltzConfigError(f"WaltzClientConfig.{name}: {why}")

        if not isinstance(self.zookeeper, str) or not self.zookeeper.strip():
            raise bad("zookeeper", "a ZooKeeper connect string (host:port[,...]) is required")
        try:
            zookeeper_address(self.zookeeper)
        except ValueError as e:
            raise bad("zookeeper", str(e)) from None
        if not isinstance(self.zk_root, str):
            raise bad("zk_root", f"expected a znode path such as /waltz, got {self.zk_root!r}")
        try:
            object.__setattr__(self, "zk_root", normalise_root(self.zk_root))
        except ValueError as e:
            raise bad("zk_root", str(e)) from None
        if self.partitions is not None:
            if isinstance(self.partitions, str | bytes) or not isinstance(
                self.partitions, Iterable
            ):
                raise bad("partitions", f"expected partition IDs, got {self.partitions!r}")
            given = list(self.partitions)
            if any(not isinstance(p, int) or isinstance(p, bool) or p < 0 for p in given):
                raise bad("partitions", f"partition IDs are integers >= 0, got {given!r}")
            object.__setattr__(self, "partitions", frozenset(given))
        for name in ("tls", "zk_tls"):
            files = getattr(self, name)
            if files is None:
                continue
            if not isinstance(files, TlsFiles):
                raise bad(name, f"expected waltz_client.runtime.tls.TlsFiles, got {files!r}")
            try:
                files.check(name, listening=False)
            except TlsError as e:
                raise bad(name, str(e)) from None
        cap = self._max_protocol_version
        if cap is not None and (
            not isinstance(cap, int) or isinstance(cap, bool) or cap not in SERVER_PROTOCOL_VERSIONS
        ):
            lo, hi = SERVER_PROTOCOL_VERSIONS.start, SERVER_PROTOCOL_VERSIONS.stop - 1
            raise bad("_max_protocol_version", f"expected None or {lo}..{hi}, got {cap!r}")
        if not isinstance(self.feed, bool):
            raise bad("feed", f"expected True or False, got {self.feed!r}")
        for name, low in (("max_outstanding_appends", 1), ("max_retries", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise bad(name, f"expected an integer >= {low}, got {value!r}")
        for name in (
            "request_timeout",
            "mount_timeout",
            "retry_backoff",
            "zk_session_timeout",
            "zk_connect_timeout",
            "transaction_timeout",
        ):
            value = getattr(self, name)
            if name == "transaction_timeout" and value is None:
                continue
            if (
                not isinstance(value, int | float)
                or isinstance(value, bool)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise bad(
                    name,
                    f"expected a positive number of seconds, got {value!r}"
                    + (" (None: no deadline)" if name == "transaction_timeout" else ""),
                )
