"""Waltz-level helpers for the end-to-end tests: client checks in Jobs, a digest of the
committed log, the cluster's metadata as ``waltz cluster show --json`` prints it, a
WaltzCluster of a test's own, and a sampler for what must hold while something changes.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .conftest import REPOSITORY, TAG
from .kube import Kube, pod_ready, wait_for

CLIENT_IMAGE = f"{REPOSITORY}/waltz-server:{TAG}"
ZONE_LABEL = "topology.kubernetes.io/zone"


ZK_CA_DIR = "/etc/waltz/zk-tls"


def zookeeper_of(release: str, namespace: str, replicas: int = 3, tls: bool = True) -> str:
    """The connect string of a release's bundled ZooKeeper: its TLS port (the chart's
    default), or the plain one of an ensemble installed before TLS was."""
    port = 2281 if tls else 2181
    return ",".join(
        f"{release}-zookeeper-{i}.{release}-zookeeper-headless.{namespace}.svc:{port}"
        for i in range(replicas)
    )


@dataclass(frozen=True)
class Target:
    """A WaltzCluster and where its clients find it."""

    namespace: str
    name: str
    zookeeper: str
    # A kubernetes.io/tls Secret with a client certificate of the cluster's CA ("": plain
    # text): by default the operator's own CA issues one, <name>-client-tls.
    tls_secret: str = ""
    # A Secret whose ca.crt verifies ZooKeeper's TLS port ("": plain ZooKeeper): the
    # bundled one's is the chart's CA, <release>-waltz-system-ca-cert.
    zk_ca_secret: str = ""

    @property
    def root(self) -> str:
        return f"/waltz/{self.namespace}/{self.name}"

    def env(self) -> dict[str, str]:
        return {"WALTZ_ZOOKEEPER": self.zookeeper, "WALTZ_ROOT": self.root, "HOME": "/tmp"}

    def storage_selector(self) -> str:
        return f"app.kubernetes.io/instance={self.name},app.kubernetes.io/component=storage"

    def server_selector(self) -> str:
        return f"app.kubernetes.io/instance={self.name},app.kubernetes.io/component=server"


def release_target(
    release: str,
    namespace: str,
    name: str = "waltz",
    tls_secret: str | None = None,
    zk_tls: bool = True,
) -> Target:
    """The chart's WaltzCluster (cluster.name ``name``) on the release's own ZooKeeper
    (on TLS, verified with the chart's CA, unless ``zk_tls`` is off); its clients use
    ``tls_secret``, by default the client certificate the operator issues (the chart's
    default, cluster.tls.mode operator)."""
    secret = f"{name}-client-tls" if tls_secret is None else tls_secret
    zk_ca = f"{release}-waltz-system-ca-cert" if zk_tls else ""
    return Target(namespace, name, zookeeper_of(release, namespace, tls=zk_tls), secret, zk_ca)


# --- clients ----------------------------------------------------------------------------


def start_check(
    kube: Kube,
    target: Target,
    job: str,
    transactions: int,
    *,
    image: str = CLIENT_IMAGE,
    timeout: float = 900,
    tls_secret: str = "",
    avoid_node: str = "",
) -> None:
    """``waltz check`` in a Job: appends with contended write locks, follows the committed
    feed, reads back; it fails on any lost, duplicated or out-of-order transaction."""
    kube.job(
        target.namespace,
        job,
        image,
        ["waltz", "check", "--transactions", str(transactions), "--timeout", f"{timeout:g}"],
        target.env(),
        tls_secret or target.tls_secret,
        avoid_node,
        zk_ca_secret=target.zk_ca_secret,
    )


def finish_check(kube: Kube, target: Target, job: str, timeout: float = 1800) -> str:
    ok, log = kube.job_result(target.namespace, job, timeout=timeout)
    assert ok and log.strip().endswith("PASS"), log
    return log


def check(kube: Kube, target: Target, job: str, transactions: int, **options: Any) -> str:
    start_check(kube, target, job, transactions, **options)
    return finish_check(kube, target, job)


# Every committed record of every partition up to a stop (the high-water mark when none
# is given), through the client's range reads: [stop, records, sha256 of their encodings].
_DIGEST = """
import asyncio, hashlib, json, os, sys
from waltz_client import WaltzClient, WaltzClientConfig
from waltz_client.runtime.tls import TlsFiles

async def main():
    stops = json.loads(sys.argv[1])
    tls = None
    if os.environ.get("WALTZ_TLS_CERT"):
        tls = TlsFiles(
            os.environ["WALTZ_TLS_CERT"], os.environ["WALTZ_TLS_KEY"], os.environ["WALTZ_TLS_CA"]
        )
    zk_ca = os.environ.get("WALTZ_ZK_TLS_CA")
    zk_tls = TlsFiles(ca=zk_ca) if zk_ca else None
    config = WaltzClientConfig(
        os.environ["WALTZ_ZOOKEEPER"], zk_root=os.environ["WALTZ_ROOT"], feed=False, tls=tls,
        zk_tls=zk_tls,
    )
    digests = {}
    async with WaltzClient(config) as client:
        for p in range(client.num_partitions):
            stop = stops[str(p)][0] if stops else await client.high_water_mark(p)
            sha, records = hashlib.sha256(), 0
            if stop >= 0:
                async for record in client.read(p, 0, stop):
                    sha.update(record.encode())
                    records += 1
            digests[str(p)] = [stop, records, sha.hexdigest()]
    print("DIGEST " + json.dumps(digests, sort_keys=True), flush=True)

asyncio.run(main())
"""


def log_digest(
    kube: Kube,
    target: Target,
    job: str,
    stops: dict[str, list] | None = None,
    tls_secret: str = "",
) -> dict[str, list]:
    """Partition -> [stop, records, sha256] of the committed log up to ``stops`` (a digest
    taken before: the same prefix read again must be byte for byte the same), or up to
    each high-water mark now."""
    kube.job(
        target.namespace,
        job,
        CLIENT_IMAGE,
        ["python", "-c", _DIGEST, json.dumps(stops)],
        target.env(),
        tls_secret or target.tls_secret,
        zk_ca_secret=target.zk_ca_secret,
    )
    ok, log = kube.job_result(target.namespace, job, timeout=900)
    lines = [line for line in log.splitlines() if line.startswith("DIGEST ")]
    assert ok and lines, log
    digest = json.loads(lines[-1].removeprefix("DIGEST "))
    assert sum(records for _, records, _ in digest.values()) > 0, digest
    return digest


# --- what the cluster looks like ----------------------------------------------------------


def cluster_show(kube: Kube, target: Target) -> dict:
    """``waltz cluster show --json`` run in one of the cluster's server pods."""
    proc = kube.run(
        "exec",
        "-n",
        target.namespace,
        f"deploy/{target.name}-server",
        "--",
        "waltz",
        "cluster",
        "show",
        "--json",
        "--zookeeper",
        target.zookeeper,
        "--root",
        target.root,
        # The server pod has ZooKeeper's CA mounted where the operator puts it.
        *(["--zk-tls-ca", f"{ZK_CA_DIR}/ca.crt"] if target.zk_ca_secret else []),
    )
    # Exit 1 with "problems" listed still prints the cluster.
    assert proc.stdout.strip(), f"waltz cluster show: {proc.stderr.strip()}"
    return json.loads(proc.stdout)


def replicas_of(show: dict) -> dict[int, list[str]]:
    """Partition -> the storage addresses holding a replica of it (the assignment)."""
    held: dict[int, list[str]] = {int(p): [] for p in show["partitions"]}
    for address, storage in show["storages"].items():
        for p in storage["partitions"]:
            held.setdefault(int(p), []).append(address)
    return held


def pod_of(address: str) -> str:
    """``<name>-storage-<i>.<name>-storage.<ns>.svc:55280`` -> ``<name>-storage-<i>``."""
    return address.split(".", 1)[0]


def node_zones(kube: Kube) -> dict[str, str]:
    """Node name -> its zone label ("" without one)."""
    return {
        n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(ZONE_LABEL, "")
        for n in kube.json("get", "nodes")["items"]
    }


def workers(kube: Kube) -> list[str]:
    nodes = kube.json("get", "nodes", "-l", "!node-role.kubernetes.io/control-plane")["items"]
    return sorted(n["metadata"]["name"] for n in nodes)


def status(kube: Kube, target: Target) -> dict:
    return kube.json("get", "waltzcluster", target.name, "-n", target.namespace).get("status") or {}


def quorum(kube: Kube, target: Target) -> str:
    return status(kube, target).get("quorum", "")


def full(quorum_text: str) -> bool:
    held, _, total = quorum_text.partition("/")
    return bool(total) and held == total


def wait_settled(kube: Kube, target: Target, timeout: float = 1200) -> dict:
    """The cluster's status once it is Ready, has seen its latest spec and has nothing in
    progress (no scale, roll or replica move under way)."""

    def look() -> dict:
        obj = kube.json("get", "waltzcluster", target.name, "-n", target.namespace)
        st = obj.get("status") or {}
        conditions = {c["type"]: c for c in st.get("conditions", [])}
        return {
            "current": st.get("observedGeneration") == obj["metadata"]["generation"],
            "ready": conditions.get("Ready", {}).get("status") == "True",
            "progressing": conditions.get("Progressing", {}),
            "status": st,
        }

    return wait_for(
        f"{target.name} Ready with nothing in progress",
        look,
        timeout,
        until=lambda v: v["current"] and v["ready"] and v["progressing"].get("status") == "False",
    )["status"]


def statefulset_down(kube: Kube, namespace: str, name: str, selector: str) -> int:
    """Pods a StatefulSet wants that are not ready (missing, Pending, starting,
    terminating)."""
    statefulset = kube.json("get", "statefulset", name, "-n", namespace)
    wanted = int(statefulset["spec"]["replicas"])
    ready = sum(1 for p in kube.pods(namespace, selector) if pod_ready(p))
    return max(0, wanted - ready)


def storage_down(kube: Kube, target: Target) -> int:
    return statefulset_down(
        kube, target.namespace, f"{target.name}-storage", target.storage_selector()
    )


def zookeeper_down(kube: Kube, release: str, namespace: str) -> int:
    selector = f"app.kubernetes.io/name=zookeeper,app.kubernetes.io/instance={release}"
    return statefulset_down(kube, namespace, f"{release}-zookeeper", selector)


def storage_claims(kube: Kube, namespace: str, cluster: str) -> dict[str, dict]:
    """The storage volumes of a cluster by name (``data-<cluster>-storage-<i>``): other
    claims in the namespace (ZooKeeper's) carry the same instance label."""
    names = re.compile(rf"^data-{re.escape(cluster)}-storage-[0-9]+$")
    claims = kube.json("get", "pvc", "-n", namespace)["items"]
    return {c["metadata"]["name"]: c for c in claims if names.match(c["metadata"]["name"])}


def uids(pods: list[dict]) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


def patch_spec(kube: Kube, target: Target, spec: dict) -> None:
    kube(
        "patch",
        "waltzcluster",
        target.name,
        "-n",
        target.namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": spec}),
    )


# --- a WaltzCluster of a test's own ---------------------------------------------------------


@contextmanager
def own_cluster(
    kube: Kube,
    namespace: str,
    name: str,
    zookeeper: str,
    storage: dict | None = None,
    server: dict | None = None,
    timeout: float = 900,
    zk_ca_secret: str = "",
) -> Iterator[Target]:
    """A WaltzCluster ``name`` in ``namespace`` (whose operator reconciles it) on an
    existing ZooKeeper, Ready; deleted afterwards with ``retainVolumes: false`` (the
    operator deletes its pods, volumes and metadata)."""
    kube.apply(
        {
            "apiVersion": "waltz.io/v1alpha1",
            "kind": "WaltzCluster",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "zookeeper": {
                    "connect": zookeeper,
                    **({"tlsSecret": zk_ca_secret} if zk_ca_secret else {}),
                },
                "storage": {"replicas": 3, "size": "1Gi", **(storage or {})},
                "server": {"replicas": 1, **(server or {})},
                "image": {"repository": REPOSITORY, "tag": TAG},
                "retainVolumes": False,
            },
        }
    )
    try:
        kube.wait_ready(namespace, name, timeout)
        # Clients on the operator's CA; ZooKeeper verified with ``zk_ca_secret``.
        yield Target(namespace, name, zookeeper, f"{name}-client-tls", zk_ca_secret)
    finally:
        print(
            kube(
                "delete",
                "waltzcluster",
                name,
                "-n",
                namespace,
                "--ignore-not-found",
                "--wait",
                "--timeout=600s",
                check=False,
                timeout=700,
            ),
            flush=True,
        )


class Sampler:
    """Calls ``probe`` every ``interval`` seconds in a thread while the block runs, for
    assertions on what held at every look. A probe that fails (an object briefly missing
    while things move) is recorded apart, in ``errors``."""

    def __init__(self, probe: Callable[[], Any], interval: float = 2.0) -> None:
        self.probe = probe
        self.interval = interval
        self.samples: list[Any] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.probe())
            except Exception as e:  # kubectl failing for a moment: keep looking
                self.errors.append(repr(e))
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)


# --- the operator -------------------------------------------------------------------------


def operator_pods(kube: Kube, namespace: str, release: str) -> list[dict]:
    """The release's operator pods that are not being deleted."""
    selector = f"app.kubernetes.io/name=waltz-operator,app.kubernetes.io/instance={release}"
    return [p for p in kube.pods(namespace, selector) if not p["metadata"].get("deletionTimestamp")]


_HEALTHZ = (
    "import urllib.request as u; "
    "print(u.urlopen('http://127.0.0.1:8080/healthz', timeout=5).read().decode())"
)


def operator_role(kube: Kube, namespace: str, pod: str) -> str:
    """What an operator pod says it is on /healthz: leader or standby."""
    proc = kube.run("exec", "-n", namespace, pod, "--", "python", "-c", _HEALTHZ)
    if proc.returncode != 0:
        return f"no answer: {proc.stderr.strip()[-300:]}"
    return str(json.loads(proc.stdout).get("role", ""))


# --- nodes, drains and storage classes ----------------------------------------------------


def unevictable(kube: Kube, node: str) -> list[str]:
    """Why a drain of ``node`` could never finish: StatefulSet pods there (kept on the node
    by their local volumes: a replacement cannot start elsewhere) beyond what their
    disruption budget allows. Budgets are read by their matchLabels (all ours use only
    those); Deployment pods are not counted, their replacements start on other nodes."""
    pods = [
        p
        for p in kube.json("get", "pods", "-A", "--field-selector", f"spec.nodeName={node}")[
            "items"
        ]
        if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]
    problems = []
    for budget in kube.json("get", "pdb", "-A")["items"]:
        meta = budget["metadata"]
        wanted = ((budget.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        pinned = [
            p["metadata"]["name"]
            for p in pods
            if p["metadata"]["namespace"] == meta["namespace"]
            and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())
            and any(
                r.get("kind") == "StatefulSet" for r in p["metadata"].get("ownerReferences") or []
            )
        ]
        allowed = int((budget.get("status") or {}).get("disruptionsAllowed") or 0)
        if len(pinned) > allowed:
            problems.append(
                f"{meta['namespace']}/{meta['name']}: {', '.join(pinned)} on {node}, "
                f"{allowed} disruption(s) allowed"
            )
    return problems


@contextmanager
def storage_class(kube: Kube, name: str, allow_expansion: bool) -> Iterator[str]:
    """A StorageClass like the cluster's default (kind's: rancher.io/local-path), with
    ``allowVolumeExpansion`` as given; deleted afterwards."""
    default = next(
        c
        for c in kube.json("get", "storageclass")["items"]
        if (c["metadata"].get("annotations") or {}).get(
            "storageclass.kubernetes.io/is-default-class"
        )
        == "true"
    )
    kube.apply(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": name},
            "provisioner": default["provisioner"],
            "parameters": default.get("parameters") or {},
            "reclaimPolicy": "Delete",
            "volumeBindingMode": default.get("volumeBindingMode") or "WaitForFirstConsumer",
            "allowVolumeExpansion": allow_expansion,
        }
    )
    try:
        yield name
    finally:
        kube("delete", "storageclass", name, "--ignore-not-found", check=False)
