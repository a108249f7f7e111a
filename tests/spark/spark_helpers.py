"""Appending to and reading back from the test cluster through the client itself."""

from __future__ import annotations

from waltz_client import BlockingWaltzClient, TransactionBuilder, TransactionContext
from waltz_client.config import WaltzClientConfig


class Put(TransactionContext):
    def __init__(self, partition: int, header: int, data: bytes) -> None:
        self.partition, self.header, self.data = partition, header, data

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(self.header)
        builder.set_data(self.data)
        return True


def client(cluster) -> BlockingWaltzClient:
    """A client of ``cluster`` (over TLS, to servers and ZooKeeper, on a TLS cluster)."""
    return BlockingWaltzClient(
        WaltzClientConfig(
            cluster.zookeeper_connect,
            cluster.layout.root,
            feed=False,
            tls=cluster.client_tls,
            zk_tls=cluster.client_zk_tls,
        )
    )


def append(cluster, count: int, partitions: list[int], tag: str = "t") -> None:
    """``count`` transactions spread over ``partitions``, in flight together."""
    import asyncio

    with client(cluster) as c:

        async def all_of_them() -> None:
            results = await asyncio.gather(
                *(
                    c.client.submit(
                        Put(partitions[i % len(partitions)], i, f"{tag}-{i}".encode() * (i % 7))
                    )
                    for i in range(count)
                )
            )
            assert all(r.committed for r in results), [r for r in results if not r.committed]

        c._call(all_of_them())


def log_rows(cluster, partitions=None, start=None, end=None) -> list[tuple]:
    """Every committed transaction as (partition, txid, header, data, client_id), read
    with the client's own range reads; ``start``/``end``: offsets per partition."""
    rows = []
    with client(cluster) as c:
        for p in partitions if partitions is not None else range(c.num_partitions):
            first = (start or {}).get(p, 0)
            last = (end or {}).get(p, c.high_water_mark(p) + 1) - 1
            if last < first:
                continue
            for r in c.read(p, first, last):
                rows.append((p, r.transaction_id, r.header, r.data, r.req_id.client_id))
    return rows


def high_water_marks(cluster) -> dict[int, int]:
    with client(cluster) as c:
        return {p: c.high_water_mark(p) for p in range(c.num_partitions)}


def spark_rows(df) -> list[tuple]:
    return sorted(
        (r.partition, r.transaction_id, r.header, bytes(r.data), r.client_id) for r in df.collect()
    )


def log_start(cluster, partition: int) -> int:
    """The partition's log start as its owner recorded it in ZooKeeper."""
    from waltz_client.cluster.metadata import PartitionMetadata
    from waltz_client.cluster.paths import ClusterPaths
    from waltz_client.cluster.zk import close, connect

    zk = connect(cluster.zookeeper_connect)
    try:
        data, _ = zk.get(ClusterPaths.of(cluster.layout.root).partition(partition))
        return PartitionMetadata.decode(data).log_start
    finally:
        close(zk)


def truncate_before(cluster, partition: int, transaction_id: int, timeout: float = 30.0) -> None:
    """Retention's truncate-before, waited for: the partition's log start is then
    ``transaction_id`` (its server applies the policy every --retention-interval)."""
    import time

    from waltz_client.cluster import admin
    from waltz_client.cluster.zk import close, connect

    zk = connect(cluster.zookeeper_connect)
    try:
        admin.update_retention(
            zk, cluster.layout.root, lambda p: p.truncated_before(partition, transaction_id)
        )
    finally:
        close(zk)
    deadline = time.monotonic() + timeout
    while log_start(cluster, partition) != transaction_id:
        assert time.monotonic() < deadline, f"the log start of {partition} never reached it"
        time.sleep(0.1)


def read(spark, options, **more):
    reader = spark.read.format("waltz")
    for k, v in {**options, **more}.items():
        reader = reader.option(k, v)
    return reader.load()


def stream(spark, options, **more):
    reader = spark.readStream.format("waltz")
    for k, v in {**options, **more}.items():
        reader = reader.option(k, v)
    return reader.load()


def run_to_the_end(df, out, checkpoint):
    """One run of the query: every micro-batch up to what is committed now, then stop."""
    query = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
    finally:
        query.stop()
    return [p["numInputRows"] for p in query.recentProgress]
