"""The feed cache (contiguous headers up to the high-water mark) and the LRU data cache."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_server.caches import _ENTRY_OVERHEAD, HEADER_BYTES, DataCache, FeedCache

ENTRY = HEADER_BYTES + _ENTRY_OVERHEAD


def header(txid: int) -> bytes:
    return txid.to_bytes(8, "big", signed=True) + bytes(HEADER_BYTES - 8)


def feed(max_entries: int) -> FeedCache:
    cache = FeedCache(2 * max_entries * ENTRY)  # room for 2 x max_entries before a trim
    assert cache.max_entries == max_entries
    return cache


# --- FeedCache ------------------------------------------------------------------------


def test_header_bytes_is_the_packed_record_header_and_its_commit_time():
    assert HEADER_BYTES == 36  # TIMED_HEADER: what a version-3 feed row carries as is


def test_max_entries_from_bytes():
    """The cache may hold 2 x max_entries before trimming; that must fit the budget."""
    assert FeedCache(20 * ENTRY).max_entries == 10
    assert FeedCache(20 * ENTRY + 2 * ENTRY - 1).max_entries == 10
    assert FeedCache(0).max_entries == 1
    assert FeedCache(2 * ENTRY - 1).max_entries == 1


def test_new_feed_cache_is_empty_and_expects_transaction_zero():
    cache = feed(4)
    assert len(cache) == 0
    assert (cache.first, cache.last) == (0, -1)
    assert cache.get(0, 0) is None
    cache.add(0, header(0))
    assert (cache.first, cache.last, len(cache)) == (0, 0, 1)
    assert cache.get(0, 0) == [header(0)]


def test_feed_cache_refuses_a_gap_or_a_repeat():
    cache = feed(4)
    with pytest.raises(ValueError, match="expects transaction 0, got 1"):
        cache.add(1, header(1))
    for t in range(3):
        cache.add(t, header(t))
    with pytest.raises(ValueError, match="expects transaction 3, got 5"):
        cache.add(5, header(5))
    with pytest.raises(ValueError):
        cache.add(2, header(2))
    with pytest.raises(ValueError):
        cache.add(-1, header(-1))
    # Nothing changed.
    assert (cache.first, cache.last) == (0, 2)
    assert cache.get(0, 2) == [header(0), header(1), header(2)]
    cache.add(3, header(3))
    assert cache.last == 3


def test_reset_empties_and_sets_the_next_expected_transaction():
    cache = feed(4)
    for t in range(5):
        cache.add(t, header(t))
    cache.reset(41)
    assert len(cache) == 0
    assert (cache.first, cache.last) == (42, 41)
    assert cache.get(0, 3) is None
    assert cache.get(41, 41) is None
    with pytest.raises(ValueError, match="expects transaction 42"):
        cache.add(41, header(41))
    cache.add(42, header(42))
    assert cache.get(42, 42) == [header(42)]


def test_reset_backwards_after_a_truncation():
    cache = feed(8)
    for t in range(6):
        cache.add(t, header(t))
    cache.reset(2)  # recovery decided 2: transactions above are gone
    assert cache.get(0, 2) is None
    cache.add(3, b"new")
    assert cache.get(3, 3) == [b"new"]


def test_reset_to_an_empty_log():
    cache = feed(2)
    cache.add(0, header(0))
    cache.reset(-1)
    assert (cache.first, cache.last, len(cache)) == (0, -1, 0)
    cache.add(0, header(0))


def test_get_returns_none_unless_the_whole_range_is_cached():
    cache = feed(100)
    cache.reset(9)
    for t in range(10, 20):
        cache.add(t, header(t))
    assert cache.get(10, 19) == [header(t) for t in range(10, 20)]
    assert cache.get(12, 14) == [header(12), header(13), header(14)]
    assert cache.get(19, 19) == [header(19)]
    assert cache.get(9, 12) is None  # starts before the cache
    assert cache.get(15, 20) is None  # ends after the high-water mark
    assert cache.get(0, 30) is None
    assert cache.get(20, 25) is None
    assert cache.get(14, 13) is None  # empty range
    assert cache.get(21, 20) is None


def test_get_returns_a_copy():
    cache = feed(4)
    for t in range(3):
        cache.add(t, header(t))
    got = cache.get(0, 2)
    got.clear()
    assert cache.get(0, 2) == [header(0), header(1), header(2)]


def test_eviction_keeps_the_newest_and_bounds_the_entries():
    cache = feed(10)
    for t in range(1000):
        cache.add(t, header(t))
        assert len(cache) <= 2 * cache.max_entries
        assert cache.last == t
        assert cache.last - cache.first + 1 == len(cache)
        newest = max(0, t - cache.max_entries + 1)
        assert cache.get(newest, t) == [header(x) for x in range(newest, t + 1)]
    assert len(cache) >= cache.max_entries
    assert cache.get(0, 0) is None
    assert cache.get(cache.first - 1, cache.last) is None


def test_eviction_with_the_smallest_cache():
    cache = FeedCache(0)
    for t in range(50):
        cache.add(t, header(t))
        assert 1 <= len(cache) <= 2
        assert cache.get(t, t) == [header(t)]


_feed_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 30)),
        st.tuples(st.just("reset"), st.integers(-1, 200)),
        st.tuples(st.just("get"), st.tuples(st.integers(-5, 250), st.integers(-5, 250))),
        st.tuples(st.just("bad"), st.integers(-3, 3)),
    ),
    max_size=40,
)


@settings(max_examples=200)
@given(max_entries=st.integers(1, 12), ops=_feed_ops)
def test_feed_cache_against_a_model(max_entries, ops):
    cache = feed(max_entries)
    log: dict[int, bytes] = {}  # what the partition committed since the last reset
    next_txid = 0
    for op, arg in ops:
        if op == "add":
            for _ in range(arg):
                log[next_txid] = header(next_txid)
                cache.add(next_txid, log[next_txid])
                next_txid += 1
        elif op == "reset":
            cache.reset(arg)
            log = {}
            next_txid = arg + 1
        elif op == "bad":
            if arg == 0:
                continue
            with pytest.raises(ValueError):
                cache.add(next_txid + arg, b"x")
        else:
            start, stop = arg
            got = cache.get(start, stop)
            if got is not None:
                assert got == [log[t] for t in range(start, stop + 1)]
        # Invariants: contiguous up to the last added, the newest max_entries kept.
        assert cache.last == next_txid - 1
        assert len(cache) <= 2 * max_entries
        assert len(cache) <= len(log)
        kept = min(len(log), max_entries)
        if kept:
            first = next_txid - kept
            assert cache.get(first, next_txid - 1) == [log[t] for t in range(first, next_txid)]


# --- DataCache ------------------------------------------------------------------------


def data(size: int, fill: int = 0) -> bytes:
    return bytes([fill]) * size


def test_data_cache_put_and_get_count_hits_and_misses():
    cache = DataCache(10_000)
    assert cache.get(1) is None
    cache.put(1, b"one")
    cache.put(2, b"two")
    assert cache.get(1) == b"one"
    assert cache.get(2) == b"two"
    assert cache.get(3) is None
    assert (cache.hits, cache.misses) == (2, 2)
    assert len(cache) == 2
    assert cache.bytes == 2 * _ENTRY_OVERHEAD + 6


def test_empty_data_is_cached_and_a_hit():
    cache = DataCache(1000)
    cache.put(5, b"")
    assert cache.get(5) == b""
    assert (cache.hits, cache.misses) == (1, 0)
    assert cache.bytes == _ENTRY_OVERHEAD


def test_data_cache_evicts_the_least_recently_used():
    size = 36  # 100 bytes an entry with its overhead
    cache = DataCache(300)
    for t in (1, 2, 3):
        cache.put(t, data(size, t))
    assert cache.bytes == 300
    assert cache.get(1) == data(size, 1)  # 1 is now the most recently used
    cache.put(4, data(size, 4))
    assert cache.get(2) is None  # the least recently used went
    assert [cache.get(t) is not None for t in (1, 3, 4)] == [True, True, True]
    # Now 1, 3, 4 in that order of use: 5 evicts 1.
    cache.put(5, data(size, 5))
    assert cache.get(1) is None
    assert cache.bytes == 300
    assert len(cache) == 3


def test_a_miss_does_not_change_the_order():
    cache = DataCache(200)
    cache.put(1, data(36))
    cache.put(2, data(36))
    assert cache.get(7) is None
    cache.put(3, data(36))
    assert cache.get(1) is None
    assert cache.get(2) is not None


def test_putting_again_replaces_and_refreshes():
    cache = DataCache(300)
    cache.put(1, data(36))
    cache.put(2, data(36))
    cache.put(1, data(10, 9))  # replaced and now most recently used
    assert cache.bytes == 2 * _ENTRY_OVERHEAD + 36 + 10
    assert len(cache) == 2
    cache.put(3, data(36))
    cache.put(4, data(36))  # evicts 2, the least recently used
    assert cache.get(2) is None
    assert cache.get(1) == data(10, 9)


def test_eviction_frees_enough_for_a_large_entry():
    cache = DataCache(1000)
    for t in range(10):
        cache.put(t, data(36))  # 100 each: full
    cache.put(99, data(1000 - _ENTRY_OVERHEAD))  # exactly the whole budget
    assert len(cache) == 1
    assert cache.bytes == 1000
    assert cache.get(99) is not None


def test_an_oversized_value_replaces_the_cached_one_by_nothing():
    cache = DataCache(1000)
    cache.put(1, data(36))
    cache.put(1, data(1000))
    assert cache.get(1) is None
    assert cache.bytes == 0


def test_oversized_entries_are_not_cached():
    cache = DataCache(1000)
    cache.put(1, data(36))
    cache.put(2, data(1000 - _ENTRY_OVERHEAD + 1))
    assert cache.get(2) is None
    assert cache.get(1) == data(36)  # nothing was evicted for it
    assert cache.bytes == 100
    assert len(cache) == 1


def test_a_cache_smaller_than_the_overhead_caches_nothing():
    cache = DataCache(_ENTRY_OVERHEAD - 1)
    cache.put(1, b"")
    assert len(cache) == 0
    assert cache.bytes == 0


def test_drop_above_removes_only_higher_transactions():
    cache = DataCache(10_000)
    for t in range(10):
        cache.put(t, data(t))
    cache.drop_above(4)
    assert len(cache) == 5
    assert cache.bytes == sum(t + _ENTRY_OVERHEAD for t in range(5))
    assert [cache.get(t) is not None for t in range(10)] == [True] * 5 + [False] * 5
    cache.drop_above(-1)
    assert len(cache) == 0
    assert cache.bytes == 0


def test_drop_above_keeps_the_lru_order():
    cache = DataCache(300)
    for t in (5, 1, 9, 2):  # 5 is evicted on 2; order 1, 9, 2
        cache.put(t, data(36))
    cache.drop_above(3)  # order 1, 2
    cache.put(3, data(36))
    cache.put(4, data(36))  # evicts 1
    assert cache.get(1) is None
    assert [cache.get(t) is not None for t in (2, 3, 4)] == [True, True, True]


def test_clear_empties_but_keeps_the_counters():
    cache = DataCache(1000)
    cache.put(1, b"x")
    cache.get(1)
    cache.get(2)
    cache.clear()
    assert len(cache) == 0
    assert cache.bytes == 0
    assert (cache.hits, cache.misses) == (1, 1)
    assert cache.get(1) is None


_data_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 15), st.integers(0, 300)),
        st.tuples(st.just("get"), st.integers(0, 15), st.just(0)),
        st.tuples(st.just("drop"), st.integers(-1, 15), st.just(0)),
        st.tuples(st.just("clear"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300)
@given(max_bytes=st.integers(0, 1200), ops=_data_ops)
def test_data_cache_against_an_lru_model(max_bytes, ops):
    cache = DataCache(max_bytes)
    model: OrderedDict[int, bytes] = OrderedDict()
    hits = misses = 0

    def cost(value: bytes) -> int:
        return len(value) + _ENTRY_OVERHEAD

    for op, txid, size in ops:
        if op == "put":
            value = data(size, txid)
            model.pop(txid, None)  # an oversized value still replaces (drops) the old one
            if cost(value) <= max_bytes:
                model[txid] = value
                while sum(map(cost, model.values())) > max_bytes:
                    model.popitem(last=False)
            cache.put(txid, value)
        elif op == "get":
            expected = model.get(txid)
            if expected is None:
                misses += 1
            else:
                hits += 1
                model.move_to_end(txid)
            assert cache.get(txid) == expected
        elif op == "drop":
            for t in [t for t in model if t > txid]:
                del model[t]
            cache.drop_above(txid)
        else:
            model.clear()
            cache.clear()
        assert cache.bytes == sum(map(cost, model.values()))
        assert cache.bytes <= max_bytes
        assert len(cache) == len(model)
        assert (cache.hits, cache.misses) == (hits, misses)
