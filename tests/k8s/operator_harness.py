"""The operator in-process against kmock (kopf's Kubernetes API emulator).

kmock stores objects and serves list, watch, get, create, merge-patch and delete; it
runs no controllers and sets no uid, generation or status, so ``create_cluster_object``
sets those fields itself, as the API server would, and tests play the controllers
(``set_ready``) where they need pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import kmock
import kopf

from waltz_operator.handlers import OperatorConfig, register
from waltz_operator.kube import Connection
from waltz_operator.monitor import MonitorSettings
from waltz_operator.reconcile import ReconcileSettings

WZ = "waltz.io/v1alpha1/waltzclusters"
NS = "prod"
RESOURCES = {
    "v1/namespaces": ("Namespace", False, set()),
    "v1/events": ("Event", True, set()),
    "v1/pods": ("Pod", True, {"status"}),
    "v1/services": ("Service", True, {"status"}),
    "v1/configmaps": ("ConfigMap", True, set()),
    "v1/secrets": ("Secret", True, set()),
    "v1/persistentvolumeclaims": ("PersistentVolumeClaim", True, {"status"}),
    "apps/v1/statefulsets": ("StatefulSet", True, {"status", "scale"}),
    "apps/v1/deployments": ("Deployment", True, {"status", "scale"}),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", True, {"status"}),
    "networking.k8s.io/v1/networkpolicies": ("NetworkPolicy", True, set()),
    WZ: ("WaltzCluster", True, {"status", "scale"}),
}


@contextlib.asynccontextmanager
async def kubernetes_api() -> AsyncIterator[kmock.KubernetesEmulator]:
    async with kmock.KubernetesEmulator() as api, kmock.Server(api):
        for resource, (kind, namespaced, subresources) in RESOURCES.items():
            api.resources[resource] = {
                "kind": kind,
                "singular": kind.lower(),
                "verbs": {"get", "list", "watch", "create", "patch", "delete"},
                "subresources": subresources,
                "namespaced": namespaced,
            }
        yield api


def api_url(api: kmock.KubernetesEmulator) -> str:
    return str(api.url).rstrip("/")


@contextlib.asynccontextmanager
async def running_operator(
    api: kmock.KubernetesEmulator,
    namespace: str,
    *,
    storage_http: Callable[[str], str | None] | None = None,
    address_book: tuple[str, ...] = (),
    interval: float = 0.3,
    delete_timeout: float = 30.0,
) -> AsyncIterator[OperatorConfig]:
    settings = ReconcileSettings(
        monitor=MonitorSettings(scrape_interval=0.5, scrape_timeout=2.0, zk_timeout=10.0),
        **({"storage_http": storage_http} if storage_http else {}),
        address_book=address_book,
    )
    config = OperatorConfig(
        connection=Connection(server=api_url(api)),
        reconcile_interval=interval,
        delete_timeout=delete_timeout,
        metrics_host="127.0.0.1",
        metrics_port=0,
        reconcile=settings,
    )
    registry = kopf.OperatorRegistry()
    register(registry, config)
    stop = asyncio.Event()
    ready = asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(
            registry=registry,
            standalone=True,
            # Namespaced mode lists v1/namespaces, a path kmock 0.8 cannot parse; the
            # handlers are the same either way.
            clusterwide=True,
            stop_flag=stop,
            ready_flag=ready,
        )
    )
    await asyncio.wait({task, asyncio.ensure_future(ready.wait())}, return_when="FIRST_COMPLETED")
    if task.done():
        task.result()  # raise why it stopped
    _operators.append(task)
    try:
        yield config
    finally:
        _operators.remove(task)
        stop.set()
        try:
            await asyncio.wait_for(task, 60)
        except Exception:
            logging.getLogger(__name__).exception("the operator did not stop cleanly")
        if config.reconciler is not None:  # idempotent; kopf's cleanup may have run it
            await config.reconciler.close()


def create_cluster_object(
    api: kmock.KubernetesEmulator, doc: dict[str, Any], uid: str = "uid-1", generation: int = 1
) -> dict[str, Any]:
    """Store a WaltzCluster as the API server would: with uid, generation, defaults."""
    doc = copy.deepcopy(doc)
    meta = doc["metadata"]
    meta.update(uid=uid, generation=generation, resourceVersion="1")
    api.objects[WZ, meta["namespace"], meta["name"]] = doc
    return doc


def obj(api: kmock.KubernetesEmulator, resource: str, namespace: str, name: str) -> Any:
    for (r, ns, n), found in list(api.objects.items()):
        if (str(r), ns, n) == (str(kmock.resource(resource)), namespace, name):
            return None if found.deleted else found.raw
    return None


_operators: list[asyncio.Task] = []


async def eventually(
    check: Callable[[], Any], timeout: float = 60.0, what: str = "the condition"
) -> Any:
    """Poll ``check`` until it returns something truthy (generous: a busy machine)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        for task in _operators:
            if task.done():
                task.result()
                raise AssertionError("the operator stopped")
        try:
            last = check()
            if last:
                return last
        except (KeyError, TypeError, AssertionError) as e:
            last = e
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout:g} s (last: {last!r})")


def condition(body: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for c in ((body or {}).get("status") or {}).get("conditions", []):
        if c["type"] == kind:
            return c
    return {}


def cluster_doc(zookeeper, zk_root: str, **spec: Any) -> dict[str, Any]:
    """A WaltzCluster ``prod/demo`` on the test's ZooKeeper root."""
    return {
        "apiVersion": "waltz.io/v1alpha1",
        "kind": "WaltzCluster",
        "metadata": {"name": "demo", "namespace": NS},
        "spec": {
            "partitions": 4,
            "replicasPerPartition": 3,
            "zookeeper": {"connect": zookeeper.connect_string, "root": zk_root},
            **spec,
        },
    }


def events(api, reason: str) -> list[dict]:
    """Events the operator posted with this reason. (kmock stores one Event per name and
    ignores generateName, so the posts are read from its request log.)"""
    return [
        request.data
        for request in list(api)
        if request.method.name == "POST"
        and str(request.url.path).endswith("/events")
        and (request.data or {}).get("reason") == reason
    ]
