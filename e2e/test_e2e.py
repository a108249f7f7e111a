"""From nothing to a healthy Waltz cluster on kind, and through what production does
to it: pods killed under load, scaling (with the leader operator restarted midway), a
rolling image update, the standby operator taking over, zones, volume growth, a node
drain, an upgrade from the previous chart, TLS, Spark, uninstall.

Every client check is ``waltz check`` in a Job: appends with contended write locks,
follows the committed feed, reads back; it fails on any lost, duplicated or
out-of-order transaction. Where something moves under the cluster, a digest of every
committed record up to the high-water marks taken before (``log_digest``) must be the
same afterwards: nothing committed earlier was lost or changed.

The tests run in file order; those taking the session's release (``waltz``) leave it
Ready, and the last one uninstalls it. Tests needing a cluster of a particular shape
make their own WaltzCluster beside it (``own_cluster``, on the release's operator and
ZooKeeper) or a release of their own, and remove it afterwards.
"""

from __future__ import annotations

import base64
import json
import shutil
import time

import pytest
import trustme

from .cluster import (
    CLIENT_IMAGE,
    Sampler,
    Target,
    check,
    cluster_show,
    finish_check,
    full,
    log_digest,
    node_zones,
    operator_pods,
    operator_role,
    own_cluster,
    patch_spec,
    pod_of,
    quorum,
    release_target,
    replicas_of,
    start_check,
    status,
    storage_claims,
    storage_class,
    storage_down,
    uids,
    unevictable,
    wait_settled,
    workers,
    zookeeper_down,
)
from .conftest import (
    PREVIOUS_IMAGES,
    PREVIOUS_TAG,
    REPOSITORY,
    ROOT,
    TAG,
    build_images,
    checkout,
    helm,
    helm_install,
    helm_uninstall,
    previous_chart_revision,
    remove_release,
    run,
)
from .kube import not_on_node, pod_ready, wait_for

NS = "waltz"
NAME = "waltz"
SESSION = release_target("waltz", NS)
ZOOKEEPER = SESSION.zookeeper
ZK_CA = SESSION.zk_ca_secret  # the bundled ZooKeeper's TLS port: the chart's CA
LEASE = "waltz-waltz-operator"
SECURE = release_target("secure", "secure", tls_secret=f"{NAME}-check-tls")  # cert-manager

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]


def test_helm_test_appends_with_locks_and_reads_back(waltz):
    helm("test", "waltz", "--namespace", NS, "--kube-context", waltz.context, "--logs")


def faults_under_load(kube, target: Target, tls_secret: str = "") -> None:
    """Delete a storage pod and the owner of partition 0 while a client appends with
    locks and follows the feed: it must still see every transaction exactly once."""
    start_check(kube, target, "check-under-faults", 20000, tls_secret=tls_secret)
    time.sleep(15)  # under way
    kube("delete", "pod", f"{target.name}-storage-1", "-n", target.namespace, "--wait=false")
    owner = next(p["owner"] for p in status(kube, target)["partitions"] if p["partition"] == 0)
    kube("delete", "pod", owner, "-n", target.namespace, "--wait=false")
    finish_check(kube, target, "check-under-faults")
    kube.wait_ready(target.namespace, target.name)


def test_killing_a_storage_pod_and_the_owning_server_under_load_loses_nothing(waltz):
    faults_under_load(waltz, SESSION)


def test_scaling_storage_up_and_refusing_an_unsafe_scale_down(waltz):
    patch_spec(waltz, SESSION, {"storage": {"replicas": 4}})
    wait_for(
        "4 ready storage pods",
        lambda: waltz.json("get", "statefulset", f"{NAME}-storage", "-n", NS)["status"].get(
            "readyReplicas"
        ),
        until=lambda ready: ready == 4,
    )
    status_ = waltz.wait_ready(NS, NAME)
    assert status_["storage"]["ready"] == 4
    check(waltz, SESSION, "check-after-scale-up", 500)
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
    with Sampler(lambda: quorum(waltz, SESSION)) as watch:
        start_check(waltz, SESSION, "check-during-roll", 30000, timeout=1800)
        patch_spec(waltz, SESSION, {"image": {"tag": f"{TAG}-2"}})

        def storage_images() -> list[str]:
            pods = waltz.pods(NS, SESSION.storage_selector())
            return [p["spec"]["containers"][0]["image"] for p in pods]

        wait_for(
            "every storage pod on the new image",
            storage_images,
            timeout=1800,
            until=lambda images: images and all(i.endswith(f":{TAG}-2") for i in images),
        )
        waltz.wait_ready(NS, NAME)
        finish_check(waltz, SESSION, "check-during-roll")
    # Every partition kept a majority through the roll (one storage pod at a time).
    seen = [q for q in watch.samples if q]
    assert seen and all(full(q) for q in seen), watch.samples


def test_spark_reads_the_log_and_counts_what_the_client_wrote(waltz):
    check(waltz, SESSION, "check-before-spark", 1000)
    script = (
        "from pyspark.sql import SparkSession\n"
        "from waltz_client.spark import WaltzDataSource\n"
        "from waltz_client import WaltzClient, WaltzClientConfig\n"
        "import asyncio\n"
        "spark = SparkSession.builder.master('local[2]').getOrCreate()\n"
        "spark.dataSource.register(WaltzDataSource)\n"
        "from waltz_client.runtime.tls import TlsFiles\n"
        "d = '/etc/waltz/tls/'\n"
        "tls = TlsFiles(d + 'tls.crt', d + 'tls.key', d + 'ca.crt')\n"
        "zk_tls = TlsFiles(ca='/etc/waltz/zk-tls/ca.crt')\n"
        f"df = spark.read.format('waltz').option('zookeeper', '{ZOOKEEPER}')"
        f".option('zkRoot', '{SESSION.root}')"
        ".option('tlsCert', tls.cert).option('tlsKey', tls.key).option('tlsCa', tls.ca)"
        ".option('zkTlsCa', zk_tls.ca).load()\n"
        "count = df.count()\n"
        "async def marks():\n"
        f"    config = WaltzClientConfig('{ZOOKEEPER}', zk_root='{SESSION.root}', feed=False,\n"
        "                               tls=tls, zk_tls=zk_tls)\n"
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
        SESSION.tls_secret,  # the session's cluster runs on the operator's CA
        zk_ca_secret=SESSION.zk_ca_secret,  # and on the bundled ZooKeeper's TLS port
    )
    ok, log = waltz.job_result(NS, "spark-count", timeout=1200)
    assert ok, log


# --- the operator: a scale-down across a restart, and its standby ---------------------------


def storage_replicas(kube, target: Target) -> tuple[int, int]:
    """(the storage StatefulSet's replicas, how many are ready)."""
    statefulset = kube.json("get", "statefulset", f"{target.name}-storage", "-n", target.namespace)
    return statefulset["spec"]["replicas"], statefulset["status"].get("readyReplicas", 0)


def writer_running(kube, namespace: str, job: str) -> None:
    wait_for(
        f"the pod of {job} running",
        lambda: [p["status"].get("phase") for p in kube.pods(namespace, f"job-name={job}")],
        timeout=300,
        interval=2,
        until=lambda phases: "Running" in phases,
    )


def test_a_scale_down_completes_with_the_leader_operator_restarted_midway(waltz):
    kube = waltz
    # From 4 storage nodes (the scale-up test leaves 4; this makes sure of it), balanced.
    patch_spec(kube, SESSION, {"storage": {"replicas": 4}})
    wait_for(
        "4 ready storage pods", lambda: storage_replicas(kube, SESSION), until=lambda r: r == (4, 4)
    )
    wait_settled(kube, SESSION)
    show = cluster_show(kube, SESSION)
    (leaving,) = [a for a in show["storages"] if pod_of(a) == f"{NAME}-storage-3"]
    assert show["storages"][leaving]["partitions"], f"{leaving} holds no replica: {show}"
    before = log_digest(kube, SESSION, "digest-before-scale-down")

    start_check(kube, SESSION, "check-during-scale-down", 20000, timeout=1800)
    writer_running(kube, NS, "check-during-scale-down")
    patch_spec(kube, SESSION, {"storage": {"replicas": 3}})
    wait_for(
        "the scale-down moving replicas",
        lambda: kube.condition(NS, NAME, "Progressing").get("message", ""),
        timeout=600,
        interval=1,
        until=lambda message: message.startswith("scaling storage down"),
    )
    leader = kube.lease_holder(NS, LEASE)
    assert leader, f"no operator holds the Lease {LEASE}"
    kube("delete", "pod", leader, "-n", NS, "--wait=false")
    wait_for(
        "another operator leading",
        lambda: kube.lease_holder(NS, LEASE),
        timeout=300,
        interval=2,
        until=lambda holder: holder and holder != leader,
    )

    wait_for(
        "the StatefulSet shrunk to 3 ready pods",
        lambda: storage_replicas(kube, SESSION),
        timeout=1800,
        until=lambda r: r == (3, 3),
    )
    final = wait_settled(kube, SESSION, timeout=1800)
    assert final["storage"]["ready"] == 3, final
    show = cluster_show(kube, SESSION)
    assert leaving not in show["storages"], show["storages"]
    assert sorted(pod_of(a) for a in show["storages"]) == [f"{NAME}-storage-{i}" for i in range(3)]
    held = replicas_of(show)
    assert all(len(addresses) == 3 for addresses in held.values()), held
    finish_check(kube, SESSION, "check-during-scale-down")
    assert log_digest(kube, SESSION, "digest-after-scale-down", before) == before
    # retainVolumes: true keeps the volume of the node that went.
    assert f"data-{NAME}-storage-3" in storage_claims(kube, NS, NAME)


def test_one_operator_leads_and_the_standby_takes_over_when_it_goes(waltz):
    kube = waltz

    def ready_operators() -> list[str]:
        return sorted(
            p["metadata"]["name"] for p in operator_pods(kube, NS, "waltz") if pod_ready(p)
        )

    pods = wait_for("two ready operator pods", ready_operators, 600, until=lambda p: len(p) == 2)
    holder = kube.lease_holder(NS, LEASE)
    roles = {pod: operator_role(kube, NS, pod) for pod in pods}
    assert holder in pods, (holder, pods)
    assert roles[holder] == "leader" and sorted(roles.values()) == ["leader", "standby"], roles
    (standby,) = [pod for pod in pods if pod != holder]

    # Deleted at once (--force --grace-period=0, as when its node is lost): whether or not
    # it gets to give the Lease up in the seconds before it is killed, the standby takes it
    # at the latest once it has seen the record unchanged for the lease duration.
    duration = int(kube.json("get", "lease", LEASE, "-n", NS)["spec"]["leaseDurationSeconds"])
    started = time.monotonic()
    kube("delete", "pod", holder, "-n", NS, "--grace-period=0", "--force", "--wait=false")
    wait_for(
        "the standby holding the Lease",
        lambda: kube.lease_holder(NS, LEASE),
        timeout=duration + 120,
        interval=1,
        until=lambda h: h == standby,
    )
    took = time.monotonic() - started
    assert took <= duration + 30, f"took over after {took:.0f} s; lease duration {duration} s"

    # It reconciles: a third server is applied, then the second again.
    def servers() -> tuple:
        deployment = kube.json("get", "deployment", f"{NAME}-server", "-n", NS)
        reported = status(kube, SESSION).get("servers", {})
        return (
            deployment["spec"]["replicas"],
            deployment["status"].get("readyReplicas", 0),
            reported.get("desired"),
            reported.get("ready"),
        )

    for wanted in (3, 2):
        patch_spec(kube, SESSION, {"server": {"replicas": wanted}})
        expected = (wanted,) * 4
        wait_for(f"{wanted} servers", servers, 600, until=lambda s, e=expected: s == e)

    # The replacement pod stands by.
    pods = wait_for(
        "two ready operator pods again",
        ready_operators,
        600,
        until=lambda p: len(p) == 2 and holder not in p,
    )
    roles = {pod: operator_role(kube, NS, pod) for pod in pods}
    assert roles[standby] == "leader" and sorted(roles.values()) == ["leader", "standby"], roles
    assert kube.lease_holder(NS, LEASE) == standby


# --- placement over zones ------------------------------------------------------------------


def test_every_partition_spans_the_three_zones(waltz):
    kube = waltz
    zones = node_zones(kube)
    assert sorted(zones[w] for w in workers(kube)) == ["zone-a", "zone-b", "zone-c"], zones
    # Four storage nodes in three zones: the first assignment (before the operator knows
    # the zones, partition p on consecutive nodes) puts some partition on two nodes of one
    # zone, so the operator must move replicas once it reads the zones.
    with own_cluster(
        kube, NS, "zoned", ZOOKEEPER, storage={"replicas": 4}, zk_ca_secret=ZK_CA
    ) as target:
        pods = kube.pods(NS, target.storage_selector())
        zone_of = {
            p["metadata"]["name"]: zones.get(p["spec"].get("nodeName", ""), "") for p in pods
        }
        assert sorted(set(zone_of.values())) == ["zone-a", "zone-b", "zone-c"], (
            f"the default spread leaves a zone without storage: {zone_of}"
        )

        def spans() -> tuple[dict, dict]:
            show = cluster_show(kube, target)
            held = replicas_of(show)
            return {p: sorted(zone_of[pod_of(a)] for a in held[p]) for p in held}, show

        def every_partition_in_three_zones(value: tuple[dict, dict]) -> bool:
            return all(len(z) == 3 and len(set(z)) == 3 for z in value[0].values())

        wait_for(
            "every partition's three replicas in three zones",
            spans,
            900,
            10,
            until=every_partition_in_three_zones,
        )
        wait_settled(kube, target)
        spread, show = spans()
        assert every_partition_in_three_zones((spread, show)), spread
        # The placement groups are the zones: equal exactly within a zone, none unknown (0).
        groups = {a: s["group"] for a, s in show["storages"].items()}
        for a in groups:
            assert groups[a] != 0, groups
            for b in groups:
                same_zone = zone_of[pod_of(a)] == zone_of[pod_of(b)]
                assert (groups[a] == groups[b]) == same_zone, (groups, zone_of)
        check(kube, target, "check-zoned", 300)


# --- growing the volumes -------------------------------------------------------------------
#
# kind's default StorageClass (rancher.io/local-path) has no resizer, and no CSI driver that
# grows volumes installs on kind without fetching and running its own deployment scripts
# (csi-driver-host-path also binds every volume to the one node its plugin runs on). So
# these tests use StorageClasses of the same provisioner: one that refuses expansion, and
# one that allows it as far as the API server is concerned, which is what the operator's
# part depends on (the claims patched, the StatefulSet recreated around its pods). The
# volumes' capacity itself never grows on kind: that is the driver's part, not checked here.


def claim_sizes(kube, target: Target) -> dict[str, str]:
    return {
        name: c["spec"]["resources"]["requests"]["storage"]
        for name, c in storage_claims(kube, target.namespace, target.name).items()
    }


def test_growing_the_volumes_where_the_class_cannot_is_refused_and_the_cluster_serves(waltz):
    kube = waltz
    with (
        storage_class(kube, "waltz-e2e-fixed", allow_expansion=False) as cls,
        own_cluster(
            kube, NS, "fixed", ZOOKEEPER, storage={"storageClassName": cls}, zk_ca_secret=ZK_CA
        ) as target,
    ):
        check(kube, target, "check-fixed", 300)
        before = log_digest(kube, target, "digest-fixed")
        statefulset = kube.json("get", "statefulset", "fixed-storage", "-n", NS)
        pods = uids(kube.pods(NS, target.storage_selector()))

        patch_spec(kube, target, {"storage": {"size": "2Gi"}})
        generation = kube.json("get", "waltzcluster", "fixed", "-n", NS)["metadata"]["generation"]
        degraded = wait_for(
            "Degraded with the API server's refusal",
            lambda: kube.condition(NS, "fixed", "Degraded"),
            600,
            until=lambda c: c.get("status") == "True" and "resize" in c.get("message", ""),
        )
        assert degraded["reason"] == "Refused", degraded  # the rest goes on
        # The API server's own words (the PersistentVolumeClaimResize admission plugin).
        assert "must support resize" in degraded["message"], degraded
        assert degraded["observedGeneration"] == generation, degraded
        # Nothing half-done: the same StatefulSet and pods, the claims as they were.
        now = kube.json("get", "statefulset", "fixed-storage", "-n", NS)
        assert now["metadata"]["uid"] == statefulset["metadata"]["uid"]
        assert uids(kube.pods(NS, target.storage_selector())) == pods
        assert set(claim_sizes(kube, target).values()) == {"1Gi"}
        # Still serving, everything committed intact; the operator still answers.
        check(kube, target, "check-fixed-degraded", 300)
        assert log_digest(kube, target, "digest-fixed-degraded", before) == before
        assert all(pod_ready(p) for p in operator_pods(kube, NS, "waltz"))

        # The size cannot be set back (volumes never shrink: a CRD rule) ...
        out = kube(
            "patch",
            "waltzcluster",
            "fixed",
            "-n",
            NS,
            "--type=merge",
            "-p",
            '{"spec":{"storage":{"size":"1Gi"}}}',
            check=False,
        )
        assert "storage.size can never decrease" in out, out
        # ... the way out is a class that allows expansion (allowVolumeExpansion is the one
        # field of a StorageClass that may change): then it goes through and clears.
        kube("patch", "storageclass", cls, "-p", '{"allowVolumeExpansion": true}')
        wait_for(
            "Degraded cleared",
            lambda: kube.condition(NS, "fixed", "Degraded"),
            600,
            until=lambda c: c.get("status") == "False",
        )
        kube.wait_ready(NS, "fixed")
        check(kube, target, "check-fixed-grown", 300)


def test_growing_the_volumes_recreates_the_statefulset_around_the_running_pods(waltz):
    kube = waltz
    with (
        storage_class(kube, "waltz-e2e-expandable", allow_expansion=True) as cls,
        own_cluster(
            kube, NS, "growing", ZOOKEEPER, storage={"storageClassName": cls}, zk_ca_secret=ZK_CA
        ) as target,
    ):
        check(kube, target, "check-growing", 300)
        before = log_digest(kube, target, "digest-growing")
        old = kube.json("get", "statefulset", "growing-storage", "-n", NS)["metadata"]["uid"]

        def pods() -> dict[str, tuple]:
            """name -> (uid, restarts, ready, the controller's uid)."""
            found = {}
            for p in kube.pods(NS, target.storage_selector()):
                controller = next(
                    (
                        r["uid"]
                        for r in p["metadata"].get("ownerReferences") or []
                        if r.get("controller")
                    ),
                    None,
                )
                restarts = sum(
                    s.get("restartCount", 0) for s in p["status"].get("containerStatuses") or []
                )
                found[p["metadata"]["name"]] = (
                    p["metadata"]["uid"],
                    restarts,
                    pod_ready(p),
                    controller,
                )
            return found

        running = pods()
        assert len(running) == 3 and all(ready for _, _, ready, _ in running.values()), running

        patch_spec(kube, target, {"storage": {"size": "2Gi"}})

        def statefulset() -> dict:
            proc = kube.run("get", "statefulset", "growing-storage", "-n", NS, "-o", "json")
            return json.loads(proc.stdout) if proc.returncode == 0 else {}

        def recreated(s: dict) -> bool:
            if not s or s["metadata"]["uid"] == old:
                return False
            template = s["spec"]["volumeClaimTemplates"][0]
            return template["spec"]["resources"]["requests"]["storage"] == "2Gi"

        new = wait_for(
            "a new StatefulSet with the 2Gi claim template", statefulset, 600, 2, until=recreated
        )
        wait_for(
            "every claim asking for 2Gi",
            lambda: claim_sizes(kube, target),
            300,
            until=lambda sizes: len(sizes) == 3 and set(sizes.values()) == {"2Gi"},
        )
        uid = new["metadata"]["uid"]
        adopted = wait_for(
            "the running pods adopted by the new StatefulSet",
            pods,
            300,
            until=lambda found: all(c == uid for _, _, _, c in found.values()),
        )
        # The same pods, never restarted: the StatefulSet went around them.
        assert {n: (u, r) for n, (u, r, _, _) in adopted.items()} == {
            n: (u, r) for n, (u, r, _, _) in running.items()
        }
        assert all(ready for _, _, ready, _ in adopted.values()), adopted
        assert kube.condition(NS, "growing", "Degraded").get("status") == "False"
        events = kube.json(
            "get",
            "events",
            "-n",
            NS,
            "--field-selector",
            "involvedObject.name=growing,reason=VolumesChanging",
        )["items"]
        assert events, "no VolumesChanging event"
        kube.wait_ready(NS, "growing")
        check(kube, target, "check-growing-grown", 300)
        assert log_digest(kube, target, "digest-growing-grown", before) == before


# --- draining a node -------------------------------------------------------------------------


def test_draining_a_node_respects_the_storage_budget_and_loses_nothing(waltz):
    kube = waltz
    # A worker a drain can empty: no StatefulSet pod there beyond its budget (their local
    # volumes keep them on the node: they come back only once it is uncordoned). Rather
    # not the one the leader operator runs on, so the status keeps coming.
    leader = kube.lease_holder(NS, LEASE)
    leader_node = next(
        (
            p["spec"].get("nodeName")
            for p in operator_pods(kube, NS, "waltz")
            if p["metadata"]["name"] == leader
        ),
        None,
    )
    candidates = {w: unevictable(kube, w) for w in workers(kube)}
    drainable = sorted((w == leader_node, w) for w, problems in candidates.items() if not problems)
    assert drainable, f"no worker can be drained: {candidates}"
    node = drainable[0][1]

    # One storage pod on each worker (so one on the drained node), the servers elsewhere
    # (a server moving would count as partitions without a quorum for a moment).
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {
                        "matchLabels": {
                            "app.kubernetes.io/instance": "drained",
                            "app.kubernetes.io/component": "storage",
                        }
                    },
                }
            ]
        }
    }
    with own_cluster(
        kube,
        NS,
        "drained",
        ZOOKEEPER,
        storage={"affinity": anti},
        server={"replicas": 2, "affinity": not_on_node(node)},
        zk_ca_secret=ZK_CA,
    ) as target:
        pods = kube.pods(NS, target.storage_selector())
        on_node = [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName") == node]
        assert len(on_node) == 1, {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods}
        other = next(p for p in pods if p["spec"].get("nodeName") != node)
        budget = kube.json("get", "pdb", "drained-storage", "-n", NS)["spec"]["maxUnavailable"]
        assert budget == 1, budget
        wait_for(f"{node} drainable", lambda: unevictable(kube, node), 300, until=lambda p: not p)
        check(kube, target, "check-before-drain", 300)
        before = log_digest(kube, target, "digest-before-drain")

        start_check(kube, target, "check-during-drain", 20000, timeout=1500, avoid_node=node)
        writer_running(kube, NS, "check-during-drain")
        time.sleep(10)  # under way
        refused = None
        with Sampler(lambda: (storage_down(kube, target), quorum(kube, target)), 1) as watch:
            try:
                drain = kube.run(
                    "drain",
                    node,
                    "--ignore-daemonsets",
                    "--delete-emptydir-data",
                    "--timeout=600s",
                    timeout=720,
                )
                if drain.returncode == 0:
                    # The evicted storage pod cannot come back while the node is cordoned:
                    # evicting a second one now would leave partitions without a majority,
                    # and the budget must refuse it.
                    refused = kube.evict(NS, other["metadata"]["name"])
                    after = kube.json("get", "pod", other["metadata"]["name"], "-n", NS)
            finally:
                kube("uncordon", node)
        assert drain.returncode == 0, drain.stdout + drain.stderr
        assert refused is not None and refused.returncode != 0, refused
        assert after["metadata"]["uid"] == other["metadata"]["uid"], "evicted past the budget"
        assert not after["metadata"].get("deletionTimestamp"), "evicted past the budget"
        downs = [down for down, _ in watch.samples]
        assert len(downs) >= 5, watch.errors
        assert max(downs) == budget, f"storage pods down at each look: {downs}"
        assert all(full(q) for _, q in watch.samples), watch.samples

        kube.wait_ready(NS, "drained")
        finish_check(kube, target, "check-during-drain")
        assert log_digest(kube, target, "digest-after-drain", before) == before


# --- upgrading from the previous chart -------------------------------------------------------


@pytest.mark.timeout(7200)  # two image builds besides the install and the upgrade
def test_upgrading_from_the_previous_chart_keeps_the_data_and_the_new_operator_leads(
    kind_cluster,
):
    kube = kind_cluster
    release = namespace = "upgrade"
    # Made plain by the previous chart, it stays plain (a running cluster's TLS mode is
    # fixed; the chart keeps the mode of a cluster made before the field).
    # Its ZooKeeper too: an ensemble made plain keeps its plain port on upgrade.
    target = release_target(release, namespace, tls_secret="", zk_tls=False)
    values = (
        "--set",
        "cluster.enabled=true",
        "--set",
        "cluster.storage.size=1Gi",
        "--set",
        "zookeeper.bundled.storage.size=1Gi",
    )
    revision = previous_chart_revision()
    print(f"upgrading from the chart and images of {revision}", flush=True)
    tree = checkout(revision)
    try:
        build_images(tree, PREVIOUS_TAG, PREVIOUS_IMAGES)
        previous = str(tree / "charts" / "waltz")
        helm_install(kube, release, namespace, *values, chart=previous, tag=PREVIOUS_TAG)
        kube.wait_ready(namespace, NAME)
        previous_client = f"{REPOSITORY}/waltz-server:{PREVIOUS_TAG}"
        check(kube, target, "check-before-upgrade", 2000, image=previous_client)
        before = log_digest(kube, target, "digest-before-upgrade")

        start_check(
            kube, target, "check-during-upgrade", 20000, image=previous_client, timeout=1800
        )
        writer_running(kube, namespace, "check-during-upgrade")

        def look() -> tuple[int, int, str]:
            return (
                storage_down(kube, target),
                zookeeper_down(kube, release, namespace),
                quorum(kube, target),
            )

        def pod_images() -> dict[str, tuple[str, bool]]:
            pods = [
                *kube.pods(namespace, target.storage_selector()),
                *kube.pods(namespace, target.server_selector()),
            ]
            return {
                p["metadata"]["name"]: (p["spec"]["containers"][0]["image"], pod_ready(p))
                for p in pods
            }

        def all_new(found: dict[str, tuple[str, bool]]) -> bool:
            return len(found) == 5 and all(
                image.endswith(f":{TAG}") and ready for image, ready in found.values()
            )

        with Sampler(look) as watch:
            # Helm never upgrades CRDs: apply them first, as docs/kubernetes.md says.
            crd = str(ROOT / "charts" / "waltz" / "crds" / "waltzclusters.yaml")
            kube("apply", "--server-side", "--force-conflicts", "-f", crd)
            helm_install(kube, release, namespace, *values)
            wait_for("the cluster's pods on this tree's images", pod_images, 1800, until=all_new)
            wait_settled(kube, target, timeout=1800)
        finish_check(kube, target, "check-during-upgrade")
        assert log_digest(kube, target, "digest-after-upgrade", before) == before
        check(kube, target, "check-after-upgrade", 500)
        # Rolled safely: never more than one storage pod or one ZooKeeper node down.
        assert len(watch.samples) >= 5, watch.errors
        assert max(s[0] for s in watch.samples) <= 1, watch.samples
        assert max(s[1] for s in watch.samples) <= 1, watch.samples
        # The new operators run, and one of them holds the Lease.
        operators = [p for p in operator_pods(kube, namespace, release) if pod_ready(p)]
        assert len(operators) == 2, operators
        assert all(p["spec"]["containers"][0]["image"].endswith(f":{TAG}") for p in operators)
        names = [p["metadata"]["name"] for p in operators]
        assert kube.lease_holder(namespace, f"{release}-waltz-operator") in names
    finally:
        remove_release(kube, release, namespace)
        shutil.rmtree(tree, ignore_errors=True)


# --- uninstalling a release whose cluster does not keep its volumes -----------------------


def test_uninstall_with_retain_volumes_false_takes_the_storage_volumes_only(kind_cluster):
    kube = kind_cluster
    release = namespace = "noretain"
    target = release_target(release, namespace)
    zookeeper = f"app.kubernetes.io/name=zookeeper,app.kubernetes.io/instance={release}"
    try:
        helm_install(
            kube,
            release,
            namespace,
            "--set",
            "cluster.enabled=true",
            "--set",
            "cluster.retainVolumes=false",
            "--set",
            "cluster.storage.size=1Gi",
            "--set",
            "zookeeper.bundled.storage.size=1Gi",
        )
        kube.wait_ready(namespace, NAME)
        check(kube, target, "check-noretain", 200)
        assert sorted(storage_claims(kube, namespace, NAME)) == [
            f"data-{NAME}-storage-{i}" for i in range(3)
        ]
        claims = {c["metadata"]["name"] for c in kube.json("get", "pvc", "-n", namespace)["items"]}
        zookeeper_claims = {c for c in claims if c.startswith(f"data-{release}-zookeeper-")}
        assert len(zookeeper_claims) == 3, claims
        zookeeper_pods = uids(kube.pods(namespace, zookeeper))
        assert len(zookeeper_pods) == 3, zookeeper_pods

        def look() -> dict:
            # Pods before the StatefulSet: if it is still there afterwards, the pods were
            # read before helm deleted it.
            pods = uids(kube.pods(namespace, zookeeper))
            ensemble = kube.run("get", "statefulset", f"{release}-zookeeper", "-n", namespace)
            clusters = kube.json("get", "waltzclusters", "-n", namespace)["items"]
            return {
                "zookeeper": pods if ensemble.returncode == 0 else None,
                "tearing_down": any(c["metadata"].get("deletionTimestamp") for c in clusters),
            }

        with Sampler(look, 1) as watch:
            helm_uninstall(kube, release, namespace)
        # helm uninstall returned: the pre-delete hook saw the WaltzCluster go.
        assert kube.json("get", "waltzclusters", "-n", namespace)["items"] == []
        hook = kube.run("get", "job", f"{release}-waltz-uninstall", "-n", namespace)
        assert hook.returncode != 0, "the hook's Job is deleted once it succeeded"
        # The operator deleted the storage volumes, and nothing of ZooKeeper's: helm leaves
        # a StatefulSet's claims, so ZooKeeper's are all still there.
        wait_for(
            "the storage volumes gone",
            lambda: sorted(storage_claims(kube, namespace, NAME)),
            300,
            until=lambda names: not names,
        )
        left = {c["metadata"]["name"] for c in kube.json("get", "pvc", "-n", namespace)["items"]}
        assert zookeeper_claims <= left, left
        # While the cluster was torn down, ZooKeeper's pods ran on, untouched, until helm
        # deleted their StatefulSet.
        assert any(s["tearing_down"] and s["zookeeper"] for s in watch.samples), watch.samples
        seen = [s["zookeeper"] for s in watch.samples if s["zookeeper"] is not None]
        assert seen and all(pods == zookeeper_pods for pods in seen), (zookeeper_pods, seen)
    finally:
        remove_release(kube, release, namespace)


# --- TLS -------------------------------------------------------------------------------------


def test_the_same_on_mutual_tls_with_cert_manager(secure):
    kube = secure
    faults_under_load(kube, SECURE, tls_secret=f"{NAME}-check-tls")
    # Without a client certificate the servers turn the client away.
    kube.job(
        "secure",
        "no-certificate",
        CLIENT_IMAGE,
        ["waltz", "check", "--transactions", "10", "--timeout", "60"],
        SECURE.env(),
        zk_ca_secret=SECURE.zk_ca_secret,  # it reaches ZooKeeper: only the server refuses
    )
    ok, _ = kube.job_result("secure", "no-certificate")
    assert not ok


def test_helm_test_on_mutual_tls_passes_and_the_client_checks_the_server(secure):
    kube = secure
    helm("test", "secure", "--namespace", "secure", "--kube-context", kube.context, "--logs")
    # The same client certificate with the CA that signed the servers' certificates, and
    # with another CA: the first passes, the second must fail (the client verifies the
    # servers it dials).
    issued = kube.json("get", "secret", f"{NAME}-check-tls", "-n", "secure")["data"]
    foreign = base64.b64encode(trustme.CA().cert_pem.bytes()).decode()
    for name, ca in (("client-own-ca", issued["ca.crt"]), ("client-foreign-ca", foreign)):
        kube.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": "secure"},
                "type": "kubernetes.io/tls",
                "data": {"tls.crt": issued["tls.crt"], "tls.key": issued["tls.key"], "ca.crt": ca},
            }
        )
    check(kube, SECURE, "check-own-ca", 100, tls_secret="client-own-ca")
    start_check(kube, SECURE, "check-foreign-ca", 20, timeout=60, tls_secret="client-foreign-ca")
    ok, log = kube.job_result("secure", "check-foreign-ca")
    assert not ok and not log.strip().endswith("PASS"), log


# --- uninstalling the session's release (last: the tests above use it) -----------------------


def test_uninstall_keeps_the_storage_volumes_when_retain_volumes(waltz):
    kube = waltz
    before = storage_claims(kube, NS, NAME)
    assert len(before) >= 3, before
    # No WaltzCluster deleted by hand: the chart's pre-delete hook deletes it while the
    # operator still runs.
    helm_uninstall(kube, "waltz", NS)
    left = kube.json("get", "waltzclusters", "-n", NS)["items"]
    assert not [c["metadata"]["name"] for c in left if c["metadata"]["name"] == NAME], left
    assert not [c for c in left if c["metadata"].get("deletionTimestamp")], "left Terminating"
    after = storage_claims(kube, NS, NAME)
    assert sorted(after) == sorted(before), "retainVolumes: true keeps every storage volume"
    for claim in after.values():
        assert not claim["metadata"].get("deletionTimestamp"), claim["metadata"]
        assert claim["status"].get("phase") == "Bound", claim["status"]
