"""From nothing to a healthy Waltz cluster on kind, and through what production does
to it: pods killed under load, scaling, a rolling image update, TLS, Spark, uninstall.

Every client check is ``waltz check`` in a Job: appends with contended write locks,
follows the committed feed, reads back; it fails on any lost, duplicated or
out-of-order transaction.
"""

from __future__ import annotations

import threading
import time

import pytest

from .conftest import REPOSITORY, TAG, helm, helm_install, run

NS = "waltz"
NAME = "waltz"
ZOOKEEPER = ",".join(
    f"waltz-zookeeper-{i}.waltz-zookeeper-headless.{NS}.svc:2181" for i in range(3)
)
ROOT_ZNODE = f"/waltz/{NS}/{NAME}"
CLIENT_IMAGE = f"{REPOSITORY}/waltz-server:{TAG}"

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]


def check(kube, name: str, transactions: int, namespace: str = NS, **env: str) -> str:
    kube.job(
        namespace,
        name,
        CLIENT_IMAGE,
        ["waltz", "check", "--transactions", str(transactions), "--timeout", "900"],
        {"WALTZ_ZOOKEEPER": ZOOKEEPER, "WALTZ_ROOT": ROOT_ZNODE, "HOME": "/tmp", **env},
    )
    ok, log = kube.job_result(namespace, name)
    assert ok and log.strip().endswith("PASS"), log
    return log


def quorum(kube) -> str:
    return (kube.json("get", "waltzcluster", NAME, "-n", NS).get("status") or {}).get("quorum", "")


def test_helm_test_appends_with_locks_and_reads_back(waltz):
    helm("test", "waltz", "--namespace", NS, "--kube-context", waltz.context, "--logs")


def faults_under_load(kube, namespace: str, env: dict[str, str], tls_secret: str = "") -> None:
    """Delete a storage pod and the owner of partition 0 while a client appends with
    locks and follows the feed: it must still see every transaction exactly once."""
    kube.job(
        namespace,
        "check-under-faults",
        CLIENT_IMAGE,
        ["waltz", "check", "--transactions", "20000", "--timeout", "900"],
        {**env, "HOME": "/tmp"},
        tls_secret,
    )
    time.sleep(15)  # under way
    kube("delete", "pod", f"{NAME}-storage-1", "-n", namespace, "--wait=false")
    status = kube.json("get", "waltzcluster", NAME, "-n", namespace)["status"]
    owner = next(p["owner"] for p in status["partitions"] if p["partition"] == 0)
    kube("delete", "pod", owner, "-n", namespace, "--wait=false")
    ok, log = kube.job_result(namespace, "check-under-faults")
    assert ok and log.strip().endswith("PASS"), log
    kube.wait_ready(namespace, NAME)


def test_killing_a_storage_pod_and_the_owning_server_under_load_loses_nothing(waltz):
    faults_under_load(waltz, NS, {"WALTZ_ZOOKEEPER": ZOOKEEPER, "WALTZ_ROOT": ROOT_ZNODE})


def test_scaling_storage_up_and_refusing_an_unsafe_scale_down(waltz):
    waltz(
        "patch",
        "waltzcluster",
        NAME,
        "-n",
        NS,
        "--type=merge",
        "-p",
        '{"spec":{"storage":{"replicas":4}}}',
    )
    deadline = time.monotonic() + 900
    while (
        waltz.json("get", "statefulset", f"{NAME}-storage", "-n", NS)["status"].get("readyReplicas")
        != 4
    ):
        assert time.monotonic() < deadline, "storage did not reach 4 ready pods"
        time.sleep(5)
    status = waltz.wait_ready(NS, NAME)
    assert status["storage"]["ready"] == 4
    check(waltz, "check-after-scale-up", 500)
    # Fewer storage nodes than replicas per partition: the API server refuses it (CEL).
    out = waltz(
        "patch",
        "waltzcluster",
        NAME,
        "-n",
        NS,
        "--type=merge",
        "-p",
        '{"spec":{"storage":{"replicas":2}}}',
        check=False,
    )
    assert "storage.replicas must be at least replicasPerPartition" in out
    assert waltz.json("get", "waltzcluster", NAME, "-n", NS)["spec"]["storage"]["replicas"] == 4


def test_a_rolling_image_update_keeps_the_quorum_and_the_feed(waltz):
    run("docker", "tag", f"{REPOSITORY}/waltz-storage:{TAG}", f"{REPOSITORY}/waltz-storage:{TAG}-2")
    run("docker", "tag", f"{REPOSITORY}/waltz-server:{TAG}", f"{REPOSITORY}/waltz-server:{TAG}-2")
    for image in ("storage", "server"):
        run(
            "kind",
            "load",
            "docker-image",
            f"{REPOSITORY}/waltz-{image}:{TAG}-2",
            "--name",
            "waltz-e2e",
        )
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(quorum(waltz))
            time.sleep(2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    waltz.job(
        NS,
        "check-during-roll",
        CLIENT_IMAGE,
        ["waltz", "check", "--transactions", "30000", "--timeout", "1800"],
        {"WALTZ_ZOOKEEPER": ZOOKEEPER, "WALTZ_ROOT": ROOT_ZNODE, "HOME": "/tmp"},
    )
    waltz(
        "patch",
        "waltzcluster",
        NAME,
        "-n",
        NS,
        "--type=merge",
        "-p",
        f'{{"spec":{{"image":{{"tag":"{TAG}-2"}}}}}}',
    )
    deadline = time.monotonic() + 1800
    while True:
        pods = waltz.json(
            "get",
            "pods",
            "-n",
            NS,
            "-l",
            f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=storage",
        )["items"]
        if pods and all(p["spec"]["containers"][0]["image"].endswith(f":{TAG}-2") for p in pods):
            break
        assert time.monotonic() < deadline, "the storage roll did not finish"
        time.sleep(5)
    waltz.wait_ready(NS, NAME)
    ok, log = waltz.job_result(NS, "check-during-roll", timeout=1800)
    stop.set()
    assert ok and log.strip().endswith("PASS"), log
    # Every partition kept a majority through the roll (one storage pod at a time).
    full = [q for q in seen if q]
    assert full and all(q.split("/")[0] == q.split("/")[1] for q in full), seen


def test_spark_reads_the_log_and_counts_what_the_client_wrote(waltz):
    check(waltz, "check-before-spark", 1000)
    script = (
        "from pyspark.sql import SparkSession\n"
        "from waltz_client.spark import WaltzDataSource\n"
        "from waltz_client import WaltzClient, WaltzClientConfig\n"
        "import asyncio\n"
        "spark = SparkSession.builder.master('local[2]').getOrCreate()\n"
        "spark.dataSource.register(WaltzDataSource)\n"
        f"df = spark.read.format('waltz').option('zookeeper', '{ZOOKEEPER}')"
        f".option('zkRoot', '{ROOT_ZNODE}').load()\n"
        "count = df.count()\n"
        "async def marks():\n"
        f"    config = WaltzClientConfig('{ZOOKEEPER}', zk_root='{ROOT_ZNODE}', feed=False)\n"
        "    async with WaltzClient(config) as c:\n"
        "        return sum([await c.high_water_mark(p) + 1 for p in range(c.num_partitions)])\n"
        "expected = asyncio.run(marks())\n"
        "print('spark', count, 'log', expected)\n"
        "assert count == expected, (count, expected)\n"
    )
    waltz.job(
        NS,
        "spark-count",
        f"{REPOSITORY}/waltz-spark:{TAG}",
        ["python3", "-c", script],
        {"HOME": "/tmp"},
    )
    ok, log = waltz.job_result(NS, "spark-count", timeout=1200)
    assert ok, log


def test_the_same_on_mutual_tls_with_cert_manager(kind_cluster):
    kube = kind_cluster
    kube(
        "apply",
        "-f",
        "https://github.com/cert-manager/cert-manager/releases/download/v1.16.2/cert-manager.yaml",
    )
    kube(
        "wait",
        "--for=condition=Available",
        "deployment",
        "--all",
        "-n",
        "cert-manager",
        "--timeout=300s",
    )
    helm_install(
        kube,
        "secure",
        "secure",
        "--set",
        "cluster.enabled=true",
        "--set",
        "cluster.certManager.enabled=true",
        "--set",
        "cluster.storage.size=1Gi",
        "--set",
        "zookeeper.bundled.storage.size=1Gi",
        "--set",
        "networkPolicy.enabled=true",
    )
    kube.wait_ready("secure", NAME)
    helm("test", "secure", "--namespace", "secure", "--kube-context", kube.context, "--logs")
    env = {
        "WALTZ_ZOOKEEPER": ",".join(
            f"secure-zookeeper-{i}.secure-zookeeper-headless.secure.svc:2181" for i in range(3)
        ),
        "WALTZ_ROOT": f"/waltz/secure/{NAME}",
    }
    faults_under_load(kube, "secure", env, tls_secret=f"{NAME}-check-tls")
    # Without a client certificate the servers turn the client away.
    kube.job(
        "secure",
        "no-certificate",
        CLIENT_IMAGE,
        ["waltz", "check", "--transactions", "10", "--timeout", "60"],
        {**env, "HOME": "/tmp"},
    )
    ok, _ = kube.job_result("secure", "no-certificate")
    assert not ok


def test_uninstall_keeps_the_volumes_when_retain_volumes(waltz):
    waltz("delete", "waltzcluster", NAME, "-n", NS, "--wait", "--timeout=300s")
    helm("uninstall", "waltz", "--namespace", NS, "--kube-context", waltz.context, "--wait")
    claims = waltz.json("get", "pvc", "-n", NS, "-l", f"app.kubernetes.io/instance={NAME}")["items"]
    assert len(claims) >= 3, "retainVolumes: true keeps the storage volumes"
