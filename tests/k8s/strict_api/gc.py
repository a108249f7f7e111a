"""The garbage collector and the namespace controller, as a task of the server: woken by
every deletion and every change of owner references or finalizers, it works until
nothing is left to do.

* A dependent all of whose owners are absent is deleted (in the background; in the
  foreground if an owner is being deleted in the foreground). An owner is looked up by
  kind and name (in the dependent's namespace if the owner's kind is namespaced) and
  must have the referenced uid: an owner in another namespace is absent, as
  kube-controller-manager treats it (the dependent is collected).
* A dependent with some owners left loses its references to the absent ones.
* ``orphan``: the owner's dependents lose their references to it, then the owner goes.
* ``foregroundDeletion``: the dependents are deleted first; the owner goes once none
  with ``blockOwnerDeletion`` remains.
* A namespace being deleted is emptied, then removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Mapping
from typing import Any

from .errors import ApiError
from .registry import ResourceType
from .store import FOREGROUND, ORPHAN, DeleteOptions, Store

log = logging.getLogger(__name__)


def _uid(obj: Mapping[str, Any]) -> str:
    return obj["metadata"]["uid"]


class GarbageCollector:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.wakeup = asyncio.Event()
        store.gc_wakeup = self.wakeup
        self.idle = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> GarbageCollector:
        self._task = asyncio.create_task(self._run(), name="strict-api-gc")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            self.idle.set()
            await self.wakeup.wait()
            self.idle.clear()
            self.wakeup.clear()
            await asyncio.sleep(0)  # after the request that woke it has been answered
            for _ in range(1000):
                try:
                    if not self.collect():
                        break
                except Exception:  # a bug here must not stop collection for good
                    log.exception("garbage collection failed")
                    break

    # --- one pass ------------------------------------------------------------------------

    def _owner(self, dependent_ns: str, ref: Mapping[str, Any]) -> dict[str, Any] | None:
        rt = self.store.registry.by_kind(ref.get("apiVersion", ""), ref.get("kind", ""))
        if rt is None:
            return None
        if rt.namespaced and not dependent_ns:
            return None  # a cluster-scoped dependent cannot have a namespaced owner
        owner = self.store.find(rt, dependent_ns if rt.namespaced else None, ref.get("name", ""))
        if owner is None or _uid(owner) != ref.get("uid"):
            return None
        return owner

    def collect(self) -> bool:
        """One pass; whether it changed anything."""
        changed = False
        objects = list(self.store.all_objects())
        for rt, obj in objects:
            if (
                self.store.find(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"])
                is not obj
            ):
                continue  # changed or gone during this pass
            changed |= self._dependent(rt, obj)
        for rt, obj in list(self.store.all_objects()):
            meta = obj["metadata"]
            if not meta.get("deletionTimestamp"):
                continue
            if ORPHAN in (meta.get("finalizers") or []):
                changed |= self._orphan(rt, obj)
            elif FOREGROUND in (meta.get("finalizers") or []):
                changed |= self._foreground(rt, obj)
            if rt.kind == "Namespace":
                changed |= self._namespace(obj)
        return changed

    def _dependent(self, rt: ResourceType, obj: dict[str, Any]) -> bool:
        meta = obj["metadata"]
        refs = meta.get("ownerReferences") or []
        if not refs:
            return False
        ns = meta.get("namespace") or ""
        solid, dangling, waiting = [], [], []
        for ref in refs:
            owner = self._owner(ns, ref)
            if owner is None:
                unknown = (
                    self.store.registry.by_kind(ref.get("apiVersion", ""), ref.get("kind", ""))
                    is None
                )
                (solid if unknown else dangling).append(ref)  # an unknown kind: leave it be
            elif owner["metadata"].get("deletionTimestamp") and FOREGROUND in (
                owner["metadata"].get("finalizers") or []
            ):
                waiting.append(ref)
            else:
                solid.append(ref)
        if solid and (dangling or waiting):
            new = copy.deepcopy(obj)
            new["metadata"]["ownerReferences"] = solid
            self._write(rt, new)
            return True
        if solid or meta.get("deletionTimestamp"):
            return False
        policy = "Foreground" if waiting else "Background"
        return self._delete(rt, obj, policy)

    def _dependents(self, owner: Mapping[str, Any]) -> list[tuple[ResourceType, dict[str, Any]]]:
        uid = _uid(owner)
        return [
            (rt, obj)
            for rt, obj in self.store.all_objects()
            if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])
        ]

    def _orphan(self, rt: ResourceType, owner: dict[str, Any]) -> bool:
        uid = _uid(owner)
        for dep_rt, dep in self._dependents(owner):
            new = copy.deepcopy(dep)
            refs = [r for r in new["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
            if refs:
                new["metadata"]["ownerReferences"] = refs
            else:
                new["metadata"].pop("ownerReferences", None)
            self._write(dep_rt, new)
        return self._drop_finalizer(rt, owner, ORPHAN)

    def _foreground(self, rt: ResourceType, owner: dict[str, Any]) -> bool:
        uid = _uid(owner)
        blocking = [
            (dep_rt, dep)
            for dep_rt, dep in self._dependents(owner)
            if any(
                r.get("uid") == uid and r.get("blockOwnerDeletion")
                for r in dep["metadata"].get("ownerReferences") or []
            )
        ]
        if blocking:
            return False  # the dependents are being deleted (see _dependent)
        return self._drop_finalizer(rt, owner, FOREGROUND)

    def _namespace(self, namespace: dict[str, Any]) -> bool:
        name = namespace["metadata"]["name"]
        changed = False
        left = False
        for rt, obj in list(self.store.all_objects()):
            if obj["metadata"].get("namespace") != name or not rt.namespaced:
                continue
            left = True
            if not obj["metadata"].get("deletionTimestamp"):
                changed |= self._delete(rt, obj, "Background")
        if not left and not namespace["metadata"].get("finalizers"):
            self.store.remove_namespace(namespace)
            return True
        return changed

    # --- writes --------------------------------------------------------------------------

    def _drop_finalizer(self, rt: ResourceType, obj: dict[str, Any], finalizer: str) -> bool:
        new = copy.deepcopy(obj)
        new["metadata"]["finalizers"] = [
            f for f in new["metadata"].get("finalizers") or [] if f != finalizer
        ]
        if not new["metadata"]["finalizers"]:
            del new["metadata"]["finalizers"]
        self._write(rt, new)
        return True

    def _write(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        try:
            self.store.controller_update(rt, obj)
        except ApiError as e:
            log.warning("garbage collector: %s", e.message)

    def _delete(self, rt: ResourceType, obj: dict[str, Any], policy: str) -> bool:
        meta = obj["metadata"]
        try:
            self.store.delete(
                rt,
                meta.get("namespace"),
                meta["name"],
                DeleteOptions(propagation=policy, uid=meta["uid"]),
            )
        except ApiError as e:
            log.warning("garbage collector: %s", e.message)
            return False
        return True
