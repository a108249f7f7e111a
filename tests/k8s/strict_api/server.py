"""The server as tests use it::

    async with strict_api(crds=[crd_doc], tokens={"t0k3n": "operator"}) as api:
        api.url                  # http://127.0.0.1:<port>
        api.put(obj)             # as a controller or the kubelet writes: create or replace
        api.get("apps/v1/statefulsets", "prod", "demo-storage")
        api.requests             # every HTTP request, with its user

The test-side methods skip authentication but nothing else: they go through the same
store, so they get resourceVersions, validation, watch events and garbage collection.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from .errors import ApiError
from .gc import GarbageCollector
from .http import HttpApi, RequestRecord
from .pki import Pki
from .registry import Registry, ResourceType
from .selectors import parse_label_selector
from .store import DeleteOptions, Store

TEST_MANAGER = "strict-api-test"
ADMIN_TOKEN = "strict-api-admin-token"


@dataclass
class Response:
    status: int
    body: Any
    headers: Mapping[str, str]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StrictApi:
    """A running server: its URL, its store, and the test-side API."""

    def __init__(
        self,
        store: Store,
        http: HttpApi,
        tokens: dict[str, str],
        url: str,
        pki: Pki | None,
        gc: GarbageCollector,
    ) -> None:
        self.store = store
        self.registry = store.registry
        self.http = http
        self.tokens = tokens
        self.url = url
        self.pki = pki
        self.gc = gc

    # --- configuration -------------------------------------------------------------------

    @property
    def requests(self) -> list[RequestRecord]:
        """Every HTTP request so far, oldest first."""
        return self.http.requests

    @property
    def expandable(self) -> Callable[[str | None], bool]:
        """Whether a PVC of this StorageClass may grow (default: every class)."""
        return self.store.expandable

    @expandable.setter
    def expandable(self, decide: Callable[[str | None], bool]) -> None:
        self.store.expandable = decide

    def resource(self, name: str | ResourceType) -> ResourceType:
        return name if isinstance(name, ResourceType) else self.registry.resolve(name)

    def load_crd(self, crd: Mapping[str, Any]) -> dict[str, Any]:
        """Create (or replace) a CustomResourceDefinition; its resources are served."""
        rt = self.resource("apiextensions.k8s.io/v1/customresourcedefinitions")
        name = crd["metadata"]["name"]
        if self.store.find(rt, None, name) is None:
            return self.store.create(rt, None, crd, manager=TEST_MANAGER)
        return self.store.update(rt, None, name, crd, manager=TEST_MANAGER, require_rv=False)

    # --- the objects, as controllers and the kubelet write them --------------------------

    def _rt_of(self, obj: Mapping[str, Any]) -> ResourceType:
        rt = self.registry.by_kind(obj.get("apiVersion", ""), obj.get("kind", ""))
        if rt is None:
            raise KeyError(f"no resource for {obj.get('apiVersion')} {obj.get('kind')}")
        return rt

    def put(self, obj: Mapping[str, Any], *, manager: str = TEST_MANAGER) -> dict[str, Any]:
        """Create the object, or replace it (status included), whatever its
        resourceVersion; validated like any write. Returns it as stored."""
        rt = self._rt_of(obj)
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace")
        body = copy.deepcopy(dict(obj))
        body.setdefault("metadata", {}).pop("resourceVersion", None)
        current = self.store.find(rt, ns, meta.get("name", ""))
        if current is None:
            return self.store.create(rt, ns, body, manager=manager, keep_status=True)
        updated = self.store.update(rt, ns, meta["name"], body, manager=manager, require_rv=False)
        if rt.has_status and updated.get("status") != obj.get("status"):
            status_body = {**updated, "status": copy.deepcopy(obj.get("status"))}
            updated = self.store.update(
                rt,
                ns,
                meta["name"],
                status_body,
                manager=manager,
                subresource="status",
                require_rv=False,
            )
        return updated

    def update_status(
        self,
        resource: str | ResourceType,
        namespace: str | None,
        name: str,
        status: Mapping[str, Any] | None,
        *,
        manager: str = TEST_MANAGER,
    ) -> dict[str, Any]:
        """Replace the status (through the status subresource where there is one)."""
        rt = self.resource(resource)
        current = self.store.get(rt, namespace, name)
        current["metadata"].pop("resourceVersion", None)
        current["status"] = copy.deepcopy(dict(status)) if status is not None else None
        if status is None:
            current.pop("status")
        return self.store.update(
            rt,
            namespace,
            name,
            current,
            manager=manager,
            subresource="status" if rt.has_status else "",
            require_rv=False,
        )

    def patch(
        self,
        resource: str | ResourceType,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any],
        *,
        subresource: str = "",
        manager: str = TEST_MANAGER,
    ) -> dict[str, Any]:
        """A merge patch, as a controller sends one."""
        return self.store.patch(
            self.resource(resource),
            namespace,
            name,
            "merge",
            patch,
            manager=manager,
            subresource=subresource,
        )

    def get(
        self, resource: str | ResourceType, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        """The object, or None."""
        found = self.store.find(self.resource(resource), namespace, name)
        return copy.deepcopy(found) if found is not None else None

    def list(
        self,
        resource: str | ResourceType,
        namespace: str | None = None,
        labels: Mapping[str, str] | str | None = None,
    ) -> list[dict[str, Any]]:
        """The objects (of a namespace), optionally selected by labels (a dict or a
        selector string)."""
        if isinstance(labels, Mapping):
            labels = ",".join(f"{k}={v}" for k, v in labels.items())
        requirements = parse_label_selector(labels) if labels else None
        return self.store.items(self.resource(resource), namespace, requirements)

    def remove(
        self,
        resource: str | ResourceType,
        namespace: str | None,
        name: str,
        *,
        grace: int | None = None,
        propagation: str | None = None,
    ) -> bool:
        """Delete as a controller or the kubelet does (finalizers and grace periods
        hold); False if it was not there. ``grace=0`` ends a pod's graceful deletion."""
        try:
            _, gone = self.store.delete(
                self.resource(resource),
                namespace,
                name,
                DeleteOptions(propagation=propagation, grace_seconds=grace),
            )
        except ApiError as e:
            if e.code == 404:
                return False
            raise
        return gone

    def events(
        self, reason: str | None = None, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        """The core/v1 Events stored (with this reason), oldest first."""
        found = [
            e
            for e in self.store.items(self.resource("v1/events"), namespace)
            if reason is None or e.get("reason") == reason
        ]
        return sorted(found, key=lambda e: int(e["metadata"]["resourceVersion"]))

    async def gc_idle(self) -> None:
        """Until the garbage collector has nothing left to do."""
        while True:
            await asyncio.sleep(0)
            await self.gc.idle.wait()
            await asyncio.sleep(0.05)
            if self.gc.idle.is_set() and not self.gc.wakeup.is_set():
                return

    # --- HTTP, as a client ---------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str | None = None,
        query: Mapping[str, str] | None = None,
        token: str | None = ADMIN_TOKEN,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """One HTTP request (as the admin by default; ``token=None``: anonymous)."""
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = body if isinstance(body, str | bytes) else json.dumps(body)
            sent.setdefault("Content-Type", content_type or "application/json")
        ssl_context: Any = False
        if self.pki is not None:
            ssl_context = ssl.create_default_context(cafile=self.pki.ca.cert)
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_context)) as session,
            session.request(method, self.url + path, data=data, headers=sent, params=query) as r,
        ):
            text = await r.text()
            try:
                parsed = json.loads(text) if text else None
            except ValueError:
                parsed = text
            return Response(r.status, parsed, dict(r.headers))


@contextlib.asynccontextmanager
async def strict_api(
    *,
    crds: Iterable[Mapping[str, Any]] = (),
    namespaces: Iterable[str] = ("default",),
    tokens: Mapping[str, str] | None = None,
    pki: Pki | None = None,
    anonymous: bool = False,
    history: int = 10_000,
    bookmark_interval: float = 30.0,
) -> AsyncIterator[StrictApi]:
    """A running server on 127.0.0.1 (HTTPS with ``pki``: client certificates of its CA
    authenticate as their CN). ``tokens`` maps bearer tokens to users; the admin token
    (``ADMIN_TOKEN``, user ``admin``) is always there for ``api.request``."""
    registry = Registry()
    store = Store(registry, history=history)
    token_table = {ADMIN_TOKEN: "admin", **(tokens or {})}
    http = HttpApi(
        store, registry, token_table, anonymous=anonymous, bookmark_interval=bookmark_interval
    )
    runner = web.AppRunner(http.app(), access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    port = _free_port()
    ssl_context = pki.server_context() if pki is not None else None
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=ssl_context)
    await site.start()
    scheme = "https" if pki is not None else "http"
    async with GarbageCollector(store) as gc:
        api = StrictApi(store, http, token_table, f"{scheme}://127.0.0.1:{port}", pki, gc)
        ns_type = registry.resolve("v1/namespaces")
        for name in namespaces:
            store.create(ns_type, None, {"metadata": {"name": name}}, manager=TEST_MANAGER)
        for crd in crds:
            api.load_crd(crd)
        try:
            yield api
        finally:
            http.stop_watches()
            await runner.cleanup()
