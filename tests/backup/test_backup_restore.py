"""Backup and restore on real clusters (shared ZooKeeper, storage and server processes, real
files), through the `waltz backup` and `waltz restore` commands:

- a backup taken while appends go on copies every partition exactly up to the
  high-water marks it recorded; a second run copies only what is new, leaving the first
  run's files untouched; the restore of it comes up with the normal daemons and serves
  every transaction with the same ID, ReqId, header and data, feeds an application from
  its own high-water mark, and appends after them;
- a log that starts above 0 (retention) is backed up from its start and restored to
  start there; an incremental run that finds the log start beyond what it holds says
  that the gap cannot be filled;
- a damaged backup (a flipped byte in a chunk, a truncated chunk, an edited manifest)
  is refused naming the file, and nothing is restored; so is a non-empty target.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import uuid

import pytest

from waltz_client import (
    MissingTransactions,
    WaltzClient,
    WaltzClientCallbacks,
    WaltzClientConfig,
)
from waltz_client.cluster import admin
from waltz_client.cluster.metadata import UNRESOLVED
from waltz_client.cluster.zk import close, connect
from waltz_client.tools.backup.format import MANIFEST_NAME, BackupError, Manifest, read_chunk
from waltz_client.tools.cli import main as waltz_main
from waltz_client.tools.demo.common import FAST_FAILOVER
from waltz_client.tools.local.cluster import LocalCluster
from waltz_client.transaction import Transaction, TransactionBuilder, TransactionContext
from waltz_client.wire.records import NO_TIMESTAMP, Record

pytestmark = pytest.mark.timeout(180)


class Put(TransactionContext):
    def __init__(self, i: int) -> None:
        self.i = i

    def partition_id(self, num_partitions: int) -> int:
        return self.i % num_partitions

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(self.i)
        builder.set_data(payload(self.i))
        return True


def payload(i: int) -> bytes:
    """Different per transaction, 1 byte to about 2 KiB."""
    return (f"transaction {i};".encode() * 200)[: 1 + (i * 37) % 2000]


def config(cluster: LocalCluster, **kw) -> WaltzClientConfig:
    return WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root, **kw)


def waltz(capsys, *argv: str) -> tuple[int, str, str]:
    """Run the `waltz` command in this process: (exit status, stdout, stderr)."""
    try:
        waltz_main(list(argv))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def backup_args(cluster: LocalCluster, path: str, *more: str) -> list[str]:
    return ["backup", path, "-z", cluster.zookeeper_connect, "--root", cluster.layout.root, *more]


def restore_args(target: LocalCluster, path: str, *more: str) -> list[str]:
    storages = [
        f"--storage={address}={os.path.join(target.data_dir, f'storage-{i}')}"
        for i, address in enumerate(target.layout.storage_addresses)
    ]
    return [
        "restore",
        path,
        "-z",
        target.zookeeper_connect,
        "--root",
        target.layout.root,
        *storages,
        *more,
    ]


def new_cluster(zookeeper, directory: str, *, partitions: int, storages: int) -> LocalCluster:
    """A cluster not started yet: its ports (the storage addresses) are chosen, its storage
    directories do not exist."""
    return LocalCluster(
        directory,
        storages=storages,
        partitions=partitions,
        replicas=min(3, storages),
        root=f"/waltz-restored-{uuid.uuid4().hex}",
        servers=1,
        server_args=FAST_FAILOVER,
        external_zookeeper=zookeeper.connect_string,
    )


async def read_all(cluster: LocalCluster) -> dict[int, list[Record]]:
    async with WaltzClient(config(cluster, feed=False)) as client:
        out = {}
        for p in range(client.num_partitions):
            hwm = await client.high_water_mark(p)
            out[p] = [r async for r in client.read(p, 0, hwm)] if hwm >= 0 else []
        return out


def backup_records(path: str, partition: int) -> list[Record]:
    m = Manifest.read(path)
    return [
        r
        for f in m.partitions[partition].files
        for batch in read_chunk(path, partition, f)
        for r in batch.records()
    ]


def chunk_files(path: str) -> dict[str, tuple[int, int, int]]:
    """Relative chunk path -> (inode, size, mtime_ns)."""
    out = {}
    for folder in sorted(os.listdir(path)):
        if folder.startswith("partition-"):
            for name in os.listdir(os.path.join(path, folder)):
                st = os.stat(os.path.join(path, folder, name))
                out[f"{folder}/{name}"] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


class Follower(WaltzClientCallbacks):
    def __init__(self, start: dict[int, int]) -> None:
        self.applied = dict(start)
        self.seen: dict[int, list[tuple[int, int, bytes]]] = {p: [] for p in start}

    async def client_high_water_mark(self, partition_id: int) -> int:
        return self.applied[partition_id]

    async def apply_transaction(self, transaction: Transaction) -> None:
        p = transaction.partition_id
        assert transaction.transaction_id == self.applied[p] + 1
        self.seen[p].append(
            (transaction.transaction_id, transaction.header, await transaction.data())
        )
        self.applied[p] = transaction.transaction_id


def test_round_trip_under_load_incremental_and_restore(make_cluster, zookeeper, tmp_path, capsys):
    source = make_cluster(partitions=3, storages=3)
    path = str(tmp_path / "backup")
    committed: dict[tuple[int, int], int] = {}  # (partition, transaction ID) -> i

    async def load(client: WaltzClient, first: int, stop: asyncio.Event, least: int) -> int:
        i = first
        while not stop.is_set() or i < first + least:
            contexts = [Put(k) for k in range(i, i + 60)]
            results = await asyncio.gather(*(client.submit(c) for c in contexts))
            for c, r in zip(contexts, results, strict=True):
                assert r.committed, r
                committed[(c.i % 3, r.transaction_id)] = c.i
            i += 60
        return i

    async def first_run() -> tuple[int, int]:
        async with WaltzClient(config(source, feed=False)) as client:
            stop, stopped = asyncio.Event(), asyncio.Event()
            stopped.set()
            await load(client, 0, stopped, 300)  # something before the backup starts
            appending = asyncio.ensure_future(load(client, 300, stop, 600))
            await asyncio.sleep(0.3)
            code, _out, err = await asyncio.to_thread(
                waltz, capsys, *backup_args(source, path, "--chunk-size", "64KiB")
            )
            assert code == 0, err
            stop.set()
            appended = await appending
            assert not appending.exception()
            return appended, code

    appended, _ = asyncio.run(first_run())
    m1 = Manifest.read(path)
    marks1 = {p: b.high_water_mark for p, b in m1.partitions.items()}
    source_log = asyncio.run(read_all(source))
    for p in range(3):
        # Appends went on during the run: the backup stops exactly at the mark it recorded.
        assert 0 < marks1[p] < source_log[p][-1].transaction_id
        assert m1.partitions[p].first == 0
        assert backup_records(path, p) == source_log[p][: marks1[p] + 1]
        assert len(m1.partitions[p].files) > 1  # 64 KiB chunks
    first_files = chunk_files(path)
    # What a run stopped half way leaves: a chunk it did not finish, not in the manifest.
    stray = f"partition-1/{marks1[1] + 1:019d}.chunk.tmp"
    with open(os.path.join(path, stray), "wb") as f:
        f.write(b"half a chunk")

    # The incremental run: only what is new, the first run's files untouched.
    code, out, err = waltz(capsys, *backup_args(source, path, "--chunk-size", "64KiB", "--json"))
    assert code == 0, err
    assert f"removing {stray}" in err and not os.path.exists(os.path.join(path, stray))
    report = json.loads(out)
    m2 = Manifest.read(path)
    assert len(m2.runs) == 2
    for p in range(3):
        hwm = source_log[p][-1].transaction_id
        assert report["partitions"][str(p)]["copied"] == [marks1[p] + 1, hwm]
        assert m2.partitions[p].high_water_mark == hwm
        assert backup_records(path, p) == source_log[p]
    now = chunk_files(path)
    assert {k: now[k] for k in first_files} == first_files
    assert all(
        int(name.rsplit("/", 1)[1][:19]) > marks1[int(name.split("/")[0].split("-")[1])]
        for name in set(now) - set(first_files)
    )
    # Every acknowledged append is in the backup, at its ID, with its header and data.
    backed = {p: {r.transaction_id: r for r in backup_records(path, p)} for p in range(3)}
    assert len(committed) == appended
    for (p, txid), i in committed.items():
        record = backed[p][txid]
        assert (record.header, record.data) == (i, payload(i))
    code, out, err = waltz(capsys, "backup", path, "--verify")
    assert code == 0 and "OK" in out, err

    # Restore into a new cluster and start it with the normal daemons.
    target = new_cluster(zookeeper, str(tmp_path / "restored"), partitions=3, storages=3)
    try:
        code, out, err = waltz(capsys, *restore_args(target, path))
        assert code == 0, err
        target.start()
        restored = asyncio.run(read_all(target))
        assert restored == source_log  # every record: ID, ReqId, header, data, commit time
        assert all(r.timestamp != NO_TIMESTAMP for rs in restored.values() for r in rs)

        zk = connect(target.zookeeper_connect)
        try:
            state = admin.read_cluster(zk, target.layout.root)
        finally:
            close(zk)
        assert state.params.name == "local"
        for meta in state.partitions.values():
            # The first session after the restored one recovered, with every replica.
            assert meta.session_id >= 1
            assert {r.session_id for r in meta.replicas.values()} == {meta.session_id}
            assert all(r.closing_high_water_mark == UNRESOLVED for r in meta.replicas.values())

        async def use_restored() -> None:
            marks = {p: source_log[p][-1].transaction_id for p in range(3)}
            # An application resumes from its own high-water mark (here: half way).
            half = {p: marks[p] // 2 for p in range(3)}
            follower = Follower(half)
            async with WaltzClient(config(target), follower) as following:
                async with WaltzClient(config(target, feed=False)) as client:
                    results = await asyncio.gather(
                        *(client.submit(Put(10**6 + k)) for k in range(6))
                    )
                    assert all(r.committed for r in results)
                    for k, r in enumerate(results):
                        p = (10**6 + k) % 3
                        assert r.transaction_id > marks[p]
                    for p in range(3):
                        assert await client.high_water_mark(p) == marks[p] + 2
                        new = [r async for r in client.read(p, marks[p] + 1, marks[p] + 2)]
                        old_generations = {r.req_id.generation for r in source_log[p]}
                        # New appends cannot carry the ReqId of a restored transaction.
                        assert all(r.req_id.generation > max(old_generations) for r in new)
                while any(follower.applied[p] < marks[p] + 2 for p in range(3)):
                    await asyncio.sleep(0.05)
                assert following.num_partitions == 3
            for p in range(3):
                expected = [(r.transaction_id, r.header, r.data) for r in source_log[p]]
                assert follower.seen[p][: marks[p] - half[p]] == expected[half[p] + 1 :]
                assert len(follower.seen[p]) == marks[p] - half[p] + 2

        asyncio.run(use_restored())

        # Restoring again over it is refused: the root holds a cluster, the directories data.
        code, out, err = waltz(capsys, *restore_args(target, path))
        assert code == 1 and "nothing was restored" in err
    finally:
        target.stop()


@pytest.fixture(scope="module")
def small_backup(zookeeper, tmp_path_factory) -> str:
    """A backup of a 2-partition cluster holding 200 transactions (the cluster is gone)."""
    directory = tmp_path_factory.mktemp("small")
    cluster = LocalCluster(
        str(directory / "cluster"),
        storages=1,
        partitions=2,
        replicas=1,
        root=f"/waltz-small-{uuid.uuid4().hex}",
        servers=1,
        external_zookeeper=zookeeper.connect_string,
    )
    cluster.start()
    try:

        async def append() -> None:
            async with WaltzClient(config(cluster, feed=False)) as client:
                results = await asyncio.gather(*(client.submit(Put(i)) for i in range(200)))
                assert all(r.committed for r in results)

        asyncio.run(append())
        path = str(directory / "backup")
        code = waltz_main_status(backup_args(cluster, path, "--chunk-size", "8KiB"))
        assert code == 0
    finally:
        cluster.stop()
    return path


def waltz_main_status(argv: list[str]) -> int:
    try:
        waltz_main(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    return 0


def damaged_copy(small_backup: str, tmp_path, damage) -> tuple[str, str]:
    """A copy of the backup with ``damage(path, manifest)`` done to it: (copy, damaged file)."""
    path = str(tmp_path / "damaged")
    shutil.copytree(small_backup, path)
    return path, damage(path, Manifest.read(path))


def flip_a_byte(path: str, m: Manifest) -> str:
    chunk = os.path.join(path, m.partitions[1].files[1].name)
    with open(chunk, "r+b") as f:
        f.seek(os.path.getsize(chunk) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x04]))
    return chunk


def truncate(path: str, m: Manifest) -> str:
    chunk = os.path.join(path, m.partitions[0].files[-1].name)
    os.truncate(chunk, os.path.getsize(chunk) - 5)
    return chunk


def tamper_manifest(path: str, m: Manifest) -> str:
    manifest = os.path.join(path, MANIFEST_NAME)
    with open(manifest) as f:
        text = f.read()
    # Claim one transaction less for partition 0: still valid JSON, still a manifest.
    hwm = m.partitions[0].high_water_mark
    text = text.replace(f'"high_water_mark": {hwm},', f'"high_water_mark": {hwm - 1},', 1)
    with open(manifest, "w") as f:
        f.write(text)
    return manifest


@pytest.mark.parametrize("damage", [flip_a_byte, truncate, tamper_manifest])
def test_a_damaged_backup_is_refused_naming_the_file(
    small_backup, zookeeper, tmp_path, capsys, damage
):
    path, damaged = damaged_copy(small_backup, tmp_path, damage)
    target = new_cluster(zookeeper, str(tmp_path / "target"), partitions=2, storages=1)
    code, _out, err = waltz(capsys, *restore_args(target, path))
    assert code == 1
    assert damaged in err, err
    # Nothing restored: no storage directory, no cluster in ZooKeeper.
    assert not os.path.exists(os.path.join(target.data_dir, "storage-0"))
    zk = connect(target.zookeeper_connect)
    try:
        assert not zk.exists(target.layout.root)
    finally:
        close(zk)
    code, _out, err = waltz(capsys, "backup", path, "--verify")
    assert code == 1 and damaged in err and "DAMAGED" in err


def test_a_non_empty_target_is_refused(small_backup, zookeeper, tmp_path, capsys):
    target = new_cluster(zookeeper, str(tmp_path / "target"), partitions=2, storages=1)
    storage = os.path.join(target.data_dir, "storage-0")
    os.makedirs(storage)
    with open(os.path.join(storage, "something"), "w") as f:
        f.write("not ours")
    code, out, err = waltz(capsys, *restore_args(target, small_backup))
    assert code == 1 and f"{storage}: not empty" in err and "nothing was restored" in err
    assert os.listdir(storage) == ["something"]

    # A root that holds a cluster already.
    os.unlink(os.path.join(storage, "something"))
    zk = connect(target.zookeeper_connect)
    try:
        admin.create_cluster(zk, target.layout.root, "other", 2, 1, ["127.0.0.1:9"])
    finally:
        close(zk)
    code, out, err = waltz(capsys, *restore_args(target, small_backup))
    assert code == 1 and "already holds a cluster" in err
    assert os.listdir(storage) == []

    # The dry run checks everything and writes nothing.
    target.layout.root = f"/waltz-dry-{uuid.uuid4().hex}"
    code, out, err = waltz(capsys, *restore_args(target, small_backup, "--dry-run", "--json"))
    assert code == 0, err
    plan = json.loads(out)
    assert plan["dry_run"] and plan["partitions"] == {"0": [0, 99], "1": [0, 99]}
    assert plan["storages"][target.layout.storage_addresses[0]]["partitions"] == [0, 1]
    assert os.listdir(storage) == []


def test_a_log_that_starts_above_zero_and_a_gap_that_cannot_be_filled(
    make_cluster, zookeeper, tmp_path, capsys
):
    source = make_cluster(
        partitions=1,
        storages=1,
        storage_args=["--segment-bytes", "4096"],
        server_args=["--retention-interval", "0.3"],
    )

    def append(first: int, count: int) -> None:
        async def run() -> None:
            async with WaltzClient(config(source, feed=False)) as client:
                for i in range(first, first + count):  # one at a time: ID == i
                    r = await client.submit(Put(i * 2))  # partition 0 of 1
                    assert r.transaction_id == i

        asyncio.run(run())

    def truncate_before(txid: int) -> None:
        zk = connect(source.zookeeper_connect)
        try:
            admin.update_retention(zk, source.layout.root, lambda p: p.truncated_before(0, txid))
            for _ in range(300):
                data, _ = zk.get(f"{source.layout.root}/store/partition/0")
                if json.loads(data)["log_start"] == txid if b"log_start" in data else False:
                    return
                asyncio.run(asyncio.sleep(0.1))
            raise AssertionError(f"the log start did not reach {txid}")
        finally:
            close(zk)

    append(0, 100)
    truncate_before(40)
    path = str(tmp_path / "backup")
    code, _out, err = waltz(capsys, *backup_args(source, path))
    assert code == 0, err
    m = Manifest.read(path)
    assert (m.partitions[0].first, m.partitions[0].high_water_mark) == (40, 99)
    kept = asyncio.run(read_all_from(source, 40))
    assert backup_records(path, 0) == kept

    # Retention deletes past what the backup holds before its next run.
    append(100, 40)
    truncate_before(130)
    code, _out, err = waltz(capsys, *backup_args(source, path))
    assert code == 1
    assert "retention deleted 100..129" in err and "cannot be filled" in err, err
    m = Manifest.read(path)
    assert m.partitions[0].high_water_mark == 99  # unchanged, still restorable
    assert m.runs[-1]["problems"]

    target = new_cluster(zookeeper, str(tmp_path / "restored"), partitions=1, storages=1)
    try:
        code, _out, err = waltz(capsys, *restore_args(target, path))
        assert code == 0, err
        assert os.path.exists(os.path.join(target.data_dir, "storage-0", "0", "log-start"))
        target.start()

        async def check() -> None:
            async with WaltzClient(config(target, feed=False)) as client:
                with pytest.raises(MissingTransactions) as gone:
                    await client.transaction_data(0, 39)
                assert gone.value.first_available == 40
                assert [r async for r in client.read(0, 40, 99)] == kept
                r = await client.submit(Put(7))
                assert r.transaction_id == 100

        asyncio.run(check())
    finally:
        target.stop()


async def read_all_from(cluster: LocalCluster, start: int) -> list[Record]:
    async with WaltzClient(config(cluster, feed=False)) as client:
        hwm = await client.high_water_mark(0)
        return [r async for r in client.read(0, start, hwm)]


def test_recovery_decides_the_backup_mark_on_restored_replicas(small_backup, zookeeper, tmp_path):
    """What the first server's recovery decides on the files and metadata a restore
    writes (its own decision function, on the real storage engine's view of the
    directories): the backup's high-water mark, with every replica or with any one of
    three missing; two missing of three is undecidable (they could hold more), as for
    any session's members."""
    from waltz_client.tools.backup.restore import StorageTarget, plan_restore, restore
    from waltz_server.recovery import Decided, StorageView, Undecidable, decide
    from waltz_storage.service import StorageNode

    targets = [
        StorageTarget(f"127.0.0.1:{9001 + i}", str(tmp_path / f"storage-{i}")) for i in range(3)
    ]
    with pytest.raises(BackupError, match="3 replicas per partition need at least 3"):
        plan_restore(small_backup, targets[:2], num_replicas=3)
    plan = plan_restore(small_backup, targets, num_replicas=3)
    root = f"/waltz-decide-{uuid.uuid4().hex}"
    zk = connect(zookeeper.connect_string)
    try:
        restore(plan, zk, root)
        state = admin.read_cluster(zk, root)
    finally:
        close(zk)
    assert state.params.key == plan.key
    for p in range(2):
        backed = plan.manifest.partitions[p]
        views = {}
        for t in targets:
            node = StorageNode.open(t.directory, plan.key, 2, {p})
            try:
                svc = node.partitions[p]
                assert svc.unavailable is None
                info = svc.info
                assert svc.log.first_txid == backed.first
                views[t.address] = StorageView(
                    info.session_id,
                    info.low_water_mark,
                    info.local_low_water_mark,
                    svc.log.max_txid,
                )
            finally:
                node.close()
        meta = state.partitions[p]
        replicas = state.assignment.replicas_of(p)
        assert sorted(replicas) == sorted(t.address for t in targets)
        _, decision = decide(meta, replicas, views)
        assert decision == Decided(backed.high_water_mark)
        for gone in replicas:
            some = {a: v for a, v in views.items() if a != gone}
            assert decide(meta, replicas, some)[1] == Decided(backed.high_water_mark)
        one = {replicas[0]: views[replicas[0]]}
        assert isinstance(decide(meta, replicas, one)[1], Undecidable)
