"""Plays the StatefulSet, Deployment and ReplicaSet controllers and the kubelet of one
node against the strict API server (strict_api/): each pod the operator's objects call
for is created through the API, as the controllers create it, and runs as a local
process of the project's own daemons with the environment its container spec gives
(the ConfigMap, the env, the ``$(VAR)`` references); its readiness is reported back
from its ``/readyz``.

The controllers, as Kubernetes runs them:

* StatefulSet: pods ``<set>-0..replicas-1`` (in parallel), labelled with the template's
  revision (``controller-revision-hash: <set>-<hash>``, also the status'
  ``updateRevision``) and owned by the set; each claim of ``volumeClaimTemplates`` is a
  PersistentVolumeClaim ``<template>-<pod>`` with the template's and the selector's
  labels, owned by the set when ``persistentVolumeClaimRetentionPolicy.whenDeleted`` is
  Delete (and by its pod once scaled away, when ``whenScaled`` is Delete); bound at
  once, as a provisioner would. ``OnDelete``: a pod is replaced only once deleted (the
  operator deletes it to roll it); a scale-down deletes the highest ordinals.
* Deployment: a ReplicaSet per template (``pod-template-hash``), rolled with the
  Deployment's surge (a new pod first; an old one goes once the new one is ready).
* ReplicaSet: pods ``<set>-<random>`` owned by it.
* The kubelet (node ``node-1``): runs the pods bound to it; a pod being deleted is
  stopped, then removed with grace period 0, as the kubelet confirms a deletion.

What differs from a node, and why: ports are free local ports (several pods share
127.0.0.1), storage addresses are ``127.0.0.1:<port>`` (the operator is told through
``ReconcileSettings.address_book``; nothing here resolves cluster DNS names), and a
claim's volume is a directory named after the claim's uid, which outlives its pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import logging
import os
import random
import re
import sys
import urllib.request
from dataclasses import dataclass
from typing import Any

from strict_api import ApiError, StrictApi
from strict_api.selectors import selector_from_match

from waltz_client.tools.local.cluster import _free_port
from waltz_client.tools.local.processes import DaemonProcess

NODE = "node-1"
MANAGER = "kube-controller-manager"
KUBELET = "kubelet"
log = logging.getLogger(__name__)

# Which daemon a container of this name runs.
MODULES = {"storage": "waltz_storage.main", "server": "waltz_server.main"}


def template_hash(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def _expand(value: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def _owner(obj: dict[str, Any], controller: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def _owned_by(obj: dict[str, Any], owner: dict[str, Any]) -> bool:
    uid = owner["metadata"]["uid"]
    return any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or [])


def _ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _deleting(obj: dict[str, Any]) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


@dataclass
class Pod:
    name: str
    uid: str
    process: DaemonProcess
    http_port: int
    component: str


class Kubelet:
    def __init__(
        self, api: StrictApi, namespace: str, name: str, workdir: str, slots: int = 6
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.workdir = workdir
        taken: set[int] = set()
        self.storage_ports = [(_free_port(taken), _free_port(taken)) for _ in range(slots)]
        self.address_book = tuple(f"127.0.0.1:{port}" for port, _ in self.storage_ports)
        self.pods: dict[str, Pod] = {}
        self.started: list[str] = []  # pod names, in the order they were (re)started
        # Processes being started, with the thread starting each: a start that the end
        # of the test cancels still runs to its end in that thread, and its process must
        # be stopped then, or it outlives the test.
        self._starting: dict[DaemonProcess, asyncio.Future[Any]] = {}
        # Each storage pod stopped while its StatefulSet wanted it (deleted for a roll):
        # (pod, how many other storage pods were running at that moment).
        self.storage_stops: list[tuple[str, int]] = []
        # Pods a controller could not create, and why (FailedCreate, in Kubernetes).
        self.failures: list[str] = []
        self._task: asyncio.Task | None = None

    def storage_http(self, address: str) -> str | None:
        for (_port, http_port), known in zip(self.storage_ports, self.address_book, strict=True):
            if known == address:
                return f"http://127.0.0.1:{http_port}/readyz"
        return None

    async def __aenter__(self) -> Kubelet:
        if self.api.get("v1/nodes", None, NODE) is None:
            self.api.put(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": NODE},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
                },
                manager=KUBELET,
            )
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        for process, starting in list(self._starting.items()):
            with contextlib.suppress(Exception):
                await starting
            await asyncio.to_thread(process.stop)
        await asyncio.gather(*(asyncio.to_thread(p.process.stop) for p in self.pods.values()))

    async def _run(self) -> None:
        while True:
            self._statefulsets()
            self._deployments()
            self._replicasets()
            await self._kubelet()
            await asyncio.sleep(0.2)

    def _create(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return self.api.put(obj, manager=MANAGER)
        except ApiError as e:  # the controller retries on its next pass
            self.failures.append(f"{obj['kind']} {obj['metadata'].get('name')}: {e.message}")
            log.warning("could not create %s: %s", obj["kind"], e.message)
            return None

    def _status(self, resource: str, obj: dict[str, Any], status: dict[str, Any]) -> None:
        if (obj.get("status") or {}) != status:
            meta = obj["metadata"]
            self.api.update_status(
                resource, meta["namespace"], meta["name"], status, manager=MANAGER
            )

    def _pods(self) -> list[dict[str, Any]]:
        return self.api.list("v1/pods", self.namespace)

    # --- the StatefulSet controller -----------------------------------------------------

    def _statefulsets(self) -> None:
        for sts in self.api.list("apps/v1/statefulsets", self.namespace):
            if _deleting(sts):
                continue  # its pods and claims go by garbage collection
            spec = sts["spec"]
            revision = f"{sts['metadata']['name']}-{template_hash(spec['template'])}"
            replicas = int(spec.get("replicas", 1))
            self._adopt(sts)
            pods = {p["metadata"]["name"]: p for p in self._pods() if _owned_by(p, sts)}
            for ordinal in range(replicas):
                pod_name = f"{sts['metadata']['name']}-{ordinal}"
                if pod_name in pods or self.api.get("v1/pods", self.namespace, pod_name):
                    continue
                if self._claims(sts, pod_name):
                    created = self._create(self._stateful_pod(sts, pod_name, ordinal, revision))
                    if created is not None:
                        pods[pod_name] = created
            for pod_name, pod in sorted(pods.items()):
                ordinal = int(pod_name.rsplit("-", 1)[1])
                if ordinal >= replicas and not _deleting(pod):
                    self._scaled_away(sts, pod)
                    self.api.remove("v1/pods", self.namespace, pod_name)
            pods = {p["metadata"]["name"]: p for p in self._pods() if _owned_by(p, sts)}
            live = [p for p in pods.values() if not _deleting(p)]
            updated = [
                p
                for p in live
                if p["metadata"]["labels"].get("controller-revision-hash") == revision
            ]
            status = {
                "observedGeneration": sts["metadata"]["generation"],
                "replicas": len(live),
                "readyReplicas": sum(1 for p in live if _ready(p)),
                "availableReplicas": sum(1 for p in live if _ready(p)),
                "currentReplicas": len(updated),
                "updatedReplicas": len(updated),
                "updateRevision": revision,
                "currentRevision": (sts.get("status") or {}).get("currentRevision", revision),
                "collisionCount": 0,
            }
            if len(updated) == len(live) == replicas:
                status["currentRevision"] = revision
            self._status("apps/v1/statefulsets", sts, status)

    def _adopt(self, sts: dict[str, Any]) -> None:
        """Pods of this set (by name and selector) with no controller become its own, and
        its claims get the owner its retention policy says: a set deleted with orphan
        propagation and created again takes its pods and claims back."""
        name = sts["metadata"]["name"]
        selected = selector_from_match(sts["spec"].get("selector"))
        member = re.compile(rf"^{re.escape(name)}-[0-9]+$")
        for pod in self._pods():
            meta = pod["metadata"]
            refs = meta.get("ownerReferences") or []
            if (
                _deleting(pod)
                or any(r.get("controller") for r in refs)
                or not member.match(meta["name"])
                or not selected(meta.get("labels") or {})
            ):
                continue
            self.api.patch(
                "v1/pods",
                self.namespace,
                meta["name"],
                {"metadata": {"ownerReferences": [*refs, _owner(sts)]}},
                manager=MANAGER,
            )
        delete = (sts["spec"].get("persistentVolumeClaimRetentionPolicy") or {}).get(
            "whenDeleted"
        ) == "Delete"
        templates = [t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates") or []]
        claims = re.compile(rf"^({'|'.join(map(re.escape, templates))})-{re.escape(name)}-[0-9]+$")
        for claim in (
            self.api.list("v1/persistentvolumeclaims", self.namespace) if templates else []
        ):
            meta = claim["metadata"]
            if _deleting(claim) or not claims.match(meta["name"]):
                continue
            refs = meta.get("ownerReferences") or []
            others = [r for r in refs if r.get("kind") != "StatefulSet"]
            wanted = [*others, _owner(sts)] if delete else others
            if refs != wanted:
                self.api.patch(
                    "v1/persistentvolumeclaims",
                    self.namespace,
                    meta["name"],
                    {"metadata": {"ownerReferences": wanted or None}},
                    manager=MANAGER,
                )

    def _claims(self, sts: dict[str, Any], pod_name: str) -> bool:
        """The pod's claims exist (created here if missing)."""
        policy = sts["spec"].get("persistentVolumeClaimRetentionPolicy") or {}
        selector = (sts["spec"].get("selector") or {}).get("matchLabels") or {}
        for template in sts["spec"].get("volumeClaimTemplates") or []:
            claim_name = f"{template['metadata']['name']}-{pod_name}"
            if self.api.get("v1/persistentvolumeclaims", self.namespace, claim_name):
                continue
            meta: dict[str, Any] = {
                "name": claim_name,
                "namespace": self.namespace,
                "labels": {**(template["metadata"].get("labels") or {}), **selector},
            }
            if policy.get("whenDeleted") == "Delete":
                meta["ownerReferences"] = [_owner(sts)]
            spec = copy.deepcopy(template["spec"])
            claim = {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": meta,
                "spec": spec,
                # bound at once, as a dynamic provisioner would
                "status": {
                    "phase": "Bound",
                    "accessModes": spec.get("accessModes", []),
                    "capacity": {"storage": spec["resources"]["requests"]["storage"]},
                },
            }
            if self._create(claim) is None:
                return False
        return True

    def _scaled_away(self, sts: dict[str, Any], pod: dict[str, Any]) -> None:
        """whenScaled: Delete: the pod's claims go with it."""
        policy = sts["spec"].get("persistentVolumeClaimRetentionPolicy") or {}
        if policy.get("whenScaled") != "Delete":
            return
        for template in sts["spec"].get("volumeClaimTemplates") or []:
            claim_name = f"{template['metadata']['name']}-{pod['metadata']['name']}"
            claim = self.api.get("v1/persistentvolumeclaims", self.namespace, claim_name)
            if claim is not None and not _owned_by(claim, pod):
                refs = [
                    r
                    for r in claim["metadata"].get("ownerReferences") or []
                    if not r.get("controller")
                ]
                claim["metadata"]["ownerReferences"] = [*refs, _owner(pod)]
                self.api.put(claim, manager=MANAGER)

    def _stateful_pod(
        self, sts: dict[str, Any], pod_name: str, ordinal: int, revision: str
    ) -> dict[str, Any]:
        template = copy.deepcopy(sts["spec"]["template"])
        spec = template["spec"]
        claims = {t["metadata"]["name"] for t in sts["spec"].get("volumeClaimTemplates") or []}
        spec["volumes"] = [v for v in spec.get("volumes") or [] if v["name"] not in claims] + [
            {"name": claim, "persistentVolumeClaim": {"claimName": f"{claim}-{pod_name}"}}
            for claim in sorted(claims)
        ]
        spec.update(hostname=pod_name, subdomain=sts["spec"].get("serviceName"), nodeName=NODE)
        meta = template.get("metadata") or {}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": self.namespace,
                "labels": {
                    **(meta.get("labels") or {}),
                    "controller-revision-hash": revision,
                    "statefulset.kubernetes.io/pod-name": pod_name,
                    "apps.kubernetes.io/pod-index": str(ordinal),
                },
                "annotations": meta.get("annotations") or {},
                "ownerReferences": [_owner(sts)],
            },
            "spec": spec,
        }

    # --- the Deployment and ReplicaSet controllers ---------------------------------------

    def _deployments(self) -> None:
        for deployment in self.api.list("apps/v1/deployments", self.namespace):
            if _deleting(deployment):
                continue
            spec = deployment["spec"]
            replicas = int(spec.get("replicas", 1))
            digest = template_hash(spec["template"])
            name = f"{deployment['metadata']['name']}-{digest}"
            sets = [
                rs
                for rs in self.api.list("apps/v1/replicasets", self.namespace)
                if _owned_by(rs, deployment)
            ]
            new = next((rs for rs in sets if rs["metadata"]["name"] == name), None)
            if new is None:
                template = copy.deepcopy(spec["template"])
                template["metadata"].setdefault("labels", {})["pod-template-hash"] = digest
                selector = copy.deepcopy(spec["selector"])
                selector.setdefault("matchLabels", {})["pod-template-hash"] = digest
                new = self._create(
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "metadata": {
                            "name": name,
                            "namespace": self.namespace,
                            "labels": template["metadata"]["labels"],
                            "ownerReferences": [_owner(deployment)],
                        },
                        "spec": {"replicas": 0, "selector": selector, "template": template},
                    }
                )
                if new is None:
                    continue
                sets.append(new)
            old = [rs for rs in sets if rs["metadata"]["name"] != name]
            pods = self._pods()

            def members(
                rs: dict[str, Any], pods: list[dict[str, Any]] = pods
            ) -> list[dict[str, Any]]:
                return [p for p in pods if _owned_by(p, rs) and not _deleting(p)]

            new_ready = sum(1 for p in members(new) if _ready(p))
            old_pods = sum(len(members(rs)) for rs in old)
            wanted_new = int(new["spec"].get("replicas", 0))
            # maxSurge 1, maxUnavailable 0: one new pod beyond the replicas at a time, and
            # an old one goes once enough new ones are ready.
            if wanted_new < replicas and not old_pods:
                self._scale("apps/v1/replicasets", new, replicas)
            elif wanted_new < replicas and wanted_new + old_pods <= replicas:
                self._scale("apps/v1/replicasets", new, wanted_new + 1)
            elif wanted_new > replicas:
                self._scale("apps/v1/replicasets", new, replicas)
            for rs in old:
                current = int(rs["spec"].get("replicas", 0))
                if current and new_ready + old_pods > replicas:
                    self._scale("apps/v1/replicasets", rs, current - 1)
                    old_pods -= 1
            all_pods = [p for rs in sets for p in members(rs)]
            self._status(
                "apps/v1/deployments",
                deployment,
                {
                    "observedGeneration": deployment["metadata"]["generation"],
                    "replicas": len(all_pods),
                    "updatedReplicas": len(members(new)),
                    "readyReplicas": sum(1 for p in all_pods if _ready(p)),
                    "availableReplicas": sum(1 for p in all_pods if _ready(p)),
                },
            )

    def _scale(self, resource: str, obj: dict[str, Any], replicas: int) -> None:
        meta = obj["metadata"]
        self.api.patch(
            resource,
            meta["namespace"],
            meta["name"],
            {"spec": {"replicas": replicas}},
            manager=MANAGER,
        )

    def _replicasets(self) -> None:
        for rs in self.api.list("apps/v1/replicasets", self.namespace):
            if _deleting(rs):
                continue
            replicas = int(rs["spec"].get("replicas", 0))
            pods = [p for p in self._pods() if _owned_by(p, rs) and not _deleting(p)]
            for _ in range(replicas - len(pods)):
                template = copy.deepcopy(rs["spec"]["template"])
                suffix = "".join(random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))
                template["spec"]["nodeName"] = NODE
                created = self._create(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": f"{rs['metadata']['name']}-{suffix}",
                            "namespace": self.namespace,
                            "labels": template["metadata"].get("labels") or {},
                            "annotations": template["metadata"].get("annotations") or {},
                            "ownerReferences": [_owner(rs)],
                        },
                        "spec": template["spec"],
                    }
                )
                if created is not None:
                    pods.append(created)
            # Too many: the unready go first, then the newest.
            pods.sort(key=lambda p: p["metadata"]["creationTimestamp"], reverse=True)
            pods.sort(key=_ready)
            for pod in pods[: max(0, len(pods) - replicas)]:
                self.api.remove("v1/pods", self.namespace, pod["metadata"]["name"])
            live = [p for p in self._pods() if _owned_by(p, rs) and not _deleting(p)]
            self._status(
                "apps/v1/replicasets",
                rs,
                {
                    "observedGeneration": rs["metadata"]["generation"],
                    "replicas": len(live),
                    "readyReplicas": sum(1 for p in live if _ready(p)),
                    "availableReplicas": sum(1 for p in live if _ready(p)),
                },
            )

    # --- the kubelet ------------------------------------------------------------------------

    async def _kubelet(self) -> None:
        pods = {p["metadata"]["name"]: p for p in self._pods() if p["spec"].get("nodeName") == NODE}
        for name in [
            n for n in self.pods if n not in pods or pods[n]["metadata"]["uid"] != self.pods[n].uid
        ]:
            await self._stop(name)  # gone without a graceful deletion
        starting = []
        for name, pod in pods.items():
            if _deleting(pod):
                if name in self.pods:
                    self._note_storage_stop(pod)
                    await self._stop(name)
                self.api.remove("v1/pods", self.namespace, name, grace=0)
            elif name not in self.pods:
                starting.append(pod)
        await asyncio.gather(*(self._start(pod) for pod in starting))
        for name, pod in self._pod_readiness():
            self._report(pod, self._probe(name))

    def _pod_readiness(self) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for name, running in self.pods.items():
            pod = self.api.get("v1/pods", self.namespace, name)
            if pod is not None and pod["metadata"]["uid"] == running.uid and not _deleting(pod):
                out.append((name, pod))
        return out

    def _note_storage_stop(self, pod: dict[str, Any]) -> None:
        """A storage pod deleted while its StatefulSet still wants it (a roll)."""
        running = self.pods[pod["metadata"]["name"]]
        if running.component != "storage":
            return
        ordinal = int(pod["metadata"]["labels"].get("apps.kubernetes.io/pod-index", "-1"))
        owner = next(iter(pod["metadata"].get("ownerReferences") or []), {})
        sts = self.api.get("apps/v1/statefulsets", self.namespace, owner.get("name", ""))
        if sts is None or ordinal >= int(sts["spec"].get("replicas", 0)):
            return
        others = sum(
            1
            for other, p in self.pods.items()
            if other != running.name and p.component == "storage" and p.process.running
        )
        self.storage_stops.append((running.name, others))

    def _container_env(self, pod: dict[str, Any]) -> dict[str, str]:
        container = pod["spec"]["containers"][0]
        env = dict(os.environ)
        for source in container.get("envFrom", []):
            ref = source.get("configMapRef") or {}
            config_map = self.api.get("v1/configmaps", self.namespace, ref.get("name", ""))
            env.update((config_map or {}).get("data", {}))
        for item in container.get("env", []):
            field = (item.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
            if "value" in item:
                env[item["name"]] = _expand(item["value"], env)
            elif field == "metadata.name":
                env[item["name"]] = pod["metadata"]["name"]
            elif field == "status.podIP":
                env[item["name"]] = "127.0.0.1"
        return env

    def _volume_directory(self, pod: dict[str, Any]) -> str:
        """The directory of the pod's claim (a new claim: a new, empty volume)."""
        for volume in pod["spec"].get("volumes") or []:
            claim_ref = volume.get("persistentVolumeClaim")
            if claim_ref:
                claim = self.api.get(
                    "v1/persistentvolumeclaims", self.namespace, claim_ref["claimName"]
                )
                if claim is not None:
                    uid = claim["metadata"]["uid"][:8]
                    return os.path.join(self.workdir, f"{claim_ref['claimName']}-{uid}")
        return os.path.join(self.workdir, pod["metadata"]["name"])

    async def _start(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        component = pod["spec"]["containers"][0]["name"]
        env = self._container_env(pod)
        taken: set[int] = set()
        if component == "storage":
            ordinal = int(pod["metadata"]["labels"]["apps.kubernetes.io/pod-index"])
            port, http_port = self.storage_ports[ordinal]
            env.update(
                WALTZ_STORAGE_HOST="127.0.0.1",
                WALTZ_STORAGE_PORT=str(port),
                WALTZ_STORAGE_HTTP_PORT=str(http_port),
                WALTZ_STORAGE_DIRECTORY=self._volume_directory(pod),
                WALTZ_STORAGE_ADVERTISED_ADDRESS=self.address_book[ordinal],
            )
        else:
            port, http_port = _free_port(taken), _free_port(taken)
            env.update(
                WALTZ_SERVER_HOST="127.0.0.1",
                WALTZ_SERVER_PORT=str(port),
                WALTZ_SERVER_HTTP_PORT=str(http_port),
            )
        os.makedirs(self.workdir, exist_ok=True)
        ready_file = os.path.join(self.workdir, f"{name}.ready")
        process = DaemonProcess(
            name,
            [sys.executable, "-m", MODULES[component], "--ready-file", ready_file],
            ready_file,
            os.path.join(self.workdir, f"{name}.log"),
            env=env,
        )
        self._report(pod, False, phase="Running")
        starting = asyncio.get_running_loop().run_in_executor(None, process.start, 60.0)
        self._starting[process] = starting
        await asyncio.shield(starting)
        del self._starting[process]
        self.pods[name] = Pod(name, pod["metadata"]["uid"], process, http_port, component)
        self.started.append(name)

    async def _stop(self, name: str) -> None:
        pod = self.pods.pop(name)
        await asyncio.to_thread(pod.process.stop)

    # --- probes ---------------------------------------------------------------------------

    def _probe(self, name: str) -> bool:
        pod = self.pods.get(name)
        if pod is None or not pod.process.running:
            return False
        try:
            url = f"http://127.0.0.1:{pod.http_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def _report(self, pod: dict[str, Any], ready: bool, phase: str = "Running") -> None:
        status = {
            "phase": phase,
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False"},
                {"type": "ContainersReady", "status": "True" if ready else "False"},
            ],
        }
        if pod.get("status") != status:
            meta = pod["metadata"]
            with contextlib.suppress(ApiError):  # deleted meanwhile: nothing to report
                self.api.update_status(
                    "v1/pods", meta["namespace"], meta["name"], status, manager=KUBELET
                )
