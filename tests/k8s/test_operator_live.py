"""The operator driving a real cluster: kopf in-process against the strict API server, a
real ZooKeeper, and the pods it asks for run as real storage and server processes by a
harness that plays the controllers and the kubelet (kubelet.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from kubelet import Kubelet
from operator_harness import (
    NS,
    WZ,
    cluster_doc,
    condition,
    create_cluster_object,
    eventually,
    kubernetes_api,
    obj,
    patch_cluster,
    running_operator,
)

from waltz_client import (
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientCallbacks,
    WaltzClientConfig,
)
from waltz_client.cluster import admin


def client_config(connect: str, root: str) -> WaltzClientConfig:
    # A request the roll strands (its server shut down under it) is retried after
    # request_timeout; 5 s instead of 30 keeps the test short.
    return WaltzClientConfig(connect, zk_root=root, request_timeout=5.0)


def live_doc(zookeeper, zk_root: str, storage: int) -> dict:
    return cluster_doc(
        zookeeper,
        zk_root,
        partitions=2,
        storage={"replicas": storage},
        server={"replicas": 1, "settings": {"zk_session_timeout": "4"}},
    )


class Notes(WaltzClientCallbacks):
    def __init__(self) -> None:
        self.applied: dict[int, int] = {}

    async def client_high_water_mark(self, partition_id: int) -> int:
        return self.applied.get(partition_id, -1)

    async def apply_transaction(self, transaction: Transaction) -> None:
        self.applied[transaction.partition_id] = transaction.transaction_id


class Note(TransactionContext):
    def __init__(self, partition: int, text: str) -> None:
        self.partition, self.text = partition, text

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(1)
        builder.set_data(self.text.encode())
        return True


async def write_until(client: WaltzClient, stop: asyncio.Event) -> dict[int, dict[int, bytes]]:
    """Submit notes to both partitions until ``stop``; committed ID -> data per partition."""
    committed: dict[int, dict[int, bytes]] = {0: {}, 1: {}}
    i = 0
    while not stop.is_set():
        i += 1
        results = await asyncio.gather(*(client.submit(Note(p, f"note-{i}-{p}")) for p in (0, 1)))
        for p, result in zip((0, 1), results, strict=True):
            assert result.committed, result
            committed[p][result.transaction_id] = f"note-{i}-{p}".encode()
        await asyncio.sleep(0.05)
    return committed


async def read_back(client: WaltzClient, committed: dict[int, dict[int, bytes]]) -> None:
    for p, notes in committed.items():
        found = {}
        async for record in client.read(p, start=0, stop=max(notes)):
            found[record.transaction_id] = record.data
        for txid, data in notes.items():
            assert found.get(txid) == data, (p, txid)


@contextlib.asynccontextmanager
async def operated_by(api, kubelet: Kubelet) -> AsyncIterator[None]:
    """The operator, told the kubelet's storage addresses, with the kubelet running."""
    async with (
        running_operator(
            api, NS, storage_http=kubelet.storage_http, address_book=kubelet.address_book
        ),
        kubelet,
    ):
        yield


async def until_ready(api) -> dict:
    return await eventually(
        lambda: (
            (b := obj(api, WZ, NS, "demo")) and condition(b, "Ready").get("status") == "True" and b
        ),
        180,
        what="Ready",
    )


@pytest.mark.asyncio
async def test_a_storage_roll_restarts_one_pod_at_a_time_and_loses_nothing(
    zookeeper, zk, zk_root, tmp_path
):
    async with kubernetes_api() as api:
        kubelet = Kubelet(api, NS, "demo", str(tmp_path / "nodes"))
        create_cluster_object(api, live_doc(zookeeper, zk_root, storage=3))
        async with operated_by(api, kubelet):
            await until_ready(api)
            config = client_config(zookeeper.connect_string, zk_root)
            async with WaltzClient(config, Notes()) as client:
                stop = asyncio.Event()
                writer = asyncio.create_task(write_until(client, stop))
                await asyncio.sleep(1.0)
                await patch_cluster(api, {"spec": {"image": {"tag": "0.2.0"}}})
                storage = [f"demo-storage-{i}" for i in range(3)]
                await eventually(
                    lambda: all(kubelet.started.count(p) == 2 for p in storage),
                    240,
                    what="every storage pod restarted once",
                )
                await until_ready(api)
                stop.set()
                committed = await writer
                await read_back(client, committed)
        # One pod at a time: each stopped while the other two ran. (That the others were
        # in session is the operator's rule, tested in test_rollout.py; the writes
        # committing throughout show the majority held.)
        for pod, others_ready in kubelet.storage_stops:
            assert others_ready == 2, (pod, kubelet.storage_stops)
        assert sum(len(n) for n in committed.values()) > 0


@pytest.mark.asyncio
async def test_a_scale_down_moves_replicas_off_before_the_pod_goes(
    zookeeper, zk, zk_root, tmp_path
):
    async with kubernetes_api() as api:
        kubelet = Kubelet(api, NS, "demo", str(tmp_path / "nodes"))
        create_cluster_object(api, live_doc(zookeeper, zk_root, storage=4))
        leaving = kubelet.address_book[3]
        async with operated_by(api, kubelet):
            await until_ready(api)
            # The node that goes holds a replica (there is something to move), in session:
            # Ready needs a quorum of each partition, not every replica, so wait for it.
            await eventually(
                lambda: [
                    p for p in range(2) if leaving in admin.read_cluster(zk, zk_root).members(p)
                ],
                60,
                what="the leaving node in a partition's session",
            )
            config = client_config(zookeeper.connect_string, zk_root)
            async with WaltzClient(config, Notes()) as client:
                stop = asyncio.Event()
                writer = asyncio.create_task(write_until(client, stop))
                await asyncio.sleep(1.0)
                await patch_cluster(api, {"spec": {"storage": {"replicas": 3}}})
                await eventually(
                    lambda: (
                        obj(api, "apps/v1/statefulsets", NS, "demo-storage")["spec"]["replicas"]
                        == 3
                    ),
                    240,
                    what="the StatefulSet shrunk",
                )
                state = admin.read_cluster(zk, zk_root)
                assert leaving not in state.assignment.storages
                for p in range(2):  # three replicas each, all on staying nodes, in session
                    assert len(state.assignment.replicas_of(p)) == 3
                    assert leaving not in state.members(p)
                await until_ready(api)
                stop.set()
                committed = await writer
                await read_back(client, committed)
            # Deleted gracefully: the kubelet stops it, then confirms the deletion.
            await eventually(
                lambda: (
                    "demo-storage-3" not in kubelet.pods
                    and obj(api, "v1/pods", NS, "demo-storage-3") is None
                ),
                60,
                what="the scaled-away pod gone",
            )


@pytest.mark.asyncio
async def test_a_bigger_volume_grows_the_claims_and_keeps_the_pods(
    zookeeper, zk, zk_root, tmp_path
):
    """The claim template of a StatefulSet is immutable: the operator patches each claim,
    deletes the StatefulSet with orphan propagation and creates it again, which adopts
    the running pods and their claims."""
    async with kubernetes_api() as api:
        kubelet = Kubelet(api, NS, "demo", str(tmp_path / "nodes"))
        doc = live_doc(zookeeper, zk_root, storage=3)
        doc["spec"]["storage"]["size"] = "1Gi"
        create_cluster_object(api, doc)
        async with operated_by(api, kubelet):
            await until_ready(api)
            old = obj(api, "apps/v1/statefulsets", NS, "demo-storage")
            started = list(kubelet.started)
            await patch_cluster(api, {"spec": {"storage": {"size": "2Gi"}}})

            def grown() -> dict | None:
                sts = obj(api, "apps/v1/statefulsets", NS, "demo-storage")
                if sts is None or sts["metadata"]["uid"] == old["metadata"]["uid"]:
                    return None
                template = sts["spec"]["volumeClaimTemplates"][0]["spec"]
                return sts if template["resources"]["requests"]["storage"] == "2Gi" else None

            sts = await eventually(grown, 120, what="the StatefulSet recreated with 2Gi claims")
            for i in range(3):
                claim = obj(api, "v1/persistentvolumeclaims", NS, f"data-demo-storage-{i}")
                assert claim["spec"]["resources"]["requests"]["storage"] == "2Gi"
                await eventually(
                    lambda i=i: (
                        [
                            r["uid"]
                            for r in obj(api, "v1/pods", NS, f"demo-storage-{i}")["metadata"][
                                "ownerReferences"
                            ]
                        ]
                        == [sts["metadata"]["uid"]]
                    ),
                    60,
                    what="the pod adopted by the new StatefulSet",
                )
            await until_ready(api)
            assert kubelet.started == started  # no pod restarted


class Grown(Notes):
    def __init__(self) -> None:
        super().__init__()
        self.added: list[int] = []

    def partitions_added(self, partition_ids: list[int]) -> None:
        self.added += partition_ids


@pytest.mark.asyncio
async def test_more_partitions_are_taken_up_without_a_restart(zookeeper, zk, zk_root, tmp_path):
    """spec.partitions raised under a running client: the new partitions get an owner and
    a quorum with no pod restarted, and the client sees them and writes to them."""
    async with kubernetes_api() as api:
        kubelet = Kubelet(api, NS, "demo", str(tmp_path / "nodes"))
        create_cluster_object(api, live_doc(zookeeper, zk_root, storage=3))
        async with operated_by(api, kubelet):
            await until_ready(api)
            started = list(kubelet.started)
            notes = Grown()
            config = client_config(zookeeper.connect_string, zk_root)
            async with WaltzClient(config, notes) as client:
                assert client.num_partitions == 2
                await patch_cluster(api, {"spec": {"partitions": 4}})
                body = await eventually(
                    lambda: (
                        (b := obj(api, WZ, NS, "demo"))
                        and b["status"]["quorum"] == "4/4"
                        and condition(b, "Ready").get("status") == "True"
                        and b
                    ),
                    180,
                    what="four partitions, each with a quorum",
                )
                assert [p["partition"] for p in body["status"]["partitions"]] == [0, 1, 2, 3]
                await eventually(lambda: client.num_partitions == 4, 60, what="the client grew")
                assert sorted(notes.added) == [2, 3]
                committed = {}
                for p in (2, 3):
                    result = await client.submit(Note(p, f"new-{p}"))
                    assert result.committed, result
                    committed[p] = {result.transaction_id: f"new-{p}".encode()}
                await read_back(client, committed)
            assert admin.read_params(zk, zk_root).num_partitions == 4
            assert kubelet.started == started  # no pod restarted
