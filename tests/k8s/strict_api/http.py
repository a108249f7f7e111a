"""The HTTP API: kube-apiserver's paths and verbs over the store, for kopf and the
operator's own client. Discovery (``/version``, ``/api``, ``/apis``, the resource
lists with their subresources), get, list (selectors, ``limit``/``continue``), watch
(JSON lines; ``resourceVersion``, bookmarks, ``timeoutSeconds``,
``sendInitialEvents``; a forgotten resourceVersion is an ERROR event with 410), create,
update, the four patch types, delete, the status and scale subresources.

Every request is authenticated first (401 without a known token or client
certificate) and written to the request log with its user.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from aiohttp import web

from . import errors
from .auth import PUBLIC_PATHS, user_of
from .errors import ApiError
from .patches import json_patch, merge_patch
from .registry import Registry, ResourceType
from .schema import KUBERNETES_VERSION
from .selectors import parse_field_selector, parse_label_selector
from .store import DeleteOptions, Store

PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/json-patch+json": "json",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
}


@dataclass
class RequestRecord:
    """One request, as tests count and read them."""

    method: str
    path: str
    query: dict[str, str]
    body: Any
    user: str | None
    content_type: str
    agent: str = ""
    status: int = 0

    @property
    def subresource(self) -> str:
        parts = self.path.rstrip("/").split("/")
        return parts[-1] if parts[-1] in ("status", "scale") and len(parts) > 5 else ""


@dataclass
class Target:
    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str


class HttpApi:
    def __init__(
        self,
        store: Store,
        registry: Registry,
        tokens: Mapping[str, str],
        *,
        anonymous: bool = False,
        bookmark_interval: float = 30.0,
    ) -> None:
        self.store = store
        self.registry = registry
        self.tokens = tokens
        self.anonymous = anonymous
        self.bookmark_interval = bookmark_interval
        self.requests: list[RequestRecord] = []
        self._stopping = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    def stop_watches(self) -> None:
        self._stopping.set()
        for watcher in list(self.store.watchers):
            watcher.queue.put_nowait(("STOP", {}))

    # --- the entry point -----------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
        raw = await request.read()
        record = RequestRecord(
            request.method,
            request.path,
            dict(request.query),
            None,
            None,
            content_type,
            request.headers.get("User-Agent", ""),
        )
        self.requests.append(record)
        try:
            record.body = self._decode(raw, content_type)
            if request.path not in PUBLIC_PATHS:
                record.user = user_of(request, self.tokens, self.anonymous)
                if record.user is None:
                    raise errors.unauthorized()
            response = await self._dispatch(request, record)
        except ApiError as e:
            response = web.json_response(e.status(), status=e.code)
        record.status = response.status
        return response

    @staticmethod
    def _decode(raw: bytes, content_type: str) -> Any:
        if not raw:
            return None
        try:
            if content_type == "application/apply-patch+yaml":
                return yaml.safe_load(raw.decode())
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as e:
            raise errors.bad_request(f"the body of the request could not be decoded: {e}") from e

    async def _dispatch(self, request: web.Request, record: RequestRecord) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        method = request.method
        if parts in (["healthz"], ["livez"], ["readyz"]):
            return web.Response(text="ok")
        if parts == ["version"]:
            major, minor, _ = KUBERNETES_VERSION.split(".")
            return web.json_response(
                {
                    "major": major,
                    "minor": minor,
                    "gitVersion": f"v{KUBERNETES_VERSION}-strict",
                    "platform": "linux/amd64",
                }
            )
        if parts == ["api"]:
            return web.json_response(
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": request.host}
                    ],
                }
            )
        if parts == ["apis"]:
            return web.json_response(self.registry.api_group_list())
        if len(parts) == 2 and parts[0] == "apis":
            found = self.registry.api_group(parts[1])
            if found is None:
                raise self._no_path()
            return web.json_response(found)
        if parts[:1] == ["api"] and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise self._no_path()
        if not rest:
            found = self.registry.resource_list(group, version)
            if found is None:
                raise self._no_path()
            return web.json_response(found)
        target = self._target(group, version, rest)
        query = record.query
        if target.name is None:
            if method == "GET":
                if query.get("watch") in ("true", "1"):
                    return await self._watch(request, target, query)
                return web.json_response(self._list(target, query))
            if method == "POST":
                return self._create(target, record)
            if method == "DELETE":
                return self._delete_collection(target, record)
            raise errors.method_not_allowed(
                "the server does not allow this method on the requested resource"
            )
        if target.subresource == "scale":
            return self._scale(target, record)
        if method == "GET":
            obj = self.store.get(target.rt, target.namespace, target.name)
            return web.json_response(obj)
        if method == "PUT":
            return self._update(target, record)
        if method == "PATCH":
            return self._patch(target, record)
        if method == "DELETE" and not target.subresource:
            return self._delete(target, record)
        raise errors.method_not_allowed(
            "the server does not allow this method on the requested resource"
        )

    @staticmethod
    def _no_path() -> ApiError:
        return ApiError(404, "NotFound", "the server could not find the requested resource")

    def _target(self, group: str, version: str, rest: list[str]) -> Target:
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
        rt = self.registry.find(group, version, rest[0])
        if rt is None or len(rest) > 3:
            raise self._no_path()
        if namespace is not None and not rt.namespaced:
            raise self._no_path()
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else ""
        if subresource and subresource not in rt.subresources:
            raise self._no_path()
        if name is not None and rt.namespaced and namespace is None:
            raise self._no_path()
        return Target(rt, namespace, name, subresource)

    # --- helpers -------------------------------------------------------------------------

    @staticmethod
    def _manager(record: RequestRecord) -> str:
        """The fieldManager parameter, else the User-Agent's first word (as
        kube-apiserver names an update's manager)."""
        manager = record.query.get("fieldManager")
        if manager:
            if len(manager) > 128:
                raise errors.bad_request("fieldManager: Too long: may not be more than 128 bytes")
            return manager
        return record.agent.split("/")[0] if record.agent else "unknown"

    @staticmethod
    def _strict(record: RequestRecord) -> bool:
        validation = record.query.get("fieldValidation", "Warn")
        if validation not in ("Strict", "Warn", "Ignore"):
            raise errors.bad_request(
                f'fieldValidation: Unsupported value: "{validation}": supported values: '
                '"Ignore", "Strict", "Warn"'
            )
        return validation == "Strict"

    @staticmethod
    def _reply(obj: Any, status: int = 200, warnings: list[str] | None = None) -> web.Response:
        headers = {}
        if warnings:
            headers["Warning"] = ", ".join(f"299 - {json.dumps(w)}" for w in warnings)
        return web.json_response(obj, status=status, headers=headers)

    @staticmethod
    def _no_dry_run(record: RequestRecord) -> None:
        if record.query.get("dryRun"):
            raise errors.bad_request("dryRun is not supported by this test server")

    # --- list and watch ------------------------------------------------------------------

    def _selectors(self, target: Target, query: Mapping[str, str]) -> tuple[list, list]:
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(
            query.get("fieldSelector", ""), target.rt.kind, target.rt.custom
        )
        return labels, fields

    def _list(self, target: Target, query: Mapping[str, str]) -> dict[str, Any]:
        rt = target.rt
        labels, fields = self._selectors(target, query)
        items = self.store.items(rt, target.namespace, labels, fields)
        token = query.get("continue")
        list_rv = str(self.store.rv)
        if token:
            try:
                state = json.loads(base64.b64decode(token))
                start = tuple(state["start"])
                list_rv = state["rv"]
            except (ValueError, KeyError, TypeError):
                raise errors.bad_request("continue key is not valid") from None
            items = [
                i
                for i in items
                if (i["metadata"].get("namespace", ""), i["metadata"]["name"]) > start
            ]
        metadata: dict[str, Any] = {"resourceVersion": list_rv}
        limit = int(query.get("limit") or 0)
        if limit and len(items) > limit:
            last = items[limit - 1]["metadata"]
            metadata["continue"] = base64.b64encode(
                json.dumps(
                    {"rv": list_rv, "start": [last.get("namespace", ""), last["name"]]}
                ).encode()
            ).decode()
            metadata["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        if not rt.custom:  # a built-in list's items do not repeat their kind
            for item in items:
                item.pop("kind", None)
                item.pop("apiVersion", None)
        return {
            "kind": f"{rt.kind}List",
            "apiVersion": rt.api_version,
            "metadata": metadata,
            "items": items,
        }

    async def _watch(
        self, request: web.Request, target: Target, query: Mapping[str, str]
    ) -> web.StreamResponse:
        rt = target.rt
        labels, fields = self._selectors(target, query)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        initial = query.get("sendInitialEvents") in ("true", "1")
        since = query.get("resourceVersion")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            watcher = self.store.watch(
                rt, target.namespace, None if initial else since, labels, fields
            )
            initial_events = watcher.queue.qsize()  # the ADDED of what exists, queued first
        except ApiError as e:
            if e.code != 410:
                raise
            await response.prepare(request)
            await self._send(response, "ERROR", e.status())
            await response.write_eof()
            return response
        await response.prepare(request)
        timeout = float(query.get("timeoutSeconds") or 0) or None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        try:
            if initial:
                for _ in range(initial_events):
                    kind, obj = watcher.queue.get_nowait()
                    await self._send(response, kind, obj)
                await self._send(
                    response,
                    "BOOKMARK",
                    self._bookmark(rt, {"k8s.io/initial-events-end": "true"}),
                )
            while not self._stopping.is_set():
                wait = self.bookmark_interval
                if deadline is not None:
                    wait = min(wait, deadline - loop.time())
                    if wait <= 0:
                        break
                try:
                    kind, obj = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and watcher.queue.empty():
                        await self._send(response, "BOOKMARK", self._bookmark(rt))
                    continue
                if kind == "STOP":
                    break
                await self._send(response, kind, obj)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.store.unwatch(watcher)
        return response

    def _bookmark(
        self, rt: ResourceType, annotations: dict[str, str] | None = None
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {"resourceVersion": str(self.store.rv)}
        if annotations:
            meta["annotations"] = annotations
        return {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}

    @staticmethod
    async def _send(response: web.StreamResponse, kind: str, obj: Mapping[str, Any]) -> None:
        line = json.dumps({"type": kind, "object": obj}) + "\n"
        await response.write(line.encode())

    # --- writes --------------------------------------------------------------------------

    def _create(self, target: Target, record: RequestRecord) -> web.Response:
        self._no_dry_run(record)
        if target.rt.namespaced and target.namespace is None:
            raise errors.method_not_allowed(
                "the server does not allow this method on the requested resource"
            )
        warnings: list[str] = []
        obj = self.store.create(
            target.rt,
            target.namespace,
            record.body,
            manager=self._manager(record),
            strict_fields=self._strict(record),
            warnings=warnings,
        )
        return self._reply(obj, 201, warnings)

    def _update(self, target: Target, record: RequestRecord) -> web.Response:
        self._no_dry_run(record)
        assert target.name is not None
        warnings: list[str] = []
        obj = self.store.update(
            target.rt,
            target.namespace,
            target.name,
            record.body,
            manager=self._manager(record),
            subresource=target.subresource,
            strict_fields=self._strict(record),
            warnings=warnings,
        )
        return self._reply(obj, 200, warnings)

    def _patch(self, target: Target, record: RequestRecord) -> web.Response:
        self._no_dry_run(record)
        assert target.name is not None
        patch_type = PATCH_TYPES.get(record.content_type)
        accepted = list(PATCH_TYPES)
        if target.rt.custom:
            accepted.remove("application/strategic-merge-patch+json")
        if patch_type is None or record.content_type not in accepted:
            raise errors.unsupported_media_type(record.content_type, accepted)
        force = record.query.get("force") in ("true", "1")
        if patch_type == "apply":
            if not record.query.get("fieldManager"):
                raise errors.bad_request("fieldManager is required for apply requests")
        elif "force" in record.query:
            raise errors.bad_request(
                "force: Invalid value: may not be specified for non-apply patch"
            )
        if record.body is None:
            raise errors.bad_request("the body of the request was empty")
        warnings: list[str] = []
        existed = self.store.find(target.rt, target.namespace, target.name) is not None
        obj = self.store.patch(
            target.rt,
            target.namespace,
            target.name,
            patch_type,
            record.body,
            manager=self._manager(record),
            subresource=target.subresource,
            force=force,
            strict_fields=self._strict(record),
            warnings=warnings,
        )
        return self._reply(obj, 200 if existed else 201, warnings)

    def _delete(self, target: Target, record: RequestRecord) -> web.Response:
        self._no_dry_run(record)
        assert target.name is not None
        options = DeleteOptions.parse(record.body, record.query)
        obj, gone = self.store.delete(target.rt, target.namespace, target.name, options)
        if gone and target.rt.kind != "Pod":
            details: dict[str, Any] = {
                "name": target.name,
                "kind": target.rt.plural,
                "uid": obj["metadata"]["uid"],
            }
            if target.rt.group:
                details["group"] = target.rt.group
            return web.json_response(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": details,
                }
            )
        return web.json_response(obj)

    def _delete_collection(self, target: Target, record: RequestRecord) -> web.Response:
        self._no_dry_run(record)
        labels, fields = self._selectors(target, record.query)
        options = DeleteOptions.parse(record.body, record.query)
        for item in self.store.items(target.rt, target.namespace, labels, fields):
            meta = item["metadata"]
            with contextlib.suppress(ApiError):
                self.store.delete(target.rt, meta.get("namespace"), meta["name"], options)
        return web.json_response(self._list(target, record.query))

    def _scale(self, target: Target, record: RequestRecord) -> web.Response:
        assert target.name is not None
        rt = target.rt
        obj = self.store.get(rt, target.namespace, target.name)
        paths = rt.scale
        if record.method in ("PUT", "PATCH"):
            self._no_dry_run(record)
            current = self._scale_of(rt, obj)
            if record.method == "PUT":
                wanted = record.body or {}
            elif record.content_type == "application/json-patch+json":
                wanted = json_patch(current, record.body)
            else:
                wanted = merge_patch(current, record.body or {})
            given = (wanted.get("metadata") or {}).get("resourceVersion")
            if given and given != obj["metadata"]["resourceVersion"]:
                raise errors.conflict(rt.group, rt.plural, target.name)
            replicas = (wanted.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise errors.invalid(
                    "autoscaling",
                    "Scale",
                    "scale",
                    target.name,
                    [
                        errors.FieldError(
                            "Invalid",
                            "spec.replicas",
                            "must be greater than or equal to 0",
                            replicas,
                        )
                    ],
                )
            new = json.loads(json.dumps(obj))
            _set_path(new, paths["specReplicasPath"], replicas)
            new["metadata"].pop("resourceVersion", None)
            obj = self.store.update(
                rt,
                target.namespace,
                target.name,
                new,
                manager=self._manager(record),
                require_rv=False,
            )
        elif record.method != "GET":
            raise errors.method_not_allowed(
                "the server does not allow this method on the requested resource"
            )
        return web.json_response(self._scale_of(rt, obj))

    @staticmethod
    def _scale_of(rt: ResourceType, obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        paths = rt.scale
        status: dict[str, Any] = {
            "replicas": _get_path(obj, paths.get("statusReplicasPath", "")) or 0
        }
        selector = _get_path(obj, paths.get("labelSelectorPath", ""))
        if isinstance(selector, str):
            status["selector"] = selector
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: meta[k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in meta
            },
            "spec": {"replicas": _get_path(obj, paths.get("specReplicasPath", "")) or 0},
            "status": status,
        }


def _get_path(obj: Any, path: str) -> Any:
    for part in [p for p in path.split(".") if p]:
        obj = obj.get(part) if isinstance(obj, Mapping) else None
    return obj


def _set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = [p for p in path.split(".") if p]
    for part in parts[:-1]:
        obj = obj.setdefault(part, {})
    obj[parts[-1]] = value
