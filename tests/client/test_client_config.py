"""WaltzClientConfig: defaults, normalisation, and every bad setting rejected by name."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_client import WaltzClient, WaltzClientCallbacks, WaltzClientConfig, WaltzConfigError

ZK = "localhost:2181"


def bad(name: str, **kwargs) -> WaltzConfigError:
    """Make a config with one bad setting; return the error after checking its prefix."""
    kwargs.setdefault("zookeeper", ZK)
    with pytest.raises(WaltzConfigError) as info:
        WaltzClientConfig(**kwargs)
    message = str(info.value)
    assert message.startswith(f"WaltzClientConfig.{name}:"), message
    return info.value


# --- defaults and normalisation -------------------------------------------------------


def test_defaults() -> None:
    c = WaltzClientConfig(ZK)
    assert c.zookeeper == ZK
    assert c.zk_root == "/waltz"
    assert c.partitions is None
    assert c.max_outstanding_appends == 1000
    assert c.max_retries == 20
    assert c.request_timeout == 30.0
    assert c.mount_timeout == 60.0
    assert c.retry_backoff == 0.05
    assert c.zk_session_timeout == 10.0
    assert c.zk_connect_timeout == 10.0
    assert c.feed is True
    assert c.extra == {}


def test_extra_default_is_not_shared() -> None:
    a, b = WaltzClientConfig(ZK), WaltzClientConfig(ZK)
    a.extra["x"] = 1
    assert b.extra == {}


def test_frozen() -> None:
    c = WaltzClientConfig(ZK)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.max_retries = 3  # type: ignore[misc]


def test_is_a_value_error() -> None:
    assert issubclass(WaltzConfigError, ValueError)


@pytest.mark.parametrize(
    ("given_root", "normal"),
    [
        ("waltz/", "/waltz"),
        ("/waltz", "/waltz"),
        ("waltz", "/waltz"),
        ("//waltz//prod/", "/waltz/prod"),
        ("  /a/b  ", "/a/b"),
    ],
)
def test_zk_root_is_normalised(given_root: str, normal: str) -> None:
    assert WaltzClientConfig(ZK, zk_root=given_root).zk_root == normal


def test_normalised_configs_compare_equal() -> None:
    assert WaltzClientConfig(ZK, zk_root="waltz/") == WaltzClientConfig(ZK)


@pytest.mark.parametrize("parts", [[0, 1, 2], (2, 1), {3}, range(4), [1, 1, 2]])
def test_partitions_become_a_frozenset(parts) -> None:
    c = WaltzClientConfig(ZK, partitions=parts)
    assert isinstance(c.partitions, frozenset)
    assert c.partitions == frozenset(parts)


def test_partitions_from_a_generator() -> None:
    c = WaltzClientConfig(ZK, partitions=(p for p in (4, 5)))
    assert c.partitions == frozenset({4, 5})


def test_empty_partitions_accepted() -> None:
    assert WaltzClientConfig(ZK, partitions=[]).partitions == frozenset()


def test_good_values_accepted() -> None:
    c = WaltzClientConfig(
        "a:1,b:2",
        zk_root="/x/y",
        partitions={0},
        max_outstanding_appends=1,
        max_retries=1,
        request_timeout=1,
        mount_timeout=0.001,
        retry_backoff=2,
        zk_session_timeout=0.5,
        feed=False,
    )
    assert c.max_outstanding_appends == 1
    assert c.request_timeout == 1


@given(
    st.integers(min_value=1, max_value=10**9),
    st.floats(min_value=1e-9, max_value=1e9, allow_nan=False),
)
def test_any_positive_values_accepted(n: int, t: float) -> None:
    c = WaltzClientConfig(ZK, max_outstanding_appends=n, max_retries=n, request_timeout=t)
    assert c.max_outstanding_appends == n
    assert c.request_timeout == t


# --- bad values -----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", "   ", None, 2181, b"localhost:2181", ["a:1"]])
def test_bad_zookeeper(value) -> None:
    bad("zookeeper", zookeeper=value)


@pytest.mark.parametrize(
    "value",
    ["", "/", "//", "   ", "/a/../b", "/a/./b", "..", "/zookeeper", "zookeeper/x", None, 5],
)
def test_bad_zk_root(value) -> None:
    bad("zk_root", zk_root=value)


@pytest.mark.parametrize("value", ["0,1", "1", b"\x00", 3, 1.5, object()])
def test_partitions_not_a_collection(value) -> None:
    bad("partitions", partitions=value)


@pytest.mark.parametrize("value", [[-1], [0, -5], [1.0], ["1"], [True], [False, 1], [None]])
def test_bad_partition_ids(value) -> None:
    bad("partitions", partitions=value)


@pytest.mark.parametrize("name", ["max_outstanding_appends", "max_retries"])
@pytest.mark.parametrize("value", [0, -1, True, False, 1.0, 2.5, "10", None])
def test_bad_counts(name: str, value) -> None:
    bad(name, **{name: value})


@pytest.mark.parametrize(
    "name",
    [
        "request_timeout",
        "mount_timeout",
        "retry_backoff",
        "zk_session_timeout",
        "zk_connect_timeout",
    ],
)
@pytest.mark.parametrize("value", [0, 0.0, -0.0, -1, -1e-9, True, False, "30", None])
def test_bad_timeouts(name: str, value) -> None:
    bad(name, **{name: value})


def test_first_bad_setting_is_named() -> None:
    bad("zookeeper", zookeeper="", max_retries=0)
    bad("max_outstanding_appends", max_outstanding_appends=0, max_retries=0)


def test_mixed_type_partition_ids() -> None:
    bad("partitions", partitions=[1, "a"])


def test_unhashable_partition_ids() -> None:
    bad("partitions", partitions=[[1]])


def test_bytes_zk_root() -> None:
    bad("zk_root", zk_root=b"/waltz")


@pytest.mark.parametrize(
    "name",
    [
        "request_timeout",
        "mount_timeout",
        "retry_backoff",
        "zk_session_timeout",
        "zk_connect_timeout",
    ],
)
def test_nan_timeouts(name: str) -> None:
    bad(name, **{name: math.nan})


# --- WaltzClient construction -----------------------------------------------------------


class NoCallbacks(WaltzClientCallbacks):
    def client_high_water_mark(self, partition_id: int) -> int:
        return -1

    def apply_transaction(self, transaction) -> None:
        pass


def test_client_with_feed_needs_callbacks() -> None:
    with pytest.raises(TypeError, match="callbacks"):
        WaltzClient(WaltzClientConfig(ZK), None)
    with pytest.raises(TypeError, match="callbacks"):
        WaltzClient(WaltzClientConfig(ZK))


@pytest.mark.parametrize("config", ["not a config", None, {"zookeeper": ZK}])
def test_client_needs_a_config(config) -> None:
    with pytest.raises(TypeError, match="WaltzClientConfig"):
        WaltzClient(config)  # type: ignore[arg-type]


def test_client_construction_does_not_connect() -> None:
    # an unroutable address: constructing must neither block nor fail
    config = WaltzClientConfig("192.0.2.1:2181", feed=False)
    client = WaltzClient(config)
    assert client.config is config
    assert client.callbacks is None
    client2 = WaltzClient(WaltzClientConfig("192.0.2.1:2181"), NoCallbacks())
    assert isinstance(client2.callbacks, NoCallbacks)
    for c in (client, client2):
        c._executor.shutdown(wait=False)


def test_a_client_waits_zk_connect_timeout_for_a_dead_zookeeper() -> None:
    """start() gives up after zk_connect_timeout (it was a fixed 10 s), naming the wait."""
    import asyncio
    import socket
    import time

    from waltz_client import WaltzClient
    from waltz_client.cluster.errors import ClusterError

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    config = WaltzClientConfig(address, feed=False, zk_connect_timeout=1.5)

    async def start() -> None:
        async with WaltzClient(config):
            pass

    began = time.monotonic()
    with pytest.raises(ClusterError, match=f"ZooKeeper at {address} did not answer within 1.5 s"):
        asyncio.run(start())
    assert time.monotonic() - began < 8  # the old fixed wait alone was 10 s
