"""The options of ``waltz bench --scale`` (``scale.py``): the modes, their defaults (issue
43's full measurement), their checks, and the JSON form of the settings and cells."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

SCALE_MODES = ("partitions", "idle-clients", "failover", "tls")

# Each mode's defaults: issue 43's full measurement.
DEFAULT_PARTITIONS = {
    "partitions": (1, 4, 16, 64, 256),
    "idle-clients": (4,),  # the cluster's partitions; every client mounts each of them
    "failover": (4, 64, 256),
    "tls": (1, 4),
}
DEFAULT_CONCURRENCY = {
    "partitions": (256,),
    "failover": (256,),  # in all, spread evenly over the partitions (at least 1 each)
    "tls": (1, 16, 256),
}
DEFAULT_CLIENTS = (1000, 10_000)
DEFAULT_SESSION_TIMEOUT = 10.0  # the server's own default (waltz_server/config.py)
DEFAULT_IDLE_SECONDS = 10.0  # idle-clients without --seconds
# The embedded ZooKeeper grants sessions of 2 to 60 s (zookeeper_files.py): within them
# the timeout asked for is the one in use.
SESSION_TIMEOUT_RANGE = (2.0, 60.0)

# The --scale options (argparse names), and the modes each applies to.
SCALE_ONLY = {
    "scale_partitions": SCALE_MODES,
    "scale_concurrency": ("partitions", "failover", "tls"),
    "scale_clients": ("idle-clients",),
    "scale_session_timeout": ("failover",),
}
# Options of the --compare sweep that --scale takes too; the sweep's others it refuses.
SHARED_WITH_COMPARE = ("seconds", "runs", "json")

MODE_HELP = (
    "partitions: writes/s, latency and CPU a write at 1 to 256 partitions on one server; "
    "idle-clients: server memory and CPU of 1,000 and 10,000 mounted idle clients; "
    "failover: each partition's time without commits when its owner is SIGKILLed, and "
    "through a rolling restart (SIGTERM); tls: mutual TLS against plain text"
)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _listed(values: tuple[int, ...]) -> str:
    return ",".join(str(v) for v in values)


def option_help() -> dict[str, str]:
    """The help of each --scale option, with its defaults by mode."""
    parts = "; ".join(f"{m} {_listed(v)}" for m, v in DEFAULT_PARTITIONS.items())
    conc = "; ".join(f"{m} {_listed(v)}" for m, v in DEFAULT_CONCURRENCY.items())
    return {
        "scale": MODE_HELP,
        "scale_partitions": f"partition counts, a cell each (default: {parts})",
        "scale_concurrency": f"writes in flight in all (default: {conc}; failover spreads "
        "them evenly over the partitions, at least 1 each)",
        "scale_clients": f"idle-clients: clients a cell (default {_listed(DEFAULT_CLIENTS)})",
        "scale_session_timeout": "failover: the servers' ZooKeeper session timeout, s "
        f"(default {DEFAULT_SESSION_TIMEOUT:g}, the server's own default)",
    }


def scale_only_given(args: argparse.Namespace) -> list[str]:
    """The --scale options given (as flags), for refusing them without --scale."""
    return [_flag(n) for n in SCALE_ONLY if getattr(args, n) is not None]


@dataclass(frozen=True)
class ScaleSettings:
    """One ``--scale`` run: the mode and its sizes, defaults filled in."""

    mode: str
    partitions: tuple[int, ...]
    concurrency: tuple[int, ...]
    clients: tuple[int, ...]
    session_timeout: float
    seconds: float  # load a cell (partitions, tls), before the event (failover), idle period
    runs: int
    size: int
    tls: bool  # idle-clients and failover: mutual TLS (the tls mode runs both)
    data_dir: str


class ScaleArgumentError(ValueError):
    """A bad --scale command line; the message is the error's text."""


def _counts(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = sorted({int(x) for x in text.split(",")})
    except ValueError:
        raise ScaleArgumentError(f"{flag} takes comma-separated integers, e.g. 1,4,16") from None
    if min(values) < 1:
        raise ScaleArgumentError(f"{flag}: every count must be at least 1")
    return tuple(values)


def settings_of(args: argparse.Namespace) -> ScaleSettings:
    """The settings of a ``--scale`` command line; ScaleArgumentError if it is wrong."""
    mode = args.scale
    if args.compare or args.floor:
        raise ScaleArgumentError("--scale, --compare and --floor are separate measurements")
    compare = [
        _flag(n)
        for n, default in args.sweep_defaults.items()
        if n not in SHARED_WITH_COMPARE and getattr(args, n) != default
    ]
    if compare:
        raise ScaleArgumentError(f"{', '.join(compare)} only apply with --compare, not --scale")
    wrong = [
        _flag(n)
        for n, modes in SCALE_ONLY.items()
        if getattr(args, n) is not None and mode not in modes
    ]
    if wrong:
        raise ScaleArgumentError(f"{', '.join(wrong)} do not apply to --scale {mode}")
    partitions = (
        _counts(args.scale_partitions, "--scale-partitions")
        if args.scale_partitions is not None
        else DEFAULT_PARTITIONS[mode]
    )
    concurrency = (
        _counts(args.scale_concurrency, "--scale-concurrency")
        if args.scale_concurrency is not None
        else DEFAULT_CONCURRENCY.get(mode, ())
    )
    clients = (
        _counts(args.scale_clients, "--scale-clients")
        if args.scale_clients is not None
        else DEFAULT_CLIENTS
    )
    timeout = (
        args.scale_session_timeout
        if args.scale_session_timeout is not None
        else DEFAULT_SESSION_TIMEOUT
    )
    low, high = SESSION_TIMEOUT_RANGE
    if not low <= timeout <= high:
        raise ScaleArgumentError(
            f"--scale-session-timeout must be {low:g} to {high:g} s (what the local "
            f"ZooKeeper grants)"
        )
    seconds = args.seconds
    if mode == "idle-clients" and seconds == args.sweep_defaults["seconds"]:
        seconds = DEFAULT_IDLE_SECONDS
    if args.runs < 1 or seconds <= 0 or args.size < 1:
        raise ScaleArgumentError("--runs and --size must be at least 1, --seconds above 0")
    if mode == "idle-clients" and max(partitions) > 1024:
        raise ScaleArgumentError(
            "--scale-partitions: an idle client mounts every partition, at most 1024 "
            "(max_feeds_per_connection)"
        )
    return ScaleSettings(
        mode,
        partitions,
        concurrency,
        clients,
        timeout,
        seconds,
        args.runs,
        args.size,
        not args.insecure,
        os.path.join(args.data_dir, "scale-" + mode),
    )


def settings_record(s: ScaleSettings) -> dict[str, Any]:
    """The settings a mode used, for the JSON file (the others' defaults left out)."""
    doc = asdict(s)
    if s.mode in ("partitions", "tls"):
        del doc["tls"]  # partitions: plain text, as the sweep; tls: both
    if s.mode != "idle-clients":
        del doc["clients"]
    else:
        del doc["concurrency"]
    if s.mode != "failover":
        del doc["session_timeout"]
    return doc


def record(obj: Any, **more: Any) -> dict[str, Any]:
    """A dataclass as a JSON object, with ``more`` (derived figures) added."""
    return {**asdict(obj), **more}
