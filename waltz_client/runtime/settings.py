"""Daemon settings from defaults, a TOML file, the environment and flags (in that order).

Each setting is named once; the file key, the variable ``<PREFIX><NAME>`` and
the flag ``--<name-with-dashes>`` all derive from that name. A bad or missing
setting raises ConfigError naming the setting and where its value came from.
Every value given is checked, even one a later source overrides: a bad value
in the --config file is refused although a flag sets the same setting (the
file is wrong, and would be used as soon as the flag goes).
Shared by the storage and server daemons.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import tomllib
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn


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


def int_in(low: int, high: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        # A boolean is refused, and a TOML float such as 8080.9 too rather than truncated.
        n = None
        if not isinstance(value, bool) and not (
            isinstance(value, float) and not value.is_integer()
        ):
            try:
                n = int(value)
            except (TypeError, ValueError, OverflowError):
                n = None
        if n is None or not low <= n <= high:
            raise ValueError(f"expected an integer in {low}..{high}, got {value!r}")
        return n

    return parse


def float_in(low: float, high: float) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        try:
            x = float(value) if not isinstance(value, bool) else None
        except (TypeError, ValueError):
            x = None
        if x is None or not low <= x <= high:
            raise ValueError(f"expected a number in {low:g}..{high:g}, got {value!r}")
        return x

    return parse


# No size setting needs more: a larger value is a typo (1e23) or a unit mix-up.
MAX_SIZE = 1024**4  # 1 TiB


def size_at_least(low: int, high: int = MAX_SIZE) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        n = parse_size(value)
        if n < low:
            raise ValueError(f"must be at least {low} bytes, got {n}")
        if n > high:
            raise ValueError(f"must be at most {_size_text(high)}, got {n} bytes")
        return n

    return parse


def _size_text(n: int) -> str:
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n % factor == 0:
            return f"{n // factor}{unit}"
    return f"{n} bytes"


_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_]([A-Za-z0-9_.:-]*[A-Za-z0-9_])?)$")


def host_name(value: Any) -> str:
    """A host name, IPv4 address or IPv6 address (bare or in brackets): no spaces."""
    import ipaddress

    name = text(value).strip()
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(name.removeprefix("[").removesuffix("]"))
        return name
    if not _HOST.match(name) or ".." in name:
        raise ValueError(f"expected a host name or IP address, got {value!r}")
    return name


def optional_host_name(value: Any) -> str:
    return "" if value in ("", None) else host_name(value)


def zookeeper_address(value: Any) -> str:
    """A ZooKeeper connect string ``host:port[,host:port...][/chroot]``, checked for
    syntax only (an unreachable but well-formed address is for the caller to retry)."""
    from kazoo.hosts import collect_hosts

    text_ = text(value).strip()
    if any(c.isspace() for c in text_):
        raise ValueError(f"expected host:port[,host:port...][/chroot], got {value!r}")
    expected = f"expected host:port[,host:port...][/chroot], got {value!r}"
    try:
        hosts, _chroot = collect_hosts(text_)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{expected} ({e})") from None
    if not hosts:
        raise ValueError(expected)
    for host, port in hosts:
        if ":" not in host:  # kazoo hands IPv6 hosts back without their brackets
            host_name(host)
        if not 0 < port <= 65535:
            raise ValueError(f"{expected} (port {port} of {host})")
    return text_


def optional_zookeeper_address(value: Any) -> str:
    return "" if value in ("", None) else zookeeper_address(value)


def writable_file_path(value: Any) -> str:
    """A file this process may create or replace: its directory exists and is writable,
    and it is not itself a directory."""
    import os

    path = str(value)
    if not path:
        return ""
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory, not a file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"the directory {parent} is not writable")
    return path


def parse_uuid(value: Any) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise ValueError(f"expected a UUID such as {uuid.UUID(int=0)}, got {value!r}") from None


def text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in ("true", "yes", "on", "1"):
        return True
    if word in ("false", "no", "off", "0"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def log_level(value: Any) -> str:
    level = str(value).upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError(f"expected DEBUG, INFO, WARNING or ERROR, got {value!r}")
    return level


def log_format(value: Any) -> str:
    word = str(value).strip().lower()
    if word not in ("text", "json"):
        raise ValueError(f"expected text or json, got {value!r}")
    return word


REQUIRED = object()


@dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[Any], Any]
    default: Any  # REQUIRED, None (optional, no default) or a value parse() accepts
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def ready_file_and_log_settings() -> list[Setting]:
    """The daemon settings (both daemons) that come last: the ready file, the log level
    and the log format."""
    return [
        Setting(
            "ready_file", writable_file_path, "", "write the bound ports here (JSON) once serving"
        ),
        Setting("log_level", log_level, "INFO", "DEBUG, INFO, WARNING or ERROR"),
        Setting(
            "log_format",
            log_format,
            "text",
            "text, or json: one object a line (time, level, logger, message, exception, "
            "partition, session, peer)",
        ),
    ]


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit status 2, as for every bad setting
        raise ConfigError(message)


@dataclass(frozen=True)
class SettingsSchema:
    prog: str
    description: str
    env_prefix: str
    settings: tuple[Setting, ...]

    def env(self, setting: Setting) -> str:
        return self.env_prefix + setting.name.upper()

    def setting(self, name: str) -> Setting:
        for s in self.settings:
            if s.name == name:
                return s
        raise KeyError(name)

    def build_parser(self) -> argparse.ArgumentParser:
        parser = _OneLineParser(
            prog=self.prog,
            description=f"{self.description} Settings come from --config (TOML), then "
            f"{self.env_prefix}<NAME> variables, then flags; later sources win.",
        )
        parser.add_argument("--config", metavar="FILE", help="TOML file of settings")
        for s in self.settings:
            if s.default is REQUIRED:
                default = "required"
            elif s.default is None:
                default = "no default"
            else:
                default = f"default {s.default}"
            parser.add_argument(
                s.flag,
                dest=s.name,
                metavar=s.name.upper(),
                help=f"{s.help} ({default}; env {self.env(s)})",
            )
        return parser

    def required_message(self, name: str, extra: str = "") -> str:
        s = self.setting(name)
        return (
            f"setting {name} is required{extra}: set {s.flag}, ${self.env(s)} or "
            f"'{name}' in the --config file"
        )

    def load(
        self, argv: list[str] | None, environ: Mapping[str, str]
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """(parsed values, where each came from); optional settings left unset are None."""
        args = self.build_parser().parse_args(argv)
        by_name = {s.name: s for s in self.settings}
        # Each setting's values, from every source that gives one, in precedence order.
        raw: dict[str, list[tuple[Any, str]]] = {s.name: [] for s in self.settings}
        for s in self.settings:
            if s.default is not REQUIRED and s.default is not None:
                raw[s.name].append((s.default, "default"))
        if args.config:
            try:
                with open(args.config, "rb") as f:
                    doc = tomllib.load(f)
            except OSError as e:
                raise ConfigError(f"--config {args.config}: cannot read: {e.strerror}") from None
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"--config {args.config}: not valid TOML: {e}") from None
            except UnicodeDecodeError as e:
                raise ConfigError(
                    f"--config {args.config}: not valid TOML: not UTF-8 at byte {e.start}"
                ) from None
            for key, value in doc.items():
                if key not in by_name:
                    raise ConfigError(
                        f"{args.config}: unknown setting {key!r} (known: {', '.join(by_name)})"
                    )
                raw[key].append((value, args.config))
        for s in self.settings:
            if self.env(s) in environ:
                raw[s.name].append((environ[self.env(s)], f"${self.env(s)}"))
            value = getattr(args, s.name)
            if value is not None:
                raw[s.name].append((value, s.flag))
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for s in self.settings:
            given = raw[s.name]
            if not given:
                if s.default is REQUIRED:
                    raise ConfigError(self.required_message(s.name))
                values[s.name] = None
                continue
            for value, source in given:  # the last source wins; every one must be valid
                try:
                    values[s.name] = s.parse(value)
                except ValueError as e:
                    raise ConfigError(f"setting {s.name} (from {source}): {e}") from None
                sources[s.name] = source
        return values, sources
