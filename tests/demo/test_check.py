"""``waltz check`` against a running cluster: appends with contended locks, follows the
feed, reads back, and says PASS; a cluster that is not there is one error line."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)


def waltz_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "waltz_client.tools.cli", "check", *args],
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_check_passes_on_a_running_cluster(make_cluster):
    cluster = make_cluster(partitions=3)
    proc = waltz_check(
        "-z", cluster.zookeeper_connect, "--root", cluster.layout.root, "--transactions", "300"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("appended 300 of 300 in ")
    assert "lock retries" in lines[0]
    assert lines[1] == "feed: 300 transactions applied, 0 gaps; range reads: 300 found"
    assert lines[-1] == "PASS"
    # Again: it starts from where the log is now.
    again = waltz_check("-z", cluster.zookeeper_connect, "--root", cluster.layout.root)
    assert again.returncode == 0 and again.stdout.splitlines()[-1] == "PASS"


def test_check_without_a_cluster_is_one_error_line(zookeeper):
    proc = waltz_check("-z", zookeeper.connect_string, "--root", "/no-such-cluster")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("waltz check:")]
    assert errors and "no Waltz cluster at /no-such-cluster" in errors[0], proc.stderr


def test_a_transaction_whose_data_cannot_be_fetched_is_applied_when_delivered_again():
    """The follower applies nothing until it has the data: the client then delivers the
    transaction again from the follower's high-water mark, and it counts once, no gap."""
    import asyncio

    from waltz_client.tools.demo.check import _Follower

    class Delivered:
        partition_id = 0

        def __init__(self, txid: int, data: bytes, failures: int) -> None:
            self.transaction_id, self._data, self._failures = txid, data, failures
            self.timestamp = 1_800_000_000_000 + txid

        async def data(self) -> bytes:
            if self._failures:
                self._failures -= 1
                raise RuntimeError("the server is moving the partition")
            return self._data

    async def scenario() -> _Follower:
        follower = _Follower({0: 9})
        first = Delivered(10, b"ten", failures=1)
        with pytest.raises(RuntimeError):
            await follower.apply_transaction(first)
        assert await follower.client_high_water_mark(0) == 9  # where delivery resumes
        await follower.apply_transaction(first)
        await follower.apply_transaction(Delivered(11, b"eleven", failures=0))
        return follower

    follower = asyncio.run(scenario())
    assert follower.seen == {b"ten": [(0, 10)], b"eleven": [(0, 11)]}
    assert follower.gaps == [] and follower.applied == {0: 11}
    assert follower.times == {(0, 10): 1_800_000_000_010, (0, 11): 1_800_000_000_011}
    assert follower.backwards == []


def test_the_check_notices_a_commit_time_going_back() -> None:
    import asyncio

    from waltz_client.tools.demo.check import _Follower

    class Delivered:
        partition_id = 0

        def __init__(self, txid: int, stamp: int | None) -> None:
            self.transaction_id, self.timestamp = txid, stamp

        async def data(self) -> bytes:
            return b"%d" % self.transaction_id

    async def scenario() -> _Follower:
        follower = _Follower({0: -1})
        for txid, stamp in enumerate((None, 5_000, 5_000, 4_999, 6_000)):
            await follower.apply_transaction(Delivered(txid, stamp))
        return follower

    follower = asyncio.run(scenario())
    assert follower.backwards == ["partition 0: transaction 3 committed at 4999, after one at 5000"]
