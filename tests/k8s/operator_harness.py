"""The operator in-process against the strict API server (strict_api/): kopf and the
operator's own client talk HTTP to it with a bearer token, and it enforces what
kube-apiserver enforces (the CRD's schema, defaults and CEL rules, immutable fields,
resourceVersions, server-side apply, garbage collection). It runs no controllers:
tests play them (``kubelet.py``, or ``api.put`` of the pods they need).

The WaltzCluster CRD is read from ``crds/waltzclusters.yaml`` each time a server
starts, so the rules under test are the ones in the working tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pathlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import kopf
import yaml
from strict_api import StrictApi, strict_api

from waltz_operator.handlers import OperatorConfig, register
from waltz_operator.kube import Connection
from waltz_operator.monitor import MonitorSettings
from waltz_operator.reconcile import ReconcileSettings

WZ = "waltz.io/v1alpha1/waltzclusters"
NS = "prod"
CRD_PATH = pathlib.Path(__file__).resolve().parents[2] / "crds" / "waltzclusters.yaml"
# The operator's credential, as its service account's token would be.
OPERATOR_TOKEN = "waltz-operator-token"
OPERATOR_USER = "system:serviceaccount:waltz-system:waltz-operator"


def load_crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


@contextlib.asynccontextmanager
async def kubernetes_api(**options: Any) -> AsyncIterator[StrictApi]:
    """The server with the WaltzCluster CRD and the namespace ``prod``."""
    async with strict_api(
        crds=[load_crd()],
        namespaces=("default", NS),
        tokens={OPERATOR_TOKEN: OPERATOR_USER},
        **options,
    ) as api:
        yield api


@contextlib.asynccontextmanager
async def running_operator(
    api: StrictApi,
    namespace: str,
    *,
    storage_http: Callable[[str], str | None] | None = None,
    address_book: tuple[str, ...] = (),
    interval: float = 0.3,
    delete_timeout: float = 30.0,
    connection: Connection | None = None,
) -> AsyncIterator[OperatorConfig]:
    """kopf with the operator's handlers, watching ``namespace`` as it is deployed
    (with the operator's token, unless ``connection`` says otherwise)."""
    settings = ReconcileSettings(
        monitor=MonitorSettings(scrape_interval=0.5, scrape_timeout=2.0, zk_timeout=10.0),
        **({"storage_http": storage_http} if storage_http else {}),
        address_book=address_book,
    )
    config = OperatorConfig(
        connection=connection or Connection(server=api.url, token=OPERATOR_TOKEN),
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
            namespaces=[namespace],
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


def create_cluster_object(api: StrictApi, doc: dict[str, Any]) -> dict[str, Any]:
    """Create a WaltzCluster as a user would; returns it as stored (uid, generation,
    the schema's defaults)."""
    return api.put(doc, manager="kubectl")


def obj(api: StrictApi, resource: str, namespace: str | None, name: str) -> Any:
    """The object, or None."""
    return api.get(resource, namespace, name)


async def patch_cluster(api: StrictApi, patch: dict[str, Any], name: str = "demo") -> dict:
    """A user's merge patch of a WaltzCluster (over HTTP, validated like kubectl's)."""
    response = await api.request(
        "PATCH",
        f"/apis/waltz.io/v1alpha1/namespaces/{NS}/waltzclusters/{name}",
        patch,
        content_type="application/merge-patch+json",
        query={"fieldManager": "kubectl"},
    )
    assert response.status == 200, response.body
    return response.body


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
    """A WaltzCluster ``prod/demo`` on the test's ZooKeeper root. In plain text unless
    ``tls`` says otherwise: the kubelet here runs the daemons on 127.0.0.1, where no
    certificate's cluster DNS names resolve (test_operator_pki.py covers the default,
    the operator's own CA)."""
    return {
        "apiVersion": "waltz.io/v1alpha1",
        "kind": "WaltzCluster",
        "metadata": {"name": "demo", "namespace": NS},
        "spec": {
            "partitions": 4,
            "replicasPerPartition": 3,
            "zookeeper": {"connect": zookeeper.connect_string, "root": zk_root},
            "tls": {"mode": "disabled"},
            **spec,
        },
    }


def events(api: StrictApi, reason: str) -> list[dict]:
    """The Events posted with this reason (the stored objects), oldest first."""
    return api.events(reason)
