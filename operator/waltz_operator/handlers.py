"""The kopf handlers: thin; every decision is in reconcile.py and the pure modules.

``register(registry, config)`` puts them in a registry (a fresh one per operator, so
tests run several side by side). A WaltzCluster is reconciled when it is created,
changed or found at start-up, and every ``reconcile_interval`` seconds (the world moves
without events: pods become ready, replicas catch up, a storage node dies). Status is
written through the status subresource, only when it changed; kopf keeps its own
bookkeeping in ``waltz.io/`` annotations, not in status.
"""

from __future__ import annotations

import copy
import datetime
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from aiohttp import web

from .desired import MANAGED_BY
from .events import Event
from .kube import Connection, KubeApi
from .metrics import OperatorMetrics
from .owned import Key, key_of
from .reconcile import Reconciler, ReconcileSettings

GROUP, VERSION, PLURAL = "waltz.io", "v1alpha1", "waltzclusters"
PREFIX = "waltz.io"

log = logging.getLogger(__name__)


@dataclass
class OperatorConfig:
    connection: Connection
    reconcile_interval: float = 10.0
    delete_timeout: float = 300.0
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = 8080  # None: no metrics endpoint
    # HTTPS for /metrics and /healthz (the system PKI's certificate); None: plain HTTP.
    metrics_ssl: ssl.SSLContext | None = None
    reconcile: ReconcileSettings = field(default_factory=ReconcileSettings)
    # Filled at start-up:
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    reconciler: Reconciler | None = None
    kube: KubeApi | None = None
    runner: web.AppRunner | None = None
    metrics_url: str | None = None


def post(body: Mapping[str, Any], events: list[Event]) -> None:
    for event in events:
        (log.warning if event.type == "Warning" else log.info)(
            "%s/%s: %s: %s",
            body["metadata"].get("namespace"),
            body["metadata"].get("name"),
            event.reason,
            event.message,
        )
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


# kopf asks for credentials again after this long (and at once on a 401), so that a
# rotated service-account token is picked up; the kubelet renews it well before expiry.
TOKEN_RECHECK = datetime.timedelta(seconds=60)


def connection_info(connection: Connection) -> kopf.ConnectionInfo:
    """kopf's credentials: the same server, certificates and current token as ours."""
    token = connection.current_token()
    return kopf.ConnectionInfo(
        server=connection.server,
        scheme="Bearer" if token else None,
        token=token,
        ca_path=connection.ca_file,
        certificate_path=connection.cert_file,
        private_key_path=connection.key_file,
        insecure=connection.insecure or None,
        expiration=(
            datetime.datetime.now(datetime.UTC) + TOKEN_RECHECK if connection.token_file else None
        ),
    )


async def serve_http(config: OperatorConfig) -> None:
    """/metrics and /healthz, once (a replica standing by for the Lease serves them before
    kopf starts)."""
    if config.metrics_port is None or config.runner is not None:
        return
    config.runner = web.AppRunner(config.metrics.app())
    await config.runner.setup()
    site = web.TCPSite(
        config.runner, config.metrics_host, config.metrics_port, ssl_context=config.metrics_ssl
    )
    await site.start()
    port = config.runner.addresses[0][1]
    scheme = "https" if config.metrics_ssl is not None else "http"
    config.metrics_url = f"{scheme}://{config.metrics_host}:{port}/metrics"
    log.info("metrics on %s", config.metrics_url)


OWNED_RESOURCES = (
    ("apps", "v1", "statefulsets"),
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("", "v1", "configmaps"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("networking.k8s.io", "v1", "networkpolicies"),
    # The CA, certificates and ZooKeeper credential it keeps (spec.tls.mode operator):
    # their expiry is checked every reconcile without reading them again.
    ("", "v1", "secrets"),
)


def _index_owned(body: kopf.Body, **_: Any) -> dict[Key, dict[str, Any]]:
    return {key_of(body): copy.deepcopy(dict(body))}


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    resource = {"group": GROUP, "version": VERSION, "plural": PLURAL, "registry": registry}

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=PREFIX, key="last-handled-configuration"
        )
        settings.persistence.finalizer = f"{PREFIX}/finalizer"
        settings.posting.level = logging.INFO
        config.kube = KubeApi(config.connection)
        config.reconciler = Reconciler(config.kube, config.metrics, config.reconcile)
        await serve_http(config)

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        if config.reconciler is not None:
            await config.reconciler.close()
        if config.kube is not None:
            await config.kube.close()
        if config.runner is not None:
            await config.runner.cleanup()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(config.connection)

    # The objects the operator owns, kept by watch streams: a reconcile applies one only
    # when it differs from what is wanted (owned.py), instead of every one every time.
    index_names = []
    for group, version, plural in OWNED_RESOURCES:
        name = f"owned_{plural}"
        index_names.append(name)
        kopf.index(
            group,
            version,
            plural,
            id=name,
            labels={"app.kubernetes.io/managed-by": MANAGED_BY},
            registry=registry,
        )(_index_owned)

    async def reconcile(body: kopf.Body, **kwargs: Any) -> None:
        assert config.reconciler is not None and config.kube is not None
        live: dict[Key, dict[str, Any]] = {}
        for name in index_names:
            for key, store in kwargs[name].items():
                live[key] = next(iter(store))
        outcome = await config.reconciler.reconcile(body, live)
        post(body, outcome.events)
        if outcome.status_changed:
            await config.kube.patch(
                "WaltzCluster",
                body["metadata"]["namespace"],
                body["metadata"]["name"],
                {"status": outcome.status},
                subresource="status",
            )
        if outcome.failed:  # the status says why; look again soon, not in kopf's 60 s
            message = next(
                (c["message"] for c in outcome.status["conditions"] if c["type"] == "Degraded"),
                "reconcile failed",
            )
            raise kopf.TemporaryError(message, delay=config.reconcile_interval)

    kopf.on.create(**resource, id="reconcile-created")(reconcile)
    kopf.on.update(**resource, id="reconcile-changed")(reconcile)
    kopf.on.resume(**resource, id="reconcile-resumed")(reconcile)
    kopf.timer(**resource, id="reconcile-timer", interval=config.reconcile_interval)(reconcile)

    @kopf.on.delete(**resource)
    async def delete(body: kopf.Body, **_: Any) -> None:
        assert config.reconciler is not None
        post(body, await config.reconciler.delete(body, config.delete_timeout))
