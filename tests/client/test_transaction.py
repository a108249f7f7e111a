"""Locks, TransactionBuilder, TransactionContext and Transaction (lazy, cached data)."""

from __future__ import annotations

import asyncio
import json
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_client.transaction import Lock, Transaction, TransactionBuilder, TransactionContext
from waltz_client.wire.records import ReqId

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# --- Lock.hash32 --------------------------------------------------------------------


def is_int32(v: object) -> bool:
    return type(v) is int and INT32_MIN <= v <= INT32_MAX


@given(st.text(), st.integers(min_value=-(2**63), max_value=2**64))
def test_hash32_is_a_deterministic_signed_int32(name: str, lock_id: int) -> None:
    h = Lock(name, lock_id).hash32()
    assert is_int32(h)
    assert Lock(name, lock_id).hash32() == h


def test_hash32_known_value() -> None:
    # pinned: the crc32 of utf-8 name + 8-byte big-endian id, as a signed int
    raw = b"account" + (42).to_bytes(8, "big")
    expected = zlib.crc32(raw)
    expected = expected - 2**32 if expected >= 2**31 else expected
    assert Lock("account", 42).hash32() == expected


def test_hash32_covers_both_signs() -> None:
    hashes = [Lock("x", i).hash32() for i in range(200)]
    assert any(h < 0 for h in hashes)
    assert any(h >= 0 for h in hashes)


def test_hash32_distribution_over_names_and_ids() -> None:
    locks = {Lock(f"name{i % 50}", i // 50) for i in range(5000)}
    assert len(locks) == 5000
    hashes = {lock.hash32() for lock in locks}
    assert len(hashes) >= 0.99 * len(locks)


def test_hash32_distribution_over_ids() -> None:
    hashes = {Lock("account", i).hash32() for i in range(-2500, 2500)}
    assert len(hashes) >= 0.99 * 5000


def test_hash32_differs_for_names_and_ids() -> None:
    assert Lock("a", 1).hash32() != Lock("b", 1).hash32()
    assert Lock("a", 1).hash32() != Lock("a", 2).hash32()
    assert Lock("a", 0).hash32() != Lock("a", -1).hash32()
    assert Lock("", 0).hash32() != Lock("\x00", 0).hash32()


@pytest.mark.parametrize(
    "lock_id", [-1, -(2**63), 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**200, -(2**200)]
)
def test_hash32_negative_and_huge_ids(lock_id: int) -> None:
    assert is_int32(Lock("big", lock_id).hash32())


def test_hash32_unicode_names() -> None:
    assert is_int32(Lock("ключ-🔒", 5).hash32())
    assert Lock("é", 5).hash32() != Lock("e", 5).hash32()


def test_lock_is_a_hashable_value() -> None:
    assert Lock("a", 1) == Lock("a", 1)
    assert len({Lock("a", 1), Lock("a", 1), Lock("a", 2)}) == 2


# --- TransactionBuilder ----------------------------------------------------------------


def builder() -> TransactionBuilder:
    return TransactionBuilder(3, 41)


def test_builder_defaults() -> None:
    b = builder()
    assert b.partition_id == 3
    assert b.client_high_water_mark == 41
    assert b.header == 0
    assert b.data == b""
    assert b.write_locks == b.read_locks == b.append_locks == []


@pytest.mark.parametrize("header", [0, 1, -1, INT32_MAX, INT32_MIN])
def test_set_header_in_range(header: int) -> None:
    b = builder()
    b.set_header(header)
    assert b.header == header


@pytest.mark.parametrize("header", [2**31, -(2**31) - 1, 2**63, -(2**63)])
def test_set_header_out_of_range(header: int) -> None:
    b = builder()
    b.set_header(7)
    with pytest.raises(ValueError, match="32-bit"):
        b.set_header(header)
    assert b.header == 7


@given(st.integers())
def test_set_header_accepts_exactly_int32(header: int) -> None:
    b = builder()
    if INT32_MIN <= header <= INT32_MAX:
        b.set_header(header)
        assert b.header == header
    else:
        with pytest.raises(ValueError):
            b.set_header(header)


def test_set_header_refuses_floats() -> None:
    with pytest.raises((TypeError, ValueError)):
        builder().set_header(1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "data", [b"abc", bytearray(b"abc"), memoryview(b"abc"), memoryview(b"xabcx")[1:4]]
)
def test_set_data_bytes_like(data) -> None:
    b = builder()
    b.set_data(data)
    assert b.data == b"abc"
    assert type(b.data) is bytes


def test_set_data_copies_a_bytearray() -> None:
    buf = bytearray(b"abc")
    b = builder()
    b.set_data(buf)
    buf[0] = ord("z")
    assert b.data == b"abc"


def test_set_data_empty() -> None:
    b = builder()
    b.set_data(b"x")
    b.set_data(b"")
    assert b.data == b""


class JsonSerializer:
    def __init__(self) -> None:
        self.serialized: list[object] = []

    def serialize(self, value: object) -> bytes:
        self.serialized.append(value)
        return json.dumps(value, sort_keys=True).encode()

    def deserialize(self, data: bytes) -> object:
        return json.loads(data)


def test_set_data_with_serializer() -> None:
    s = JsonSerializer()
    b = builder()
    b.set_data({"k": [1, 2]}, s)
    assert b.data == b'{"k": [1, 2]}'
    assert s.serialized == [{"k": [1, 2]}]
    assert s.deserialize(b.data) == {"k": [1, 2]}


def test_set_data_with_serializer_of_a_string() -> None:
    b = builder()
    b.set_data("hé", JsonSerializer())
    assert json.loads(b.data) == "hé"


@pytest.mark.parametrize("data", ["text", 5, None, [1, 2], {"a": 1}])
def test_set_data_without_serializer_needs_bytes(data) -> None:
    b = builder()
    b.set_data(b"keep")
    with pytest.raises(TypeError, match="serializer"):
        b.set_data(data)
    assert b.data == b"keep"


def test_set_data_serializer_returning_text_is_refused() -> None:
    class Bad:
        def serialize(self, value: object) -> str:
            return str(value)

        def deserialize(self, data: bytes) -> object:
            return data

    with pytest.raises(TypeError):
        builder().set_data(1, Bad())  # type: ignore[arg-type]


def test_lock_setters() -> None:
    b = builder()
    w, r, a = Lock("w", 1), Lock("r", 2), Lock("a", 3)
    b.set_write_locks(w, r)
    b.set_read_locks(r)
    b.set_append_locks(a, a)
    assert b.write_locks == [w, r]
    assert b.read_locks == [r]
    assert b.append_locks == [a, a]
    b.set_write_locks()
    assert b.write_locks == []
    assert b.read_locks == [r]


def test_lock_setters_replace_not_append() -> None:
    b = builder()
    b.set_read_locks(Lock("a", 1))
    b.set_read_locks(Lock("b", 2))
    assert b.read_locks == [Lock("b", 2)]


def test_lock_setters_store_lists() -> None:
    b = builder()
    b.set_write_locks(Lock("a", 1))
    assert isinstance(b.write_locks, list)


# --- TransactionContext ---------------------------------------------------------------------


def test_context_needs_execute() -> None:
    with pytest.raises(TypeError):
        TransactionContext()  # type: ignore[abstract]

    class NoExecute(TransactionContext):
        pass

    with pytest.raises(TypeError):
        NoExecute()  # type: ignore[abstract]


def test_context_hooks_are_optional() -> None:
    class Minimal(TransactionContext):
        def execute(self, builder: TransactionBuilder) -> bool:
            builder.set_data(b"x")
            return True

    ctx = Minimal()
    assert ctx.max_retries is None
    assert ctx.partition_id(8) == 0
    assert ctx.on_completion(True) is None
    assert ctx.on_completion(False) is None
    assert ctx.on_lock_failure(12) is None
    assert ctx.on_exception(RuntimeError("boom")) is None
    b = builder()
    assert ctx.execute(b) is True
    assert b.data == b"x"


# --- Transaction -------------------------------------------------------------------------


class Fetchers:
    def __init__(self, payload: bytes = b"payload") -> None:
        self.payload = payload
        self.async_calls = 0
        self.blocking_calls = 0

    async def fetch(self) -> bytes:
        self.async_calls += 1
        await asyncio.sleep(0)
        return self.payload

    def fetch_blocking(self) -> bytes:
        self.blocking_calls += 1
        return self.payload

    def transaction(self, txid: int = 5, partition: int = 2) -> Transaction:
        return Transaction(
            txid, partition, 99, ReqId(1, 1, partition, txid), self.fetch, self.fetch_blocking
        )


def test_transaction_fields() -> None:
    t = Fetchers().transaction(7, 3)
    assert (t.transaction_id, t.partition_id, t.header) == (7, 3, 99)
    assert t.req_id == ReqId(1, 1, 3, 7)
    assert "fetch" not in repr(t)


def test_data_blocking_fetches_once() -> None:
    f = Fetchers()
    t = f.transaction()
    assert t.data_blocking() == b"payload"
    assert t.data_blocking() == b"payload"
    assert (f.blocking_calls, f.async_calls) == (1, 0)


def test_data_fetches_once() -> None:
    f = Fetchers()
    t = f.transaction()

    async def main() -> list[bytes]:
        return [await t.data(), await t.data(), await t.data()]

    assert asyncio.run(main()) == [b"payload"] * 3
    assert (f.async_calls, f.blocking_calls) == (1, 0)


def test_async_and_blocking_share_the_cache() -> None:
    f = Fetchers()
    t = f.transaction()
    assert asyncio.run(t.data()) == b"payload"
    assert t.data_blocking() == b"payload"
    assert (f.async_calls, f.blocking_calls) == (1, 0)

    g = Fetchers()
    u = g.transaction()
    assert u.data_blocking() == b"payload"
    assert asyncio.run(u.data()) == b"payload"
    assert (g.async_calls, g.blocking_calls) == (0, 1)


def test_empty_data_is_cached_too() -> None:
    f = Fetchers(b"")
    t = f.transaction()
    assert t.data_blocking() == b""
    assert t.data_blocking() == b""
    assert f.blocking_calls == 1


def test_failed_fetch_is_not_cached() -> None:
    calls = []

    def flaky() -> bytes:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("server gone")
        return b"ok"

    async def never() -> bytes:
        raise AssertionError("not used")

    t = Transaction(1, 0, 0, ReqId(1, 1, 0, 1), never, flaky)
    with pytest.raises(ConnectionError):
        t.data_blocking()
    assert t.data_blocking() == b"ok"
    assert t.data_blocking() == b"ok"
    assert len(calls) == 2


def test_deserialize_uses_the_cached_data() -> None:
    f = Fetchers(b'{"a": 1}')
    t = f.transaction()
    assert t.deserialize(JsonSerializer()) == {"a": 1}
    assert t.deserialize(JsonSerializer()) == {"a": 1}
    assert f.blocking_calls == 1


def test_concurrent_data_calls_fetch_once() -> None:
    f = Fetchers()
    t = f.transaction()

    async def main() -> list[bytes]:
        return list(await asyncio.gather(t.data(), t.data()))

    assert asyncio.run(main()) == [b"payload", b"payload"]
    assert f.async_calls == 1


def test_a_failing_notification_hook_is_logged_not_raised(caplog) -> None:
    from waltz_client.client import _hook

    class Noisy(TransactionContext):
        def execute(self, builder: TransactionBuilder) -> bool:
            return True

        def on_completion(self, committed: bool) -> None:
            raise ValueError("the application's bug")

    with caplog.at_level("ERROR", logger="waltz_client.client"):
        _hook(Noisy(), "on_completion", True)
    assert "Noisy.on_completion raised" in caplog.text
    assert "ValueError: the application's bug" in caplog.text
