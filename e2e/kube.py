"""A small kubectl driver for the end-to-end tests (kubectl from the pinned wheel)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _kubectl() -> str:
    sys.path.insert(0, str(ROOT / "tests" / "k8s"))
    from helm_binary import kubectl_path

    return kubectl_path()


class Kube:
    def __init__(self, context: str) -> None:
        self.context = context
        self._kubectl = _kubectl()

    def __call__(self, *args: str, input: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            [self._kubectl, "--context", self.context, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=600,
        )
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

    def job(
        self,
        namespace: str,
        name: str,
        image: str,
        command: list[str],
        env: dict[str, str],
        tls_secret: str = "",
    ) -> None:
        """Start a Job (restartPolicy Never, no retries); ``tls_secret``: a client
        certificate mounted as the waltz client's WALTZ_TLS_* files."""
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
        self.apply(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "backoffLimit": 0,
                    "template": {
                        "spec": {
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
