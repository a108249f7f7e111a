"""A WaltzCluster's spec as the operator reads it: defaults applied, types checked. Pure.

The API server already applies the CRD's defaults and refuses what its schema and CEL
rules refuse; this reads the result into frozen dataclasses, so the rest of the operator
never digs in dicts, and refuses (``SpecError``, naming the field) what reached it
anyway (an older CRD, a resource written before a rule existed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

STORAGE_PORT = 55280
STORAGE_HTTP_PORT = 55281
SERVER_PORT = 55180
SERVER_HTTP_PORT = 55181
# spec.storage.replaceLostAfterSeconds: at most 30 days (the servers' own bound on
# replace_storage_after); 0: off.
MAX_REPLACE_LOST_AFTER = 30 * 86400
# The server setting it becomes (WALTZ_SERVER_REPLACE_STORAGE_AFTER).
REPLACE_STORAGE_AFTER = "replace_storage_after"
# spec.logFormat: the daemons' log_format setting.
LOG_FORMATS = ("text", "json")


class SpecError(ValueError):
    """The resource's spec cannot be reconciled; the message names the field."""


@dataclass(frozen=True)
class TierSpec:
    replicas: int
    resources: Mapping[str, Any] = field(default_factory=dict)
    affinity: Mapping[str, Any] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    topology_spread_constraints: tuple[Mapping[str, Any], ...] = ()
    pod_security_context: Mapping[str, Any] = field(default_factory=dict)
    priority_class_name: str = ""
    settings: Mapping[str, str] = field(default_factory=dict)
    storage_class_name: str = ""  # storage only
    size: str = "10Gi"  # storage only
    # Storage only: seconds a storage node must be unreachable before the servers move its
    # replicas away, and the operator then gives a pod whose volume is gone a new one
    # (0: off; lost_volumes.py).
    replace_lost_after: int = 0


@dataclass(frozen=True)
class ImageSpec:
    repository: str = "ghcr.io/waltz-io"
    tag: str = "0.1.0"
    pull_policy: str = "IfNotPresent"
    pull_secrets: tuple[str, ...] = ()

    def of(self, component: str) -> str:
        return f"{self.repository}/waltz-{component}:{self.tag}"


# spec.tls.mode: who provides the certificates.
OPERATOR = "operator"  # the operator's own CA issues and renews them (the default)
SECRETS = "secrets"  # kubernetes.io/tls Secrets the spec names (cert-manager's, or yours)
DISABLED = "disabled"  # plain text, only when asked
TLS_MODES = (OPERATOR, SECRETS, DISABLED)


@dataclass(frozen=True)
class TlsSpec:
    """Mutual TLS: from the operator's CA, from Secrets of type kubernetes.io/tls with
    ``ca.crt`` (cert-manager's), or off."""

    mode: str = OPERATOR
    storage_secret: str = ""  # secrets: storage pods serve it; servers check its names
    server_secret: str = ""  # secrets: servers serve clients with it, present it to storage
    allowed_server_identities: str = "waltz-server*"  # storage's tls_allowed_peers
    require_client_certificates: bool = True  # the server's tls_verify_peer
    # Whether spec.tls.mode was written (else it is read from the running cluster).
    mode_given: bool = True

    @property
    def enabled(self) -> bool:
        return self.mode != DISABLED


@dataclass(frozen=True)
class NetworkPolicySpec:
    enabled: bool = True
    clients_from: tuple[Mapping[str, Any], ...] = ()  # NetworkPolicyPeers; empty: anyone
    metrics_from: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    namespace: str
    uid: str
    partitions: int
    replicas_per_partition: int
    zookeeper: str
    zk_root: str
    storage: TierSpec
    server: TierSpec
    image: ImageSpec
    retain_volumes: bool = True
    paused: bool = False
    log_format: str = "text"  # the daemons' log lines: text or json
    tls: TlsSpec = TlsSpec()
    network_policy: NetworkPolicySpec = NetworkPolicySpec()
    zk_auth_secret: str = ""  # Secret whose ``credential`` key holds user:password
    zk_tls_secret: str = ""  # kubernetes.io/tls Secret for ZooKeeper's TLS port
    # Whether that Secret holds a client certificate besides ca.crt (the reconciler
    # reads the Secret to say; only ca.crt: the daemons verify ZooKeeper and present none).
    zk_tls_client_certificate: bool = True
    # Storage addresses by ordinal when the daemons do not run as pods of this cluster
    # (the test harness that plays the kubelet); empty: the pods' stable DNS names.
    address_book: tuple[str, ...] = ()

    @property
    def storage_service(self) -> str:
        return f"{self.name}-storage"

    # --- certificates and the ZooKeeper credential, by mode ---------------------------

    @property
    def storage_tls_secret(self) -> str:
        """The storage pods' kubernetes.io/tls Secret ("": no TLS)."""
        if self.tls.mode == OPERATOR:
            return f"{self.name}-storage-tls"
        return self.tls.storage_secret if self.tls.mode == SECRETS else ""

    @property
    def server_tls_secret(self) -> str:
        if self.tls.mode == OPERATOR:
            return f"{self.name}-server-tls"
        return self.tls.server_secret if self.tls.mode == SECRETS else ""

    @property
    def zk_credential_generated(self) -> bool:
        """The operator makes the ZooKeeper credential: its own CA's mode, none given."""
        return self.tls.mode == OPERATOR and not self.zk_auth_secret

    @property
    def zk_credential_secret(self) -> str:
        """The Secret holding the ZooKeeper credential ("": none, an open ACL)."""
        if self.zk_credential_generated:
            return f"{self.name}-zookeeper-credential"
        return self.zk_auth_secret

    @property
    def https_metrics(self) -> bool:
        """The HTTP ports serve HTTPS with the pod's certificate: under the operator's CA,
        whose certificate the operator holds to check them."""
        return self.tls.mode == OPERATOR

    def storage_pod(self, index: int) -> str:
        return f"{self.name}-storage-{index}"

    def storage_address(self, index: int) -> str:
        """The address storage pod ``index`` has in the replica assignment: its stable
        network name under the headless Service."""
        if self.address_book:
            return self.address_book[index]
        return (
            f"{self.storage_pod(index)}.{self.storage_service}.{self.namespace}.svc:{STORAGE_PORT}"
        )

    def storage_addresses(self, count: int | None = None) -> list[str]:
        return [
            self.storage_address(i)
            for i in range(self.storage.replicas if count is None else count)
        ]


def _get(doc: Mapping[str, Any], key: str, kind: type, default: Any, where: str) -> Any:
    value = doc.get(key, default)
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise SpecError(f"{where}.{key} must be an integer, got {value!r}")
    if kind is not int and not isinstance(value, kind):
        raise SpecError(f"{where}.{key} must be {kind.__name__}, got {value!r}")
    return value


def _tier(doc: Mapping[str, Any], where: str, default_replicas: int) -> TierSpec:
    if not isinstance(doc, Mapping):
        raise SpecError(f"{where} must be an object")
    settings = _get(doc, "settings", dict, {}, where)
    for key, value in settings.items():
        if not isinstance(value, str):
            raise SpecError(f"{where}.settings.{key} must be a string, got {value!r}")
    replicas = _get(doc, "replicas", int, default_replicas, where)
    if replicas < 1:
        raise SpecError(f"{where}.replicas must be at least 1, got {replicas}")
    return TierSpec(
        replicas=replicas,
        resources=_get(doc, "resources", dict, {}, where),
        affinity=_get(doc, "affinity", dict, {}, where),
        tolerations=tuple(_get(doc, "tolerations", list, [], where)),
        topology_spread_constraints=tuple(_get(doc, "topologySpreadConstraints", list, [], where)),
        pod_security_context=_get(doc, "podSecurityContext", dict, {}, where),
        priority_class_name=_get(doc, "priorityClassName", str, "", where),
        settings=dict(settings),
        storage_class_name=_get(doc, "storageClassName", str, "", where),
        size=_get(doc, "size", str, "10Gi", where),
    )


def _replace_lost_after(storage: Mapping[str, Any], server: TierSpec) -> int:
    """spec.storage.replaceLostAfterSeconds; the servers' replace_storage_after setting,
    when also given in spec.server.settings, must say the same."""
    where = "spec.storage"
    seconds = _get(storage, "replaceLostAfterSeconds", int, 0, where)
    if not 0 <= seconds <= MAX_REPLACE_LOST_AFTER:
        raise SpecError(
            f"{where}.replaceLostAfterSeconds must be 0 (off) or 1..{MAX_REPLACE_LOST_AFTER} "
            f"seconds, got {seconds}"
        )
    for key, value in server.settings.items():
        if key.upper() != REPLACE_STORAGE_AFTER.upper():
            continue
        try:
            given: float | None = float(value)
        except ValueError:
            given = None
        if given != seconds:
            raise SpecError(
                f"spec.server.settings.{key} ({value!r}) differs from "
                f"{where}.replaceLostAfterSeconds ({seconds}): set only "
                f"{where}.replaceLostAfterSeconds (the operator passes it to the servers)"
            )
    return seconds


def _log_format(spec: Mapping[str, Any]) -> str:
    value = _get(spec, "logFormat", str, "text", "spec")
    if value not in LOG_FORMATS:
        raise SpecError(f"spec.logFormat must be one of {', '.join(LOG_FORMATS)}, got {value!r}")
    return value


def _tls(doc: Any) -> TlsSpec:
    if not isinstance(doc, Mapping):
        raise SpecError("spec.tls must be an object")
    storage = _get(doc, "storageSecret", str, "", "spec.tls")
    server = _get(doc, "serverSecret", str, "", "spec.tls")
    if bool(storage) != bool(server):
        raise SpecError(
            "spec.tls needs both storageSecret and serverSecret (servers and storage nodes "
            "authenticate each other)"
        )
    # Not given: the Secrets' mode if they are named, else the operator's own CA.
    mode = _get(doc, "mode", str, SECRETS if storage else OPERATOR, "spec.tls")
    if mode not in TLS_MODES:
        raise SpecError(f"spec.tls.mode must be one of {', '.join(TLS_MODES)}, got {mode!r}")
    if (mode == SECRETS) != bool(storage):
        raise SpecError(
            "spec.tls.storageSecret and serverSecret are given with spec.tls.mode secrets, "
            f"and only then (mode is {mode})"
        )
    return TlsSpec(
        mode=mode,
        storage_secret=storage,
        server_secret=server,
        allowed_server_identities=_get(
            doc, "allowedServerIdentities", str, TlsSpec.allowed_server_identities, "spec.tls"
        ),
        require_client_certificates=_get(doc, "requireClientCertificates", bool, True, "spec.tls"),
        mode_given="mode" in doc,
    )


def _network_policy(doc: Any) -> NetworkPolicySpec:
    if not isinstance(doc, Mapping):
        raise SpecError("spec.networkPolicy must be an object")
    peers = {}
    for key in ("clientsFrom", "metricsFrom"):
        value = _get(doc, key, list, [], "spec.networkPolicy")
        for i, peer in enumerate(value):
            if not isinstance(peer, Mapping):
                raise SpecError(f"spec.networkPolicy.{key}[{i}] must be an object")
        peers[key] = tuple(value)
    return NetworkPolicySpec(
        enabled=_get(doc, "enabled", bool, True, "spec.networkPolicy"),
        clients_from=peers["clientsFrom"],
        metrics_from=peers["metricsFrom"],
    )


def parse(resource: Mapping[str, Any]) -> ClusterSpec:
    """The spec of a WaltzCluster resource (a dict as the API returns it)."""
    meta = resource.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace") or "default"
    if not name:
        raise SpecError("metadata.name is missing")
    spec = resource.get("spec")
    if not isinstance(spec, Mapping):
        raise SpecError("spec is missing")
    zk = spec.get("zookeeper")
    if not isinstance(zk, Mapping) or not zk.get("connect"):
        raise SpecError("spec.zookeeper.connect is required")
    partitions = _get(spec, "partitions", int, 4, "spec")
    rpp = _get(spec, "replicasPerPartition", int, 3, "spec")
    if partitions < 1:
        raise SpecError(f"spec.partitions must be at least 1, got {partitions}")
    if rpp < 1 or rpp % 2 == 0:
        raise SpecError(f"spec.replicasPerPartition must be odd and at least 1, got {rpp}")
    storage = _tier(spec.get("storage", {}), "spec.storage", 3)
    if storage.replicas < rpp:
        raise SpecError(
            f"spec.storage.replicas ({storage.replicas}) must be at least "
            f"replicasPerPartition ({rpp})"
        )
    server = _tier(spec.get("server", {}), "spec.server", 2)
    storage = replace(
        storage, replace_lost_after=_replace_lost_after(spec.get("storage", {}), server)
    )
    image = spec.get("image", {})
    if not isinstance(image, Mapping):
        raise SpecError("spec.image must be an object")
    return ClusterSpec(
        name=name,
        namespace=namespace,
        uid=meta.get("uid", ""),
        partitions=partitions,
        replicas_per_partition=rpp,
        zookeeper=_get(zk, "connect", str, "", "spec.zookeeper"),
        zk_root=zk.get("root") or f"/waltz/{namespace}/{name}",
        storage=storage,
        server=server,
        image=ImageSpec(
            repository=_get(image, "repository", str, ImageSpec.repository, "spec.image"),
            tag=_get(image, "tag", str, ImageSpec.tag, "spec.image"),
            pull_policy=_get(image, "pullPolicy", str, ImageSpec.pull_policy, "spec.image"),
            pull_secrets=tuple(_get(image, "pullSecrets", list, [], "spec.image")),
        ),
        retain_volumes=_get(spec, "retainVolumes", bool, True, "spec"),
        paused=_get(spec, "paused", bool, False, "spec"),
        log_format=_log_format(spec),
        tls=_tls(spec.get("tls", {})),
        network_policy=_network_policy(spec.get("networkPolicy", {})),
        zk_auth_secret=_get(zk, "authSecret", str, "", "spec.zookeeper"),
        zk_tls_secret=_get(zk, "tlsSecret", str, "", "spec.zookeeper"),
    )
