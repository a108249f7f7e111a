"""Server settings: the schema (``waltz_client.runtime.settings`` loads it) and the checks that span
several settings. Variables are ``WALTZ_SERVER_<NAME>``."""

from __future__ import annotations

import argparse
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from waltz_client.cluster.acl import ZkCredential, credential_from_setting
from waltz_client.cluster.errors import ClusterError
from waltz_client.cluster.identities import session_identities
from waltz_client.cluster.metadata import ServerRegistration
from waltz_client.cluster.paths import znode_root
from waltz_client.runtime.listener import address_settings
from waltz_client.runtime.peer_limits import (
    check_max_frame_bytes,
    max_frame_setting,
    peer_limit_settings,
)
from waltz_client.runtime.settings import (
    REQUIRED,
    ConfigError,
    Setting,
    SettingsSchema,
    boolean,
    float_in,
    int_in,
    optional_host_name,
    ready_file_and_log_settings,
    size_at_least,
    zookeeper_address,
)
from waltz_client.runtime.tls import (
    TlsFiles,
    check_listener_tls,
    check_tls,
    listener_tls_of,
    listener_tls_settings,
    zk_tls_of,
    zk_tls_settings,
)
from waltz_client.wire.client_messages import MAX_LOCKS
from waltz_client.wire.records import DEFAULT_MAX_DATA_BYTES

__all__ = ["ConfigError", "ServerConfig", "build_parser", "load_config"]

ENV_PREFIX = "WALTZ_SERVER_"
# An append frame beyond its data: type, ReqId, high-water mark, three full lock lists,
# header, data length, CRC.
MAX_APPEND_OVERHEAD = 1 + 16 + 8 + 3 * (4 + 4 * MAX_LOCKS) + 4 + 4 + 4
_SERVER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


def _server_id(value: object) -> str:
    value = str(value)
    if value and not _SERVER_ID.fullmatch(value):
        raise ValueError(
            f"expected letters, digits, '.', '_', ':' or '-' (at most 128), got {value!r}"
        )
    return value


def _off_or_seconds(value: object) -> float:
    """0 (off), or at least a second: a shorter wait would replace a node for a blip."""
    seconds = float_in(0.0, 30 * 86400.0)(value)
    if 0 < seconds < 1:
        raise ValueError(f"expected 0 (off) or 1..{30 * 86400} seconds, got {value!r}")
    return seconds


SETTINGS = (
    Setting(
        "zookeeper",
        zookeeper_address,
        REQUIRED,
        "ZooKeeper connect string (host:port[,...][/chroot])",
    ),
    Setting("zk_root", znode_root, "/waltz", "the cluster's root znode"),
    Setting(
        "zk_session_timeout",
        float_in(2.0, 300.0),
        10.0,
        "ZooKeeper session timeout in seconds: how soon a dead server's partitions move",
    ),
    Setting("server_id", _server_id, "", "this server's ID (default <advertised host>-<port>)"),
    *address_settings(port=55180, http_port=55181, port_is="client port"),
    Setting(
        "advertised_host",
        optional_host_name,
        "",
        "host clients reach this server at (default: the listen host, or the host name)",
    ),
    Setting(
        "advertised_tls_name",
        optional_host_name,
        "",
        "name in tls_cert that clients check instead of the advertised host (on Kubernetes "
        "the client Service's, as pod IPs are in no certificate), published beside it",
    ),
    Setting("lock_table_size", int_in(1, 1 << 26), 1 << 16, "lock table entries per partition"),
    Setting("lock_hashes", int_in(1, 16), 3, "hash functions per lock"),
    Setting("feed_cache_bytes", size_at_least(4096), "16MiB", "feed cache per partition"),
    Setting(
        "data_cache_bytes", size_at_least(4096), "64MiB", "transaction data cache per partition"
    ),
    Setting(
        "max_queue",
        int_in(1, 10_000_000),
        10_000,
        "queued appends per partition before connections stop being read",
    ),
    Setting(
        "max_batch_bytes",
        size_at_least(4096),
        "4MiB",
        "records one storage Append carries at most",
    ),
    Setting("max_in_flight", int_in(1, 1024), 16, "storage Appends in flight per partition"),
    Setting(
        "memory_budget_bytes",
        size_at_least(64 * 1024 * 1024),
        "2GiB",
        "what the owned partitions' caches and backlogs may hold together (caches shrink)",
    ),
    Setting(
        "max_member_backlog_bytes",
        size_at_least(1024 * 1024),
        "64MiB",
        "unanswered Appends to one replica before the session leaves it behind",
    ),
    Setting(
        "checkpoint_interval",
        int_in(1, 2**62),
        1_000_000,
        "transactions after which a partition starts a new store session",
    ),
    Setting(
        "retention_interval",
        float_in(0.1, 86400.0),
        60.0,
        "seconds between a partition's retention steps (the policy: waltz cluster retention)",
    ),
    Setting(
        "storage_timeout",
        float_in(0.1, 600.0),
        5.0,
        "seconds to wait for a storage node to connect and answer during recovery",
    ),
    Setting(
        "replace_storage_after",
        _off_or_seconds,
        0.0,
        "seconds a storage node must fail every probe before the servers move its replicas "
        "to the other nodes (0: never; see docs/operations.md)",
    ),
    Setting(
        "shared_storage_connections",
        boolean,
        True,
        "one connection a storage node for all partitions' appends (false: one a partition)",
    ),
    Setting(
        "catch_up_inline_records",
        int_in(0, 2**31 - 1),
        5_000,
        "a replica further behind than this is copied in the background, not in recovery",
    ),
    Setting(
        "catch_up_rate",
        size_at_least(0),
        "128MiB",
        "bytes a second a background copy of a lagging replica may write (0: no limit)",
    ),
    Setting(
        "client_write_buffer_bytes",
        size_at_least(4096),
        "4MiB",
        "bytes queued for a client socket before its feeds wait for it",
    ),
    max_frame_setting(),
    Setting("max_data_bytes", size_at_least(1), "16MiB", "largest transaction data accepted"),
    *peer_limit_settings(),
    Setting(
        "max_feeds_per_connection",
        int_in(1, 1_000_000),
        1024,
        "feeds and mounts one client connection may hold",
    ),
    Setting(
        "max_feeds_per_partition",
        int_in(1, 10_000_000),
        10_000,
        "feeds and mounts of one partition, all connections together",
    ),
    Setting(
        "max_reads_per_connection",
        int_in(1, 100_000),
        32,
        "read requests of one connection in flight before it stops being read",
    ),
    Setting(
        "max_read_bytes_per_connection",
        size_at_least(1024 * 1024),
        "64MiB",
        "largest replies of one connection's reads in flight, together",
    ),
    Setting(
        "client_id_quota",
        int_in(1, 1_000_000),
        1000,
        "client IDs one certificate identity may hold at once (on a mutual-TLS client port)",
    ),
    Setting(
        "client_id_retention",
        float_in(1.0, 10 * 365 * 86400.0),
        7 * 86400.0,
        "seconds after which a client ID no connection uses is released",
    ),
    Setting(
        "zk_auth_file",
        str,
        "",
        "file holding user:password, the ZooKeeper credential that may write the "
        "cluster's metadata (when CreateCluster set ACLs)",
    ),
    *zk_tls_settings(),
    *listener_tls_settings(serves="clients", peers="clients", peer="client"),
    Setting("storage_tls_cert", str, "", "PEM certificate presented to storage nodes"),
    Setting("storage_tls_key", str, "", "PEM private key of storage_tls_cert"),
    Setting(
        "storage_tls_ca",
        str,
        "",
        "PEM CA bundle that storage nodes' certificates must chain to: connect over TLS",
    ),
    Setting(
        "storage_tls_verify_peer",
        boolean,
        True,
        "verify storage nodes' certificates and host names",
    ),
    *ready_file_and_log_settings(),
)

SCHEMA = SettingsSchema(
    prog="waltz-server",
    description="Waltz server: owns partitions, checks locks, replicates to storage nodes.",
    env_prefix=ENV_PREFIX,
    settings=SETTINGS,
)


@dataclass(frozen=True)
class ServerConfig:
    zookeeper: str
    zk_root: str
    zk_session_timeout: float
    server_id: str
    host: str
    port: int
    http_port: int
    advertised_host: str
    advertised_tls_name: str
    lock_table_size: int
    lock_hashes: int
    feed_cache_bytes: int
    data_cache_bytes: int
    max_queue: int
    max_batch_bytes: int
    max_in_flight: int
    max_member_backlog_bytes: int
    memory_budget_bytes: int
    checkpoint_interval: int
    retention_interval: float
    storage_timeout: float
    replace_storage_after: float
    shared_storage_connections: bool
    catch_up_inline_records: int
    catch_up_rate: int
    client_write_buffer_bytes: int
    max_frame_bytes: int
    max_data_bytes: int
    max_connections: int
    max_connections_per_address: int
    handshake_timeout: float
    partial_frame_timeout: float
    partial_frames_max_bytes: int
    max_feeds_per_connection: int
    max_feeds_per_partition: int
    max_reads_per_connection: int
    max_read_bytes_per_connection: int
    client_id_quota: int
    client_id_retention: float
    zk_auth_file: str
    zk_tls_cert: str
    zk_tls_key: str
    zk_tls_ca: str
    tls_cert: str
    tls_key: str
    http_tls: bool
    tls_ca: str
    tls_verify_peer: bool
    storage_tls_cert: str
    storage_tls_key: str
    storage_tls_ca: str
    storage_tls_verify_peer: bool
    ready_file: str
    log_level: str
    log_format: str
    zk_credential: ZkCredential | None = None  # read from zk_auth_file

    @property
    def zk_tls(self) -> TlsFiles | None:
        return zk_tls_of(self.zk_tls_cert, self.zk_tls_key, self.zk_tls_ca)

    @property
    def tls(self) -> TlsFiles:
        return listener_tls_of(self.tls_cert, self.tls_key, self.tls_ca, self.tls_verify_peer)

    @property
    def storage_tls(self) -> TlsFiles:
        return TlsFiles(
            self.storage_tls_cert or None,
            self.storage_tls_key or None,
            self.storage_tls_ca or None,
            self.storage_tls_verify_peer,
        )

    def advertised(self) -> str:
        if self.advertised_host:
            return self.advertised_host
        if self.host in ("", "0.0.0.0", "::"):
            return socket.gethostname()
        return self.host

    def registration(self, server_id: str, port: int, http_port: int) -> ServerRegistration:
        """What this server publishes in ZooKeeper: where clients reach it, and (over
        TLS, when it is not that host) the name they check its certificate for."""
        return ServerRegistration(
            server_id,
            self.advertised(),
            port,
            http_port,
            self.advertised_tls_name,
            # Who it is to ZooKeeper, which `waltz cluster secure` checks.
            tuple(session_identities(self.zk_credential, self.zk_tls_cert if self.zk_tls else "")),
        )


def build_parser() -> argparse.ArgumentParser:
    return SCHEMA.build_parser()


def load_config(argv: list[str] | None, environ: Mapping[str, str]) -> ServerConfig:
    values, _ = SCHEMA.load(argv, environ)
    check_max_frame_bytes(values["max_frame_bytes"])
    if values["max_data_bytes"] + MAX_APPEND_OVERHEAD > values["max_frame_bytes"]:
        raise ConfigError(
            f"setting max_data_bytes ({values['max_data_bytes']}) must leave room for the "
            f"rest of an append ({MAX_APPEND_OVERHEAD} bytes at most) within max_frame_bytes "
            f"({values['max_frame_bytes']})"
        )
    if values["max_data_bytes"] > DEFAULT_MAX_DATA_BYTES:
        raise ConfigError(
            f"setting max_data_bytes ({values['max_data_bytes']}): storage nodes accept at "
            f"most {DEFAULT_MAX_DATA_BYTES} bytes of data a transaction"
        )
    if values["max_batch_bytes"] > values["max_frame_bytes"] // 2:
        raise ConfigError("setting max_batch_bytes must be at most half of max_frame_bytes")
    try:
        values["zk_credential"] = credential_from_setting(values["zk_auth_file"], "zk_auth_file")
    except ClusterError as e:
        raise ConfigError(str(e)) from None
    config = ServerConfig(**values)
    if config.advertised_tls_name and not config.tls.enabled:
        raise ConfigError(
            "setting advertised_tls_name: needs tls_cert and tls_key (clients check the name "
            "in the certificate of a TLS client port)"
        )
    check_listener_tls(config.tls, config.http_tls)
    if config.storage_tls.enabled:
        check_tls(config.storage_tls, "storage_tls", listening=False)
    if config.zk_tls is not None:
        check_tls(config.zk_tls, "zk_tls", listening=False)
    return config
