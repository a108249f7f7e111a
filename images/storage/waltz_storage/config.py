"""Storage node settings from defaults, a TOML file, the environment and flags (in that order).

Each setting is named once; the file key, the variable ``WALTZ_STORAGE_<NAME>``
and the flag ``--<name-with-dashes>`` all derive from that name. A bad or
missing setting raises ConfigError naming the setting and where it came from.
"""

from __future__ import annotations

import argparse
import re
import tomllib
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from waltz_client.cluster.metadata import validate_storage_address
from waltz_client.partition_ranges import parse_partition_ranges

ENV_PREFIX = "WALTZ_STORAGE_"


class ConfigError(Exception):
    """One line naming the setting, its source and what is wrong."""


_SIZE = re.compile(r"^\s*(\d+)\s*(|b|k|kb|kib|m|mb|mib|g|gb|gib)\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1000,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1000**3,
    "gib": 1024**3,
}


def parse_size(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise ValueError(f"expected a size such as 1048576, 64MiB or 1GiB, got {value!r}")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def _int_in(low: int, high: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        try:
            n = int(value) if not isinstance(value, bool) else None
        except (TypeError, ValueError):
            n = None
        if n is None or not low <= n <= high:
            raise ValueError(f"expected an integer in {low}..{high}, got {value!r}")
        return n

    return parse


def _size_at_least(low: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        n = parse_size(value)
        if n < low:
            raise ValueError(f"must be at least {low} bytes, got {n}")
        return n

    return parse


def _uuid(value: Any) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise ValueError(f"expected a UUID such as {uuid.UUID(int=0)}, got {value!r}") from None


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def _log_level(value: Any) -> str:
    level = str(value).upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError(f"expected DEBUG, INFO, WARNING or ERROR, got {value!r}")
    return level


@dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[Any], Any]
    default: Any
    help: str

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


REQUIRED = object()

SETTINGS = [
    Setting("directory", _text, REQUIRED, "storage directory (control file, partition dirs)"),
    Setting(
        "zookeeper",
        str,
        "",
        "ZooKeeper connect string: read key, partition count and "
        "this node's partitions from the cluster's metadata, and follow its changes",
    ),
    Setting("zk_root", _text, "/waltz", "the cluster's root znode (with zookeeper)"),
    Setting(
        "advertised_address",
        str,
        "",
        "host:port this node has in the replica assignment "
        "(with zookeeper; default <hostname>:<bound port>)",
    ),
    Setting("cluster_key", _uuid, None, "cluster key UUID (without zookeeper: required)"),
    Setting(
        "num_partitions",
        _int_in(1, 1_000_000),
        None,
        "partitions in the cluster (without zookeeper: required)",
    ),
    Setting(
        "partitions",
        _text,
        "all",
        "partitions this node holds, e.g. 0-6,9 or all (without zookeeper)",
    ),
    Setting("host", _text, "0.0.0.0", "address to listen on"),
    Setting("port", _int_in(0, 65535), 55280, "protocol port (0: any free port)"),
    Setting("http_port", _int_in(0, 65535), 55281, "health and metrics port (0: any free port)"),
    Setting("segment_bytes", _size_at_least(4096), "1GiB", "start a new segment past this size"),
    Setting("max_frame_bytes", _size_at_least(64 * 1024), "64MiB", "largest frame accepted"),
    Setting(
        "queue_max_requests",
        _int_in(1, 10_000_000),
        1024,
        "queued requests per connection before it stops reading",
    ),
    Setting(
        "queue_max_bytes",
        _size_at_least(64 * 1024),
        "64MiB",
        "queued bytes per connection before it stops reading",
    ),
    Setting(
        "write_group_max_bytes",
        _size_at_least(4096),
        "8MiB",
        "request bytes one partition commits with one fsync",
    ),
    Setting("ready_file", str, "", "write the bound ports here (JSON) once serving"),
    Setting("log_level", _log_level, "INFO", "DEBUG, INFO, WARNING or ERROR"),
]
BY_NAME = {s.name: s for s in SETTINGS}


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
    write_group_max_bytes: int
    ready_file: str
    log_level: str


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit status 2, as for every bad setting
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="waltz-storage",
        description="Waltz storage node. Settings come from --config (TOML), then "
        f"{ENV_PREFIX}<NAME> variables, then flags; later sources win.",
    )
    parser.add_argument("--config", metavar="FILE", help="TOML file of settings")
    for s in SETTINGS:
        default = (
            "required"
            if s.default is REQUIRED
            else "no default"
            if s.default is None
            else f"default {s.default}"
        )
        parser.add_argument(
            s.flag, dest=s.name, metavar=s.name.upper(), help=f"{s.help} ({default}; env {s.env})"
        )
    return parser


def load_config(argv: list[str] | None, environ: Mapping[str, str]) -> StorageConfig:
    args = build_parser().parse_args(argv)
    raw: dict[str, tuple[Any, str]] = {}
    for s in SETTINGS:
        if s.default is not REQUIRED and s.default is not None:
            raw[s.name] = (s.default, "default")
    if args.config:
        try:
            with open(args.config, "rb") as f:
                doc = tomllib.load(f)
        except OSError as e:
            raise ConfigError(f"--config {args.config}: cannot read: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"--config {args.config}: not valid TOML: {e}") from None
        for key, value in doc.items():
            if key not in BY_NAME:
                raise ConfigError(
                    f"{args.config}: unknown setting {key!r} (known: {', '.join(BY_NAME)})"
                )
            raw[key] = (value, args.config)
    for s in SETTINGS:
        if s.env in environ:
            raw[s.name] = (environ[s.env], f"${s.env}")
        value = getattr(args, s.name)
        if value is not None:
            raw[s.name] = (value, s.flag)
    values: dict[str, Any] = {}
    for s in SETTINGS:
        if s.name not in raw and s.default is None:
            values[s.name] = None
            continue
        if s.name not in raw:
            raise ConfigError(
                f"setting {s.name} is required: set {s.flag}, ${s.env} or "
                f"'{s.name}' in the --config file"
            )
        value, source = raw[s.name]
        try:
            values[s.name] = s.parse(value)
        except ValueError as e:
            raise ConfigError(f"setting {s.name} (from {source}): {e}") from None
    if values["zookeeper"]:
        if raw["partitions"][1] != "default":
            raise ConfigError(
                f"setting partitions (from {raw['partitions'][1]}): with zookeeper set, this "
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
                s = BY_NAME[name]
                raise ConfigError(
                    f"setting {name} is required without zookeeper: set {s.flag}, ${s.env} or "
                    f"'{name}' in the --config file (or set zookeeper to read it from there)"
                )
        try:
            partitions = parse_partition_ranges(values["partitions"], values["num_partitions"])
        except ValueError as e:
            raise ConfigError(f"setting partitions (from {raw['partitions'][1]}): {e}") from None
        values["partitions"] = frozenset(partitions)
    if values["max_frame_bytes"] > 2**32 - 1:
        raise ConfigError("setting max_frame_bytes: must fit the 32-bit frame length")
    return StorageConfig(**values)
