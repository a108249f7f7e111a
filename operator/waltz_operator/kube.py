"""A small asyncio client for the Kubernetes API: the handful of calls the operator makes.

kopf watches the WaltzCluster resources; this client reads and writes what they own.
Credentials come from the same place as kopf's (``connection_from_environment``: the
pod's service account, else a kubeconfig), and objects are written with server-side
apply (field manager ``waltz-operator``), so the operator owns exactly the fields it
sets and a re-apply of the same object changes nothing.

A service account token is projected and time-bound (an hour by default, rotated by the
kubelet before it expires): it is read from its file again once it has changed, and at
once when the API server answers 401, never cached for the life of the process.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

FIELD_MANAGER = "waltz-operator"

# kind -> (API path prefix, plural)
RESOURCES = {
    "Service": ("api/v1", "services"),
    "ConfigMap": ("api/v1", "configmaps"),
    "Pod": ("api/v1", "pods"),
    "PersistentVolumeClaim": ("api/v1", "persistentvolumeclaims"),
    "Event": ("api/v1", "events"),
    "Node": ("api/v1", "nodes"),  # read only: their zone labels
    # spec.zookeeper's authSecret and tlsSecret, read; the CA, certificates and ZooKeeper
    # credential the operator keeps (spec.tls.mode operator), written.
    "Secret": ("api/v1", "secrets"),
    "StatefulSet": ("apis/apps/v1", "statefulsets"),
    "Deployment": ("apis/apps/v1", "deployments"),
    "PodDisruptionBudget": ("apis/policy/v1", "poddisruptionbudgets"),
    "NetworkPolicy": ("apis/networking.k8s.io/v1", "networkpolicies"),
    "WaltzCluster": ("apis/waltz.io/v1alpha1", "waltzclusters"),
    "Lease": ("apis/coordination.k8s.io/v1", "leases"),  # leader election
}


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Kubernetes API answered {status}: {message}")
        self.status = status


@dataclass(frozen=True)
class Connection:
    server: str
    token: str | None = None  # a fixed token (a kubeconfig's)
    token_file: str | None = None  # read again when it changes (a projected token)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False

    def current_token(self) -> str | None:
        """The token to send now: the token file's content if there is one."""
        if self.token_file is None:
            return self.token
        return _token_files.read(self.token_file) or self.token


class _TokenFiles:
    """Token files by path, read again whenever their modification time or size changes
    (the kubelet replaces a projected token by an atomic rename)."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[tuple[int, int, int], str]] = {}

    def read(self, path: str) -> str | None:
        try:
            stat = os.stat(path)
        except OSError:
            return None
        key = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        cached = self._cache.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            with open(path) as f:
                token = f.read().strip()
        except OSError:
            return None
        self._cache[path] = (key, token)
        return token or None

    def forget(self, path: str) -> None:
        self._cache.pop(path, None)


_token_files = _TokenFiles()


def bearer_token(api_key: Mapping[str, str]) -> str | None:
    """The token the official client's loaders found. They keep it as ``"bearer <token>"``
    under ``BearerToken`` (older releases: ``authorization``)."""
    value = api_key.get("BearerToken") or api_key.get("authorization") or ""
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() == "bearer":
        return token.strip() or None
    return value.strip() or None


SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def connection_from_environment(
    kubeconfig: str | None = None,
    context: str | None = None,
    service_account_dir: str = SERVICE_ACCOUNT_DIR,
) -> Connection:
    """The in-cluster service account if there is one (``$KUBERNETES_SERVICE_HOST`` and the
    account's token and CA in ``service_account_dir``), else the kubeconfig (``$KUBECONFIG``
    or ``~/.kube/config``), read by the official client's loaders."""
    from kubernetes import config
    from kubernetes.client import Configuration
    from kubernetes.config.incluster_config import InClusterConfigLoader

    cfg = Configuration()
    token_file = None
    try:
        if kubeconfig is not None:
            raise config.ConfigException("a kubeconfig was given")
        token_file = os.path.join(service_account_dir, "token")
        InClusterConfigLoader(
            token_filename=token_file,
            cert_filename=os.path.join(service_account_dir, "ca.crt"),
        ).load_and_set(cfg)
    except config.ConfigException:
        token_file = None
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    return Connection(
        server=cfg.host,
        token=bearer_token(cfg.api_key or {}),
        token_file=token_file,
        ca_file=cfg.ssl_ca_cert,
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        insecure=not cfg.verify_ssl,
    )


def object_path(kind: str, namespace: str | None, name: str | None = None) -> str:
    if kind not in RESOURCES:
        raise ValueError(f"the operator does not manage {kind} objects")
    prefix, plural = RESOURCES[kind]
    ns = f"/namespaces/{quote(namespace)}" if namespace else ""
    return f"/{prefix}{ns}/{plural}" + (f"/{quote(name)}" if name else "")


class KubeApi:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        headers = {"Accept": "application/json"}
        ssl_context: ssl.SSLContext | bool = False
        if connection.server.startswith("https"):
            if connection.insecure:
                ssl_context = ssl.create_default_context()
                ssl_context.check_hostname = False
                ssl_context.verify_mode = ssl.CERT_NONE
            else:
                ssl_context = ssl.create_default_context(cafile=connection.ca_file)
            if connection.cert_file:
                ssl_context.load_cert_chain(connection.cert_file, connection.key_file)
        self._session = aiohttp.ClientSession(
            headers=headers,
            connector=aiohttp.TCPConnector(ssl=ssl_context),
            timeout=aiohttp.ClientTimeout(total=30),
        )

    async def close(self) -> None:
        await self._session.close()

    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
    ) -> Any:
        url = self.connection.server.rstrip("/") + path
        if query:
            url += "?" + urlencode(query)
        data = json.dumps(body) if body is not None else None
        status, reason, text = await self._send(method, url, data, content_type)
        if status == 401 and self.connection.token_file:
            _token_files.forget(self.connection.token_file)  # rotated under us: read it again
            status, reason, text = await self._send(method, url, data, content_type)
        if status >= 400:
            try:
                message = json.loads(text).get("message", text)
            except (ValueError, AttributeError):
                message = text
            raise ApiError(status, message.strip() or reason or "")
        return json.loads(text) if text else None

    async def _send(
        self, method: str, url: str, data: str | None, content_type: str
    ) -> tuple[int, str, str]:
        headers = {"Content-Type": content_type} if data is not None else {}
        token = self.connection.current_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        async with self._session.request(method, url, data=data, headers=headers) as response:
            return response.status, response.reason or "", await response.text()

    async def get(self, kind: str, namespace: str | None, name: str) -> dict | None:
        """The object, or None if there is none."""
        try:
            return await self._call("GET", object_path(kind, namespace, name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def list(
        self, kind: str, namespace: str | None, labels: Mapping[str, str] | None = None
    ) -> list[dict]:
        query = (
            {"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())} if labels else None
        )
        answer = await self._call("GET", object_path(kind, namespace), query=query)
        return list((answer or {}).get("items", []))

    async def apply(self, obj: Mapping[str, Any]) -> dict:
        """Server-side apply (creates the object if it is missing)."""
        meta = obj["metadata"]
        path = object_path(obj["kind"], meta.get("namespace"), meta["name"])
        return await self._call(
            "PATCH",
            path,
            obj,
            "application/apply-patch+yaml",  # JSON is YAML
            {"fieldManager": FIELD_MANAGER, "force": "true"},
        )

    async def create(self, obj: Mapping[str, Any]) -> dict:
        """Create it (409 if it exists)."""
        meta = obj["metadata"]
        return await self._call("POST", object_path(obj["kind"], meta.get("namespace")), obj)

    async def replace(self, obj: Mapping[str, Any]) -> dict:
        """Update it whole; its ``metadata.resourceVersion`` makes a concurrent change a
        409 instead of a lost write."""
        meta = obj["metadata"]
        return await self._call(
            "PUT", object_path(obj["kind"], meta.get("namespace"), meta["name"]), obj
        )

    async def patch(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any],
        subresource: str | None = None,
    ) -> dict:
        path = object_path(kind, namespace, name) + (f"/{subresource}" if subresource else "")
        return await self._call("PATCH", path, patch, "application/merge-patch+json")

    async def delete(
        self, kind: str, namespace: str | None, name: str, propagation: str = "Background"
    ) -> bool:
        """Delete it; its dependents go in the background, or stay with ``"Orphan"``.
        False if it was gone."""
        try:
            await self._call(
                "DELETE",
                object_path(kind, namespace, name),
                {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation},
            )
            return True
        except ApiError as e:
            if e.status == 404:
                return False
            raise
