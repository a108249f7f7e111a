"""The objects, and the bookkeeping of every write: resourceVersion (one global counter,
as etcd's revision), uid, creationTimestamp, generation (bumped only by changes outside
metadata and status), the status subresource's isolation, optimistic concurrency,
finalizers and deletion, field ownership, and the history of events that watches
replay from a resourceVersion.

Every method is synchronous: a write and the watch events it causes happen at once, in
order, in the event loop's thread. The HTTP layer and the test-side API both call here.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import random
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import builtins, errors, ssa
from .admission import admit
from .errors import ApiError, FieldError
from .patches import json_patch, merge_patch, strategic_merge_patch
from .registry import Registry, ResourceType
from .selectors import FieldRequirement, Requirement, matches_fields, matches_labels

Key = tuple[str, str, str]  # (resource key, namespace or "", name)

GC_MANAGER = "kube-controller-manager"
ORPHAN = "orphan"
FOREGROUND = "foregroundDeletion"
# Server-owned metadata: whatever a request says, the stored value stands.
SERVER_FIELDS = (
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "selfLink",
)


def timestamp(moment: datetime.datetime | None = None) -> str:
    moment = moment or datetime.datetime.now(datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _random_suffix() -> str:
    # k8s.io/apimachinery/pkg/util/rand.String: no vowels, no confusable characters
    return "".join(random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))


@dataclass
class Event:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    resource: str
    namespace: str
    old: dict[str, Any] | None
    new: dict[str, Any]


@dataclass(eq=False)
class Watcher:
    resource: str
    namespace: str | None
    labels: list[Requirement]
    fields: list[FieldRequirement]
    queue: asyncio.Queue[tuple[str, dict[str, Any]]] = field(default_factory=asyncio.Queue)

    def _matches(self, obj: Mapping[str, Any] | None) -> bool:
        if obj is None:
            return False
        return matches_labels(self.labels, (obj.get("metadata") or {}).get("labels")) and (
            matches_fields(self.fields, obj)
        )

    def offer(self, event: Event) -> None:
        if event.resource != self.resource:
            return
        if self.namespace is not None and event.namespace != self.namespace:
            return
        now, before = self._matches(event.new), self._matches(event.old)
        if event.type == "MODIFIED":
            if now and before:
                self.queue.put_nowait(("MODIFIED", event.new))
            elif now:
                self.queue.put_nowait(("ADDED", event.new))
            elif before:  # left the selection: a DELETED, as kube-apiserver sends
                self.queue.put_nowait(("DELETED", event.new))
        elif now:
            self.queue.put_nowait((event.type, event.new))


@dataclass
class DeleteOptions:
    propagation: str | None = None
    grace_seconds: int | None = None
    uid: str | None = None
    resource_version: str | None = None

    @classmethod
    def parse(cls, body: Any, query: Mapping[str, str]) -> DeleteOptions:
        body = body if isinstance(body, Mapping) else {}
        preconditions = body.get("preconditions") or {}
        propagation = body.get("propagationPolicy") or query.get("propagationPolicy")
        orphan = body.get("orphanDependents")
        if propagation is None and orphan is not None:
            propagation = "Orphan" if orphan else "Background"
        grace = body.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
        if propagation not in (None, "Orphan", "Background", "Foreground"):
            raise ApiError(
                422,
                "Invalid",
                f'DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: Unsupported value: '
                f'"{propagation}": supported values: "Foreground", "Background", "Orphan", "nil"',
            )
        return cls(
            propagation,
            int(grace) if grace is not None else None,
            preconditions.get("uid"),
            preconditions.get("resourceVersion"),
        )


def _spec_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What metadata.generation counts: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


class Store:
    def __init__(self, registry: Registry, history: int = 10_000) -> None:
        self.registry = registry
        self.objects: dict[Key, dict[str, Any]] = {}
        self.rv = 0
        self.history: deque[Event] = deque(maxlen=history)
        self.compacted = 0  # events up to this resourceVersion are forgotten
        self.watchers: set[Watcher] = set()
        self.cluster_ips = builtins.ClusterIPs()
        # Whether a StorageClass allows volume expansion (None: the default class).
        self.expandable: Callable[[str | None], bool] = lambda storage_class: True
        self.gc_wakeup: asyncio.Event | None = None

    # --- reading -------------------------------------------------------------------------

    def key(self, rt: ResourceType, namespace: str | None, name: str) -> Key:
        return (rt.key, namespace or "" if rt.namespaced else "", name)

    def find(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any] | None:
        return self.objects.get(self.key(rt, namespace, name))

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        found = self.find(rt, namespace, name)
        if found is None:
            raise errors.not_found(rt.group, rt.plural, name)
        return copy.deepcopy(found)

    def items(
        self,
        rt: ResourceType,
        namespace: str | None = None,
        labels: list[Requirement] | None = None,
        fields: list[FieldRequirement] | None = None,
    ) -> list[dict[str, Any]]:
        out = []
        for (resource, ns, _), obj in sorted(self.objects.items()):
            if resource != rt.key or (namespace and rt.namespaced and ns != namespace):
                continue
            if labels and not matches_labels(labels, (obj.get("metadata") or {}).get("labels")):
                continue
            if fields and not matches_fields(fields, obj):
                continue
            out.append(copy.deepcopy(obj))
        return out

    def all_objects(self) -> Iterator[tuple[ResourceType, dict[str, Any]]]:
        types = {t.key: t for t in self.registry.types}
        for (resource, _, _), obj in list(self.objects.items()):
            if resource in types:
                yield types[resource], obj

    # --- watch ---------------------------------------------------------------------------

    def watch(
        self,
        rt: ResourceType,
        namespace: str | None,
        since: str | None,
        labels: list[Requirement],
        fields: list[FieldRequirement],
    ) -> Watcher:
        """A watcher with the events after ``since`` already queued (no ``since`` or "0":
        an ADDED for every object first); 410 if those events are forgotten."""
        watcher = Watcher(rt.key, namespace if rt.namespaced else None, labels, fields)
        if since in (None, "", "0"):
            for obj in self.items(rt, namespace, labels, fields):
                watcher.queue.put_nowait(("ADDED", obj))
        else:
            try:
                start = int(since)  # type: ignore[arg-type]
            except ValueError:
                raise errors.bad_request(f'invalid resource version "{since}"') from None
            if start < self.compacted:
                raise errors.expired(f"too old resource version: {start} ({self.compacted + 1})")
            for event in self.history:
                if event.rv > start:
                    watcher.offer(event)
        self.watchers.add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self.watchers.discard(watcher)

    def compact(self) -> None:
        """Forget the history, as etcd's compaction does: older watches get 410."""
        self.history.clear()
        self.compacted = self.rv

    def _emit(self, event: Event) -> None:
        if len(self.history) == self.history.maxlen and self.history:
            self.compacted = self.history[0].rv
        self.history.append(event)
        for watcher in list(self.watchers):
            watcher.offer(event)

    def _wake_gc(self) -> None:
        if self.gc_wakeup is not None:
            self.gc_wakeup.set()

    def _next_rv(self) -> int:
        self.rv += 1
        return self.rv

    # --- create --------------------------------------------------------------------------

    def _check_body(self, rt: ResourceType, body: Any, namespace: str | None) -> dict[str, Any]:
        if not isinstance(body, Mapping):
            raise errors.bad_request(
                f"json: cannot unmarshal {type(body).__name__} into Go value of type {rt.kind}"
            )
        obj = copy.deepcopy(dict(body))
        if obj.get("apiVersion", rt.api_version) != rt.api_version:
            raise errors.bad_request(
                f"the API version in the data ({obj['apiVersion']}) does not match the "
                f"expected API version ({rt.api_version})"
            )
        if obj.get("kind", rt.kind) != rt.kind:
            raise errors.bad_request(
                f"the kind in the data ({obj['kind']}) does not match the expected kind ({rt.kind})"
            )
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        if rt.namespaced:
            if meta.get("namespace") and namespace and meta["namespace"] != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            if namespace:
                meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        return obj

    def _namespace_allows(self, rt: ResourceType, namespace: str | None, name: str) -> None:
        """NamespaceLifecycle: no new objects in a missing or terminating namespace."""
        if not rt.namespaced:
            return
        ns_type = self.registry.resolve("v1/namespaces")
        found = self.find(ns_type, None, namespace or "")
        if found is None:
            raise errors.not_found("", "namespaces", namespace or "")
        if found["metadata"].get("deletionTimestamp"):
            raise errors.forbidden(
                rt.group,
                rt.plural,
                name,
                f"unable to create new content in namespace {namespace} because it is being "
                "terminated",
            )

    def create(
        self,
        rt: ResourceType,
        namespace: str | None,
        body: Any,
        *,
        manager: str,
        keep_status: bool = False,
        strict_fields: bool = False,
        applied: bool = False,
        warnings: list[str] | None = None,
    ) -> dict[str, Any]:
        obj = self._check_body(rt, body, namespace)
        meta = obj["metadata"]
        if meta.get("resourceVersion"):
            raise errors.bad_request("resourceVersion should not be set on objects to be created")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + _random_suffix()
        for name in (*SERVER_FIELDS, "managedFields"):
            if not (applied and name == "managedFields"):
                meta.pop(name, None)
        if rt.has_status and not keep_status:
            obj.pop("status", None)
            if rt.kind == "Pod":
                obj["status"] = {"phase": "Pending"}
        name = meta.get("name") or ""
        if name:
            self._namespace_allows(rt, meta.get("namespace"), name)
        obj, warned = self._admit(rt, obj, None, strict_fields)
        if warnings is not None:
            warnings += warned
        meta = obj["metadata"]
        if self.find(rt, meta.get("namespace"), meta["name"]) is not None:
            raise errors.already_exists(rt.group, rt.plural, meta["name"])
        if rt.kind == "CustomResourceDefinition":
            self._serve_crd(obj)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = timestamp()
        if rt.generation:
            meta["generation"] = 1
        if not applied:
            ssa.track_update(None, obj, rt.schema_or_any, manager, "", rt.has_status)
        rv = self._next_rv()
        meta["resourceVersion"] = str(rv)
        self.objects[self.key(rt, meta.get("namespace"), meta["name"])] = obj
        self._emit(Event(rv, "ADDED", rt.key, meta.get("namespace", ""), None, copy.deepcopy(obj)))
        if meta.get("ownerReferences"):
            self._wake_gc()
        return copy.deepcopy(obj)

    def _admit(
        self, rt: ResourceType, obj: dict[str, Any], old: Mapping[str, Any] | None, strict: bool
    ) -> tuple[dict[str, Any], list[str]]:
        return admit(
            rt,
            obj,
            old,
            strict_fields=strict,
            cluster_ips=self.cluster_ips,
            expandable=self.expandable,
        )

    # --- update --------------------------------------------------------------------------

    def update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        manager: str,
        subresource: str = "",
        require_rv: bool = True,
        strict_fields: bool = False,
        warnings: list[str] | None = None,
    ) -> dict[str, Any]:
        """PUT: replace the object (or its status); 409 on a stale resourceVersion."""
        old = self.find(rt, namespace, name)
        if old is None:
            raise errors.not_found(rt.group, rt.plural, name)
        new = self._check_body(rt, body, namespace)
        meta = new["metadata"]
        if meta.get("name", name) != name:
            raise errors.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL "
                f"({name})"
            )
        meta["name"] = name
        given = meta.get("resourceVersion")
        if given:
            if given != old["metadata"]["resourceVersion"]:
                raise errors.conflict(rt.group, rt.plural, name)
        elif require_rv and rt.custom:
            raise errors.invalid(
                rt.group,
                rt.kind,
                rt.plural,
                name,
                [
                    FieldError(
                        "Invalid",
                        "metadata.resourceVersion",
                        "must be specified for an update",
                        0,
                    )
                ],
            )
        return self._commit(
            rt,
            old,
            new,
            manager=manager,
            subresource=subresource,
            strict=strict_fields,
            warnings=warnings,
        )

    def _commit(
        self,
        rt: ResourceType,
        old: dict[str, Any],
        new: dict[str, Any],
        *,
        manager: str,
        subresource: str,
        strict: bool = False,
        operation: str = "Update",
        warnings: list[str] | None = None,
    ) -> dict[str, Any]:
        """Store ``new`` in place of ``old`` after every check; a write that changes
        nothing is not a write (no new resourceVersion, no event)."""
        old_meta = old["metadata"]
        name = old_meta["name"]
        applied_fields = (new.get("metadata") or {}).get("managedFields")
        if subresource == "status":
            status = new.get("status")
            new = copy.deepcopy(old)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
        elif rt.has_status:
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        meta = new.setdefault("metadata", {})
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            raise errors.invalid(
                rt.group,
                rt.kind,
                rt.plural,
                name,
                [FieldError("Invalid", "metadata.uid", "field is immutable", meta["uid"])],
            )
        for key in SERVER_FIELDS:
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        meta["namespace"] = old_meta.get("namespace")
        if not rt.namespaced:
            meta.pop("namespace", None)
        meta["resourceVersion"] = old_meta["resourceVersion"]
        meta.pop("managedFields", None)
        if operation == "Apply" and applied_fields:
            meta["managedFields"] = applied_fields
        elif operation != "Apply" and "managedFields" in old_meta:
            meta["managedFields"] = copy.deepcopy(old_meta["managedFields"])
        if old_meta.get("deletionTimestamp"):
            added = [
                f
                for f in meta.get("finalizers") or []
                if f not in (old_meta.get("finalizers") or [])
            ]
            if added:
                shown = "[]string{" + ", ".join(f'"{f}"' for f in added) + "}"
                raise errors.invalid(
                    rt.group,
                    rt.kind,
                    rt.plural,
                    name,
                    [
                        FieldError(
                            "Forbidden",
                            "metadata.finalizers",
                            "no new finalizers can be added if the object is being deleted, "
                            f"found new finalizers {shown}",
                        )
                    ],
                )
        new, warned = self._admit(rt, new, old, strict)
        if warnings is not None:
            warnings += warned
        meta = new["metadata"]
        if rt.generation and _spec_part(new) != _spec_part(old):
            meta["generation"] = int(old_meta.get("generation") or 0) + 1
        if operation != "Apply":
            ssa.track_update(old, new, rt.schema_or_any, manager, subresource, rt.has_status)
        if new == old:
            return copy.deepcopy(old)
        rv = self._next_rv()
        meta["resourceVersion"] = str(rv)
        key = self.key(rt, meta.get("namespace"), name)
        if rt.kind == "CustomResourceDefinition" and _spec_part(new) != _spec_part(old):
            self._serve_crd(new)
        if self._finished(rt, new):
            if rt.kind == "CustomResourceDefinition":
                self._unserve_crd(new)
            del self.objects[key]
            self._emit(
                Event(
                    rv,
                    "DELETED",
                    rt.key,
                    meta.get("namespace", ""),
                    copy.deepcopy(old),
                    copy.deepcopy(new),
                )
            )
            self._wake_gc()
            return copy.deepcopy(new)
        self.objects[key] = new
        self._emit(
            Event(
                rv,
                "MODIFIED",
                rt.key,
                meta.get("namespace", ""),
                copy.deepcopy(old),
                copy.deepcopy(new),
            )
        )
        if any(
            old_meta.get(k) != meta.get(k)
            for k in ("ownerReferences", "finalizers", "deletionTimestamp")
        ):
            self._wake_gc()
        return copy.deepcopy(new)

    @staticmethod
    def _finished(rt: ResourceType, obj: Mapping[str, Any]) -> bool:
        """Being deleted, with no finalizer left and no grace period to wait out (a
        namespace goes when the namespace controller, the GC task, has emptied it)."""
        meta = obj.get("metadata") or {}
        return (
            rt.kind != "Namespace"
            and bool(meta.get("deletionTimestamp"))
            and not meta.get("finalizers")
            and not meta.get("deletionGracePeriodSeconds")
        )

    # --- patch ---------------------------------------------------------------------------

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        patch_type: str,
        patch: Any,
        *,
        manager: str,
        subresource: str = "",
        force: bool = False,
        strict_fields: bool = False,
        warnings: list[str] | None = None,
    ) -> dict[str, Any]:
        old = self.find(rt, namespace, name)
        if patch_type == "apply":
            return self.apply(
                rt,
                namespace,
                name,
                patch,
                manager=manager,
                subresource=subresource,
                force=force,
                strict_fields=strict_fields,
                warnings=warnings,
            )
        if old is None:
            raise errors.not_found(rt.group, rt.plural, name)
        if patch_type == "merge":
            if not isinstance(patch, Mapping):
                raise errors.bad_request("the patch must be a JSON object")
            new = merge_patch(old, patch)
        elif patch_type == "json":
            new = json_patch(old, patch)
        elif patch_type == "strategic":
            if not isinstance(patch, Mapping):
                raise errors.bad_request("the patch must be a JSON object")
            new = strategic_merge_patch(old, patch, rt.schema_or_any)
        else:
            raise errors.bad_request(f"unknown patch type {patch_type}")
        if not isinstance(new, dict):
            raise errors.bad_request("the patched object is not an object")
        meta = new.get("metadata") or {}
        if meta.get("resourceVersion") != old["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.group, rt.plural, name)
        if meta.get("name", name) != name:
            raise errors.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the "
                f"URL ({name})"
            )
        return self._commit(
            rt,
            old,
            new,
            manager=manager,
            subresource=subresource,
            strict=strict_fields,
            warnings=warnings,
        )

    def apply(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        config: Any,
        *,
        manager: str,
        force: bool,
        subresource: str = "",
        strict_fields: bool = False,
        warnings: list[str] | None = None,
    ) -> dict[str, Any]:
        """Server-side apply; creates the object if it is missing."""
        applied = self._check_body(rt, config, namespace)
        meta = applied["metadata"]
        if meta.get("name", name) != name:
            raise errors.bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the "
                f"URL ({name})"
            )
        meta["name"] = name
        old = self.find(rt, namespace, name)
        given = meta.get("resourceVersion")
        if given and (old is None or given != old["metadata"]["resourceVersion"]):
            if old is None:
                raise errors.not_found(rt.group, rt.plural, name)
            raise errors.conflict(rt.group, rt.plural, name)
        for key in SERVER_FIELDS:
            meta.pop(key, None)
        merged = ssa.apply(
            old, applied, rt.schema_or_any, manager, force, subresource, rt.has_status, rt.group
        )
        if old is None:
            if subresource:
                raise errors.not_found(rt.group, rt.plural, name)
            merged["metadata"].pop("resourceVersion", None)
            return self.create(
                rt,
                namespace,
                merged,
                manager=manager,
                strict_fields=strict_fields,
                applied=True,
                warnings=warnings,
            )
        return self._commit(
            rt,
            old,
            merged,
            manager=manager,
            subresource=subresource,
            strict=strict_fields,
            operation="Apply",
            warnings=warnings,
        )

    # --- delete --------------------------------------------------------------------------

    def delete(
        self, rt: ResourceType, namespace: str | None, name: str, options: DeleteOptions
    ) -> tuple[dict[str, Any], bool]:
        """(the object, whether it is gone); if finalizers or a grace period hold it, it
        stays with a deletionTimestamp."""
        old = self.find(rt, namespace, name)
        if old is None:
            raise errors.not_found(rt.group, rt.plural, name)
        meta = old["metadata"]
        if options.uid and options.uid != meta["uid"]:
            raise errors.conflict(
                rt.group,
                rt.plural,
                name,
                f"Precondition failed: UID in precondition: {options.uid}, UID in object meta: "
                f"{meta['uid']}",
            )
        if options.resource_version and options.resource_version != meta["resourceVersion"]:
            raise errors.conflict(
                rt.group,
                rt.plural,
                name,
                f"Precondition failed: ResourceVersion in precondition: "
                f"{options.resource_version}, ResourceVersion in object meta: "
                f"{meta['resourceVersion']}",
            )
        new = copy.deepcopy(old)
        new_meta = new["metadata"]
        finalizers = list(new_meta.get("finalizers") or [])
        if options.propagation == "Orphan" and ORPHAN not in finalizers:
            finalizers.append(ORPHAN)
        if options.propagation == "Foreground" and FOREGROUND not in finalizers:
            finalizers.append(FOREGROUND)
        if options.propagation in ("Orphan", "Foreground"):
            other = FOREGROUND if options.propagation == "Orphan" else ORPHAN
            finalizers = [f for f in finalizers if f != other]
        grace = self._grace(rt, old, options)
        if finalizers:
            new_meta["finalizers"] = finalizers
        if (
            not finalizers
            and not grace
            and not meta.get("deletionTimestamp")
            and rt.kind != "Namespace"
        ):
            return self._remove(rt, old), True
        if not meta.get("deletionTimestamp"):
            moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=grace)
            new_meta["deletionTimestamp"] = timestamp(moment)
            if new_meta.get("generation"):
                new_meta["generation"] += 1
            if rt.kind == "Namespace":
                new.setdefault("status", {})["phase"] = "Terminating"
        if (
            new_meta.get("deletionGracePeriodSeconds") is None
            or grace < new_meta["deletionGracePeriodSeconds"]
        ):
            new_meta["deletionGracePeriodSeconds"] = grace
        if new == old:
            return copy.deepcopy(old), False
        if self._finished(rt, new):
            return self._remove(rt, old), True
        rv = self._next_rv()
        new_meta["resourceVersion"] = str(rv)
        self.objects[self.key(rt, namespace, name)] = new
        self._emit(
            Event(
                rv,
                "MODIFIED",
                rt.key,
                new_meta.get("namespace", ""),
                copy.deepcopy(old),
                copy.deepcopy(new),
            )
        )
        self._wake_gc()
        return copy.deepcopy(new), False

    @staticmethod
    def _grace(rt: ResourceType, obj: Mapping[str, Any], options: DeleteOptions) -> int:
        """Seconds a graceful deletion waits for the kubelet: pods on a node only."""
        if rt.kind != "Pod":
            return 0
        spec = obj.get("spec") or {}
        phase = (obj.get("status") or {}).get("phase")
        if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
            return 0
        if options.grace_seconds is not None:
            return max(0, options.grace_seconds)
        return int(spec.get("terminationGracePeriodSeconds", 30))

    def _remove(self, rt: ResourceType, old: dict[str, Any]) -> dict[str, Any]:
        meta = old["metadata"]
        if rt.kind == "CustomResourceDefinition":
            self._unserve_crd(old)
        gone = copy.deepcopy(old)
        rv = self._next_rv()
        gone["metadata"]["resourceVersion"] = str(rv)
        del self.objects[self.key(rt, meta.get("namespace"), meta["name"])]
        self._emit(
            Event(
                rv,
                "DELETED",
                rt.key,
                meta.get("namespace", ""),
                copy.deepcopy(old),
                copy.deepcopy(gone),
            )
        )
        self._wake_gc()
        return gone

    # --- custom resource definitions -----------------------------------------------------

    def _serve_crd(self, crd: dict[str, Any]) -> None:
        """Serve its resources (400 if it cannot be served), and say so in its status."""
        self.registry.add_crd(crd)
        names = (crd.get("spec") or {}).get("names") or {}
        now = timestamp()
        crd["status"] = {
            "acceptedNames": names,
            "storedVersions": [
                v["name"] for v in (crd.get("spec") or {}).get("versions") or [] if v.get("storage")
            ],
            "conditions": [
                {"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": now}
                for t, r, m in (
                    ("NamesAccepted", "NoConflicts", "no conflicts found"),
                    ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
                )
            ],
        }

    def _unserve_crd(self, crd: Mapping[str, Any]) -> None:
        """Stop serving its resources; their objects go with them."""
        name = crd["metadata"]["name"]
        for rt in [t for t in self.registry.types if t.crd_name == name]:
            for obj in list(self.items(rt)):
                found = self.find(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"])
                if found is not None:
                    self._remove(rt, found)
        self.registry.remove_crd(name)

    # --- used by the garbage collector ---------------------------------------------------

    def controller_update(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """A controller's write of an object it just read (no precondition)."""
        old = self.find(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if old is not None:
            self._commit(rt, old, obj, manager=GC_MANAGER, subresource="")

    def remove_namespace(self, namespace: dict[str, Any]) -> None:
        """The namespace controller's last step: the emptied namespace goes."""
        rt = self.registry.resolve("v1/namespaces")
        found = self.find(rt, None, namespace["metadata"]["name"])
        if found is not None:
            self._remove(rt, found)
