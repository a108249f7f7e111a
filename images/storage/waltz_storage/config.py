"""Storage node settings: the schema (``waltz_client.runtime.settings`` loads it) and the checks
that span several settings. Variables are ``WALTZ_STORAGE_<NAME>``."""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from waltz_client.cluster.metadata import validate_storage_address
from waltz_client.cluster.partition_ranges import parse_partition_ranges
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
    optional_zookeeper_address,
    parse_uuid,
    ready_file_and_log_settings,
    size_at_least,
    text,
)
from waltz_client.runtime.tls import (
    TlsFiles,
    check_listener_tls,
    check_tls,
    listener_tls_of,
    listener_tls_settings,
    parse_patterns,
    zk_tls_of,
    zk_tls_settings,
)

ENV_PREFIX = "WALTZ_STORAGE_"
__all__ = ["ConfigError", "StorageConfig", "build_parser", "load_config"]

SETTINGS = [
    Setting("directory", text, REQUIRED, "storage directory (control file, partition dirs)"),
    Setting(
        "zookeeper",
        optional_zookeeper_address,
        "",
        "ZooKeeper connect string: read key, partition count and "
        "this node's partitions from the cluster's metadata, and follow its changes",
    ),
    Setting("zk_root", znode_root, "/waltz", "the cluster's root znode (with zookeeper)"),
    Setting(
        "advertised_address",
        str,
        "",
        "host:port this node has in the replica assignment "
        "(with zookeeper; default <hostname>:<bound port>)",
    ),
    Setting("cluster_key", parse_uuid, None, "cluster key UUID (without zookeeper: required)"),
    Setting(
        "num_partitions",
        int_in(1, 1_000_000),
        None,
        "partitions in the cluster (without zookeeper: required)",
    ),
    Setting(
        "partitions",
        text,
        "all",
        "partitions this node holds, e.g. 0-6,9 or all (without zookeeper)",
    ),
    *address_settings(port=55280, http_port=55281, port_is="protocol port"),
    Setting(
        "segment_bytes",
        size_at_least(4096, 64 * 1024**3),
        "1GiB",
        "start a new segment past this size (at most 64GiB)",
    ),
    max_frame_setting(),
    Setting(
        "queue_max_requests",
        int_in(1, 10_000_000),
        1024,
        "queued requests per connection before it stops reading",
    ),
    Setting(
        "queue_max_bytes",
        size_at_least(64 * 1024),
        "64MiB",
        "queued bytes per connection before it stops reading",
    ),
    Setting(
        "node_queue_max_bytes",
        size_at_least(64 * 1024),
        "512MiB",
        "queued bytes on all connections together before the one queueing more stops reading",
    ),
    Setting(
        "write_group_max_bytes",
        size_at_least(4096),
        "8MiB",
        "request bytes the node commits with one fsync (or one syncfs for several partitions)",
    ),
    Setting(
        "group_sync",
        boolean,
        True,
        "when several partitions appended, make them durable with one flush instead of "
        "an fsync each (Linux 5.8+)",
    ),
    Setting(
        "group_sync_write_back",
        boolean,
        True,
        "on ext2/3/4, share that flush by writing the partitions' pages back and one "
        "fdatasync; false: one syncfs of the whole filesystem",
    ),
    Setting(
        "inline_group_max_ms",
        float_in(0, 60_000),
        5.0,
        "run a group of writes on the event loop's own thread while the last group took at "
        "most this long (0: every group on the I/O thread)",
    ),
    *peer_limit_settings(),
    *zk_tls_settings(),
    *listener_tls_settings(serves="the protocol port", peers="servers", peer="peer"),
    Setting(
        "tls_allowed_peers",
        parse_patterns,
        "waltz-server*",
        "identities (certificate common names, shell patterns, comma-separated) a peer "
        "must have: the cluster's servers",
    ),
    *ready_file_and_log_settings(),
]


@dataclass(frozen=True)
class StorageConfig:
    directory: str
    zookeeper: str
    zk_root: str
    advertised_address: str
    cluster_key: uuid.UUID | None  # from ZooKeeper when None
    num_partitions: int | None
    partitions: frozenset[int] | None
    host: str
    port: int
    http_port: int
    segment_bytes: int
    max_frame_bytes: int
    queue_max_requests: int
    queue_max_bytes: int
    node_queue_max_bytes: int
    write_group_max_bytes: int
    group_sync: bool
    group_sync_write_back: bool
    inline_group_max_ms: float
    zk_tls_cert: str
    zk_tls_key: str
    zk_tls_ca: str
    max_connections: int
    max_connections_per_address: int
    handshake_timeout: float
    partial_frame_timeout: float
    partial_frames_max_bytes: int
    tls_cert: str
    tls_key: str
    tls_ca: str
    http_tls: bool
    tls_verify_peer: bool
    tls_allowed_peers: tuple[str, ...]
    ready_file: str
    log_level: str
    log_format: str

    @property
    def zk_tls(self) -> TlsFiles | None:
        return zk_tls_of(self.zk_tls_cert, self.zk_tls_key, self.zk_tls_ca)

    @property
    def tls(self) -> TlsFiles:
        return listener_tls_of(self.tls_cert, self.tls_key, self.tls_ca, self.tls_verify_peer)


SCHEMA = SettingsSchema(
    prog="waltz-storage",
    description="Waltz storage node.",
    env_prefix=ENV_PREFIX,
    settings=tuple(SETTINGS),
)


def build_parser() -> argparse.ArgumentParser:
    return SCHEMA.build_parser()


def load_config(argv: list[str] | None, environ: Mapping[str, str]) -> StorageConfig:
    values, sources = SCHEMA.load(argv, environ)
    if values["zookeeper"]:
        if sources["partitions"] != "default":
            raise ConfigError(
                f"setting partitions (from {sources['partitions']}): with zookeeper set, this "
                f"node's partitions come from the cluster's replica assignment"
            )
        values["partitions"] = None
        if values["advertised_address"]:
            try:
                validate_storage_address(values["advertised_address"])
            except ValueError as e:
                raise ConfigError(f"setting advertised_address: {e}") from None
    else:
        for name in ("cluster_key", "num_partitions"):
            if values[name] is None:
                raise ConfigError(
                    SCHEMA.required_message(name, " without zookeeper")
                    + " (or set zookeeper to read it from there)"
                )
        try:
            partitions = parse_partition_ranges(values["partitions"], values["num_partitions"])
        except ValueError as e:
            raise ConfigError(f"setting partitions (from {sources['partitions']}): {e}") from None
        values["partitions"] = frozenset(partitions)
    check_max_frame_bytes(values["max_frame_bytes"])
    config = StorageConfig(**values)
    check_listener_tls(config.tls, config.http_tls)
    if config.zk_tls is not None:
        check_tls(config.zk_tls, "zk_tls", listening=False)
    return config
