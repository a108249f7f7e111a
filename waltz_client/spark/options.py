"""The ``waltz`` Spark source's and sink's options, parsed and checked (no pyspark here).

Spark passes options as strings, with case-insensitive names. Every mistake is a
``WaltzOptionError`` raised at planning, and its message names the option.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from waltz_client.cluster.partition_ranges import parse_partition_ranges
from waltz_client.cluster.paths import normalise_root
from waltz_client.runtime.tls import TlsError, TlsFiles

EARLIEST = -2  # in a JSON offset map, as in Spark's Kafka source
LATEST = -1

# What an offset option says: a named position for every partition, or one per partition.
OffsetSpec = str | dict[int, int]


@dataclass(frozen=True)
class ByTime:
    """A position given as a commit time (ms since the Unix epoch): one for every
    partition read (``startingTimestamp``) or one per partition (``...ByTimestamp``).
    ``option`` is the option it came from, for messages."""

    option: str
    times: int | dict[int, int]

    def time_of(self, partition: int) -> int | None:
        if isinstance(self.times, int):
            return self.times
        return self.times.get(partition)


# Where a read starts or ends: offsets, or the first transaction at or after a time.
Position = OffsetSpec | ByTime


class WaltzOptionError(ValueError):
    """A bad option of the waltz data source; the message names it."""


@dataclass(frozen=True)
class ReadOptions:
    zookeeper: str
    zk_root: str = "/waltz"
    partitions: frozenset[int] | None = None  # None: every partition
    # The option that wins (as in Kafka's source: a timestamp over offsets by timestamp
    # over offsets); ending: batch only.
    starting: Position = "earliest"
    ending: Position = "latest"
    # When no transaction of a partition is at or after its starting time: error | latest.
    by_timestamp_strategy: str = "error"
    max_transactions_per_split: int = 100_000
    max_transactions_per_trigger: int | None = None  # streaming only
    fail_on_data_loss: bool = True
    request_timeout: float = 30.0
    fetch_records: int = 2000  # per range-read request
    fetch_bytes: int = 16 * 1024 * 1024
    fetch_in_flight: int = 4  # range-read requests under way at once, per task
    tls: TlsFiles | None = None  # reach servers over TLS (files on every executor)
    zk_tls: TlsFiles | None = None  # reach ZooKeeper's TLS port (a CA alone will do)


@dataclass(frozen=True)
class WriteOptions:
    zookeeper: str
    zk_root: str = "/waltz"
    lock_name: str = "waltz"
    # job | current | given (streams: current). "given": lock_marks, partition -> mark.
    lock_high_water_mark: str = "job"
    lock_marks: dict[int, int] | None = None
    max_retries: int = 20
    request_timeout: float = 30.0
    max_in_flight: int = 1000
    tls: TlsFiles | None = None
    zk_tls: TlsFiles | None = None


_COMMON = (
    "zookeeper",
    "zkroot",
    "requesttimeout",
    "tlscert",
    "tlskey",
    "tlsca",
    "zktlscert",
    "zktlskey",
    "zktlsca",
)
_READ = (
    *_COMMON,
    "partitions",
    "startingoffsets",
    "endingoffsets",
    "startingtimestamp",
    "startingoffsetsbytimestamp",
    "endingtimestamp",
    "endingoffsetsbytimestamp",
    "startingoffsetsbytimestampstrategy",
    "maxtransactionspersplit",
    "maxtransactionspertrigger",
    "failondataloss",
    "fetchrecords",
    "fetchbytes",
    "fetchinflight",
)
_WRITE = (*_COMMON, "lockname", "lockhighwatermark", "maxretries", "maxinflight")
# Spark adds these itself (load(path), save(path), a stream sink's checkpoint); not ours.
_IGNORED = ("path", "checkpointlocation")

# The documented spelling of each option, for messages.
_SPELLING = {
    name.lower(): name
    for name in (
        "zookeeper",
        "zkRoot",
        "requestTimeout",
        "tlsCert",
        "tlsKey",
        "tlsCa",
        "zkTlsCert",
        "zkTlsKey",
        "zkTlsCa",
        "partitions",
        "startingOffsets",
        "endingOffsets",
        "startingTimestamp",
        "startingOffsetsByTimestamp",
        "endingTimestamp",
        "endingOffsetsByTimestamp",
        "startingOffsetsByTimestampStrategy",
        "maxTransactionsPerSplit",
        "maxTransactionsPerTrigger",
        "failOnDataLoss",
        "fetchRecords",
        "fetchBytes",
        "fetchInFlight",
        "lockName",
        "lockHighWaterMark",
        "maxRetries",
        "maxInFlight",
    )
}


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    given = _lower(options, _READ)
    if not streaming and "maxtransactionspertrigger" in given:
        raise WaltzOptionError("maxTransactionsPerTrigger: applies to streaming reads only")
    if streaming:
        for key in ("endingoffsets", "endingtimestamp", "endingoffsetsbytimestamp"):
            if key in given:
                raise WaltzOptionError(
                    f"{_SPELLING[key]}: applies to batch reads only (a stream reads on; use "
                    "maxTransactionsPerTrigger or trigger(availableNow=True))"
                )
    partitions = None
    if "partitions" in given and given["partitions"].strip() not in ("", "all"):
        try:
            partitions = frozenset(parse_partition_ranges(given["partitions"]))
        except ValueError as e:
            raise WaltzOptionError(f"partitions: {e}") from None
    starting: Position = _offsets("startingOffsets", given.get("startingoffsets", "earliest"))
    ending: Position = _offsets("endingOffsets", given.get("endingoffsets", "latest"))
    if ending == "earliest":
        raise WaltzOptionError("endingOffsets: 'earliest' would read nothing; use latest or JSON")
    if isinstance(ending, dict) and any(v == EARLIEST for v in ending.values()):
        raise WaltzOptionError("endingOffsets: -2 (earliest) is not an ending offset")
    # Each option is checked, those a higher one overrides too; then the winner counts.
    starting_times = _by_time(given, "startingtimestamp", "startingoffsetsbytimestamp")
    ending_times = _by_time(given, "endingtimestamp", "endingoffsetsbytimestamp")
    if starting_times is not None:
        starting = starting_times
    if ending_times is not None:
        ending = ending_times
    if isinstance(starting, dict) and isinstance(ending, dict):
        for p, start in starting.items():
            end = ending.get(p)
            if start >= 0 and end is not None and end >= 0 and end < start:
                raise WaltzOptionError(
                    f"endingOffsets: partition {p} ends at {end}, before its starting "
                    f"offset {start}"
                )
    if isinstance(starting, ByTime) and isinstance(ending, ByTime):
        _check_times(starting, ending)
    strategy = given.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise WaltzOptionError(
            "startingOffsetsByTimestampStrategy: expected error or latest, got "
            f"{given['startingoffsetsbytimestampstrategy']!r}"
        )
    trigger = None
    if "maxtransactionspertrigger" in given:
        trigger = _integer(given, "maxtransactionspertrigger", 1)
    return ReadOptions(
        zookeeper=_zookeeper(given),
        zk_root=_root(given),
        partitions=partitions,
        starting=starting,
        ending=ending,
        by_timestamp_strategy=strategy,
        max_transactions_per_split=_integer(
            given, "maxtransactionspersplit", 1, ReadOptions.max_transactions_per_split
        ),
        max_transactions_per_trigger=trigger,
        fail_on_data_loss=_boolean(given, "failondataloss", True),
        request_timeout=_seconds(given, "requesttimeout", ReadOptions.request_timeout),
        fetch_records=_integer(given, "fetchrecords", 1, ReadOptions.fetch_records, 1_000_000),
        fetch_bytes=_integer(given, "fetchbytes", 1024, ReadOptions.fetch_bytes, 2**30),
        fetch_in_flight=_integer(given, "fetchinflight", 1, ReadOptions.fetch_in_flight, 64),
        tls=_tls(given),
        zk_tls=_tls(given, "zkTls"),
    )


def parse_write_options(options: Mapping[str, str], *, streaming: bool) -> WriteOptions:
    given = _lower(options, _WRITE)
    text = given.get("lockhighwatermark", "current" if streaming else "job").strip()
    marks = None
    if text.startswith("{"):
        mode = "given"
        marks = parse_offset_map(text, "lockHighWaterMark", low=LATEST)
    elif text.lower() in ("job", "current"):
        mode = text.lower()
    else:
        raise WaltzOptionError(
            f"lockHighWaterMark: expected job, current or a JSON object of partition -> "
            f"high-water mark, got {text!r}"
        )
    if streaming and mode != "current":
        raise WaltzOptionError(
            "lockHighWaterMark: only 'current' applies to a stream (it has no single start); "
            "job and explicit marks are for batch writes"
        )
    lock_name = given.get("lockname", WriteOptions.lock_name)
    if not lock_name:
        raise WaltzOptionError("lockName: must not be empty")
    return WriteOptions(
        zookeeper=_zookeeper(given),
        zk_root=_root(given),
        lock_name=lock_name,
        lock_high_water_mark=mode,
        lock_marks=marks,
        max_retries=_integer(given, "maxretries", 1, WriteOptions.max_retries),
        request_timeout=_seconds(given, "requesttimeout", WriteOptions.request_timeout),
        max_in_flight=_integer(given, "maxinflight", 1, WriteOptions.max_in_flight, 100_000),
        tls=_tls(given),
        zk_tls=_tls(given, "zkTls"),
    )


def parse_offset_map(text: str, name: str, low: int = EARLIEST) -> dict[int, int]:
    """``{"0": 120, "2": -1}``: partition ID -> transaction ID, -2 earliest, -1 latest
    (``low``: the smallest value allowed; 0 for a map of commit times)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise WaltzOptionError(f"{name}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(doc, dict) or not doc:
        example = (
            'commit time (ms) such as {"0": 1767225600000}'
            if low == 0
            else 'offset such as {"0": 120}'
        )
        raise WaltzOptionError(f"{name}: expected a JSON object of partition -> {example}")
    result: dict[int, int] = {}
    for key, value in doc.items():
        try:
            partition = int(key)
        except ValueError:
            raise WaltzOptionError(f"{name}: {key!r} is not a partition ID") from None
        if partition < 0:
            raise WaltzOptionError(f"{name}: partition {partition} is negative")
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            allowed = {
                EARLIEST: "a transaction ID >= 0, -2 (earliest) or -1 (latest)",
                LATEST: "a high-water mark >= -1",
                0: "a commit time >= 0 (ms since the Unix epoch)",
            }[low]
            raise WaltzOptionError(
                f"{name}: partition {partition}: expected {allowed}, got {value!r}"
            )
        result[partition] = value
    return result


def _offsets(name: str, text: str) -> OffsetSpec:
    word = text.strip()
    if word.lower() in ("earliest", "latest"):
        return word.lower()
    if word.startswith("{"):
        return parse_offset_map(word, name)
    raise WaltzOptionError(f"{name}: expected earliest, latest or a JSON object, got {text!r}")


def _by_time(given: dict[str, str], one: str, each: str) -> ByTime | None:
    """``one`` (a time for every partition) over ``each`` (a JSON map of partition ->
    time), as Kafka's source does; both are checked. None: neither is given."""
    times = None
    if each in given:
        times = ByTime(_SPELLING[each], parse_offset_map(given[each].strip(), _SPELLING[each], 0))
    if one in given:
        times = ByTime(_SPELLING[one], _integer(given, one, 0, high=_MAX_MILLIS))
    return times


_MAX_MILLIS = 2**63 // 1000 - 1  # microseconds, as Spark keeps a timestamp, fit in a long


def _check_times(starting: ByTime, ending: ByTime) -> None:
    """An ending time before its starting time is a mistake (an equal one reads
    nothing)."""
    if isinstance(starting.times, int) and isinstance(ending.times, int):
        if ending.times < starting.times:
            raise WaltzOptionError(
                f"{ending.option}: {ending.times} is before {starting.option} "
                f"{starting.times} (the end comes before the start)"
            )
        return
    named = [set(t.times) for t in (starting, ending) if isinstance(t.times, dict)]
    for p in sorted(set().union(*named)):
        start, end = starting.time_of(p), ending.time_of(p)
        if start is not None and end is not None and end < start:
            raise WaltzOptionError(
                f"{ending.option}: partition {p}: {end} is before {starting.option} {start} "
                "(the end comes before the start)"
            )


def _lower(options: Mapping[str, str], known: tuple[str, ...]) -> dict[str, str]:
    given = {str(k).lower(): str(v) for k, v in options.items()}
    unknown = sorted(k for k in given if k not in known and k not in _IGNORED)
    if unknown:
        names = ", ".join(_SPELLING[k] for k in known)
        raise WaltzOptionError(f"unknown option {unknown[0]!r}; the options are: {names}")
    return given


def _tls(given: dict[str, str], prefix: str = "tls") -> TlsFiles | None:
    """tlsCert, tlsKey, tlsCa (or zkTlsCert, zkTlsKey, zkTlsCa): PEM files (on the driver
    and every executor), as the client library's WaltzClientConfig.tls (zk_tls)."""
    key = prefix.lower()
    files = TlsFiles(
        given.get(f"{key}cert") or None,
        given.get(f"{key}key") or None,
        given.get(f"{key}ca") or None,
    )
    if not files.enabled:
        return None
    try:
        files.check("tls", listening=False)
    except TlsError as e:
        # "setting tls_cert: ..." -> "tlsCert: ..." (or "zkTlsCert: ...")
        message = str(e).removeprefix("setting ")
        for name in ("cert", "key", "ca"):
            message = message.replace(f"tls_{name}", prefix + name.capitalize())
        raise WaltzOptionError(message) from None
    return files


def _zookeeper(given: dict[str, str]) -> str:
    value = given.get("zookeeper", "").strip()
    if not value:
        raise WaltzOptionError(
            "zookeeper: required, the cluster's ZooKeeper connect string (host:port[,...])"
        )
    return value


def _root(given: dict[str, str]) -> str:
    try:
        return normalise_root(given.get("zkroot", "/waltz"))
    except ValueError as e:
        raise WaltzOptionError(f"zkRoot: {e}") from None


def _integer(
    given: dict[str, str], key: str, low: int, default: int | None = None, high: int = 2**62
) -> int:
    if key not in given:
        assert default is not None
        return default
    text = given[key].strip()
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise WaltzOptionError(
            f"{_SPELLING[key]}: expected an integer from {low} to {high}, got {text!r}"
        )
    return value


def _seconds(given: dict[str, str], key: str, default: float) -> float:
    if key not in given:
        return default
    text = given[key].strip()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise WaltzOptionError(
            f"{_SPELLING[key]}: expected a positive number of seconds, got {text!r}"
        )
    return value


def _boolean(given: dict[str, str], key: str, default: bool) -> bool:
    if key not in given:
        return default
    text = given[key].strip().lower()
    if text not in ("true", "false"):
        raise WaltzOptionError(f"{_SPELLING[key]}: expected true or false, got {given[key]!r}")
    return text == "true"
