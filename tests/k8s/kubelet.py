"""Plays the StatefulSet and Deployment controllers and the kubelet for a WaltzCluster in
kmock: each pod the operator's objects call for runs as a local process of the project's
own daemons, with the environment its container spec gives (the ConfigMap, the env, the
``$(VAR)`` references), and its readiness is reported back from its ``/readyz``.

What differs from a node, and why: ports are free local ports (several pods share
127.0.0.1), the storage addresses are ``127.0.0.1:<port>`` (the operator is told through
``ReconcileSettings.address_book``; nothing here resolves cluster DNS names), and a
pod's volume is a directory that outlives the pod, as a PersistentVolumeClaim does.

Controllers as Kubernetes runs them: the StatefulSet keeps pods 0..replicas-1, with the
template's revision in ``controller-revision-hash``; ``OnDelete``: a pod is replaced only
when deleted (the operator deletes it to roll it); a scale-down stops the highest
ordinals. The Deployment replaces pods one at a time when its template changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import sys
import urllib.request
from dataclasses import dataclass
from typing import Any

import kmock
from operator_harness import obj

from waltz_client.local.cluster import _free_port
from waltz_client.local.processes import DaemonProcess


def revision_of(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def _expand(value: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)


@dataclass
class Pod:
    name: str
    revision: str
    process: DaemonProcess
    http_port: int


class Kubelet:
    def __init__(
        self, api: kmock.KubernetesEmulator, namespace: str, name: str, workdir: str, slots: int = 6
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
        # Each storage pod stopped while the StatefulSet wanted it (deleted for a roll):
        # (pod, how many other storage pods were running at that moment).
        self.storage_stops: list[tuple[str, int]] = []
        self._server_count = 0
        self._task: asyncio.Task | None = None

    def storage_http(self, address: str) -> str | None:
        for (_port, http_port), known in zip(self.storage_ports, self.address_book, strict=True):
            if known == address:
                return f"http://127.0.0.1:{http_port}/readyz"
        return None

    async def __aenter__(self) -> Kubelet:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await asyncio.gather(*(asyncio.to_thread(p.process.stop) for p in self.pods.values()))

    async def _run(self) -> None:
        while True:
            await self._sync_storage()
            await self._sync_servers()
            self._report_readiness()
            await asyncio.sleep(0.2)

    # --- the controllers -----------------------------------------------------------------

    def _container_env(self, template: dict[str, Any], pod_name: str) -> dict[str, str]:
        container = template["spec"]["containers"][0]
        env = dict(os.environ)
        for source in container.get("envFrom", []):
            config_map = obj(
                self.api, "v1/configmaps", self.namespace, source["configMapRef"]["name"]
            )
            env.update((config_map or {}).get("data", {}))
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = _expand(item["value"], env)
            elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                env[item["name"]] = pod_name
            elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
                env[item["name"]] = "127.0.0.1"
        return env

    def _write_pod(self, pod_name: str, component: str, revision: str, ready: bool) -> None:
        self.api.objects["v1/pods", self.namespace, pod_name] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": self.namespace,
                "labels": {
                    "app.kubernetes.io/instance": self.name,
                    "app.kubernetes.io/component": component,
                    "controller-revision-hash": revision,
                },
            },
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        }

    def _pod_exists(self, pod_name: str) -> bool:
        return obj(self.api, "v1/pods", self.namespace, pod_name) is not None

    async def _stop(self, pod_name: str) -> None:
        pod = self.pods.pop(pod_name)
        await asyncio.to_thread(pod.process.stop)

    async def _sync_storage(self) -> None:
        sts = obj(self.api, "apps/v1/statefulsets", self.namespace, f"{self.name}-storage")
        if sts is None:
            return
        template = sts["spec"]["template"]
        revision = revision_of(template)
        if (sts.get("status") or {}).get("updateRevision") != revision:
            self.api.objects["apps/v1/statefulsets", self.namespace, f"{self.name}-storage"] = {
                **sts,
                "status": {**(sts.get("status") or {}), "updateRevision": revision},
            }
        replicas = int(sts["spec"]["replicas"])
        for pod_name in [p for p in self.pods if p.startswith(f"{self.name}-storage-")]:
            ordinal = int(pod_name.rsplit("-", 1)[1])
            if ordinal >= replicas or not self._pod_exists(pod_name):
                if ordinal < replicas:
                    others = sum(
                        1
                        for other, pod in self.pods.items()
                        if other != pod_name and "-storage-" in other and pod.process.running
                    )
                    self.storage_stops.append((pod_name, others))
                await self._stop(pod_name)  # scaled away, or deleted to be replaced
                if ordinal >= replicas and self._pod_exists(pod_name):
                    del self.api.objects["v1/pods", self.namespace, pod_name]
        for ordinal in range(replicas):
            pod_name = f"{self.name}-storage-{ordinal}"
            if pod_name in self.pods:
                continue
            port, http_port = self.storage_ports[ordinal]
            env = self._container_env(template, pod_name)
            env.update(
                WALTZ_STORAGE_HOST="127.0.0.1",
                WALTZ_STORAGE_PORT=str(port),
                WALTZ_STORAGE_HTTP_PORT=str(http_port),
                WALTZ_STORAGE_DIRECTORY=os.path.join(self.workdir, pod_name),
                WALTZ_STORAGE_ADVERTISED_ADDRESS=self.address_book[ordinal],
            )
            await self._start(pod_name, "storage", "waltz_storage.main", env, revision, http_port)

    async def _sync_servers(self) -> None:
        deployment = obj(self.api, "apps/v1/deployments", self.namespace, f"{self.name}-server")
        if deployment is None:
            return
        template = deployment["spec"]["template"]
        revision = revision_of(template)
        replicas = int(deployment["spec"]["replicas"])
        servers = sorted(p for p in self.pods if p.startswith(f"{self.name}-server-"))
        outdated = [p for p in servers if self.pods[p].revision != revision]
        if len(servers) > replicas:  # scaled down: the oldest go first
            await self._stop_server(servers[0])
        elif len(servers) < replicas or (outdated and not self._unready_servers()):
            # maxSurge 1, maxUnavailable 0: a new pod first, then an old one goes
            self._server_count += 1
            pod_name = f"{self.name}-server-{self._server_count}"
            taken: set[int] = set()
            port, http_port = _free_port(taken), _free_port(taken)
            env = self._container_env(template, pod_name)
            env.update(
                WALTZ_SERVER_HOST="127.0.0.1",
                WALTZ_SERVER_PORT=str(port),
                WALTZ_SERVER_HTTP_PORT=str(http_port),
            )
            await self._start(pod_name, "server", "waltz_server.main", env, revision, http_port)
            if outdated and len(servers) >= replicas:
                await self._stop_server(outdated[0])
        ready = sum(1 for p in self.pods if p.startswith(f"{self.name}-server-") and self._ready(p))
        self.api.objects["apps/v1/deployments", self.namespace, f"{self.name}-server"] = {
            **deployment,
            "status": {"replicas": replicas, "readyReplicas": ready},
        }

    def _unready_servers(self) -> list[str]:
        return [p for p in self.pods if p.startswith(f"{self.name}-server-") and not self._ready(p)]

    async def _stop_server(self, pod_name: str) -> None:
        await self._stop(pod_name)
        if self._pod_exists(pod_name):
            del self.api.objects["v1/pods", self.namespace, pod_name]

    async def _start(
        self,
        pod_name: str,
        component: str,
        module: str,
        env: dict[str, str],
        revision: str,
        http_port: int,
    ) -> None:
        os.makedirs(self.workdir, exist_ok=True)
        process = DaemonProcess(
            pod_name,
            [
                sys.executable,
                "-m",
                module,
                "--ready-file",
                os.path.join(self.workdir, f"{pod_name}.ready"),
            ],
            os.path.join(self.workdir, f"{pod_name}.ready"),
            os.path.join(self.workdir, f"{pod_name}.log"),
            env=env,
        )
        self._write_pod(pod_name, component, revision, ready=False)
        await asyncio.to_thread(process.start, 60.0)
        self.pods[pod_name] = Pod(pod_name, revision, process, http_port)
        self.started.append(pod_name)

    # --- the kubelet's probes ------------------------------------------------------------

    def _ready(self, pod_name: str) -> bool:
        pod = self.pods.get(pod_name)
        if pod is None or not pod.process.running:
            return False
        try:
            url = f"http://127.0.0.1:{pod.http_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def _report_readiness(self) -> None:
        for pod_name, pod in list(self.pods.items()):
            if not self._pod_exists(pod_name):
                continue  # deleted: the controller loop replaces it
            component = "storage" if "-storage-" in pod_name else "server"
            current = obj(self.api, "v1/pods", self.namespace, pod_name)
            ready = self._ready(pod_name)
            was = any(
                c.get("status") == "True"
                for c in (current.get("status") or {}).get("conditions", [])
            )
            if ready != was:
                self._write_pod(pod_name, component, pod.revision, ready)
