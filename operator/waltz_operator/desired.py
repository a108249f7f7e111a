"""The Kubernetes objects a WaltzCluster wants, computed from its spec. Pure.

Storage nodes: a headless Service and a StatefulSet (one volume each; the pods' stable
names are their addresses in the replica assignment; ``OnDelete`` updates, because the
operator rolls storage itself, one pod at a time while every partition keeps a
majority). Servers: a client Service and a Deployment (one at a time, never fewer than
wanted). A PodDisruptionBudget per tier, settings in ConfigMaps, hardened pods (non-root,
read-only root filesystem, no privilege escalation, no capabilities), and owner
references to the WaltzCluster so that deleting it deletes them (volumes follow
``retainVolumes``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from .spec import (
    DISABLED,
    OPERATOR,
    SECRETS,
    SERVER_HTTP_PORT,
    SERVER_PORT,
    STORAGE_HTTP_PORT,
    STORAGE_PORT,
    ClusterSpec,
    TierSpec,
)

API_VERSION = "waltz.io/v1alpha1"
KIND = "WaltzCluster"
RUN_AS = 10001
DATA = "/var/lib/waltz/storage"

CONFIG_HASH = "waltz.io/config-hash"
# On the workloads: the spec.tls.mode their pods run with (reconcile.py refuses a switch).
TLS_MODE = "waltz.io/tls-mode"
# On the pods: the scheme of their HTTP port, for Prometheus' relabelling (http or https).
METRICS_SCHEME = "waltz.io/metrics-scheme"
# The servers' replace_storage_after, from spec.storage.replaceLostAfterSeconds.
REPLACE_STORAGE_AFTER_ENV = "WALTZ_SERVER_REPLACE_STORAGE_AFTER"

Manifest = dict[str, Any]


# Names the WaltzCluster an object belongs to. ``app.kubernetes.io/instance`` alone does
# not: the chart gives its own operator and ZooKeeper the release's name there.
CLUSTER_LABEL = "waltz.io/cluster"
MANAGED_BY = "waltz-operator"


def labels(spec: ClusterSpec, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "waltz",
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "waltz",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        CLUSTER_LABEL: spec.name,
    }


def selector(spec: ClusterSpec, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/instance": spec.name,
        "app.kubernetes.io/component": component,
    }


def selector_string(spec: ClusterSpec, component: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector(spec, component).items())


def _metadata(spec: ClusterSpec, name: str, component: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": spec.namespace,
        "labels": labels(spec, component),
    }
    if spec.uid:
        meta["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": spec.name,
                "uid": spec.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return meta


def storage_majority_loss_budget(replicas_per_partition: int) -> int:
    """Storage pods that may be down at once with every partition keeping a majority:
    any two pods may hold replicas of the same partition."""
    return (replicas_per_partition - 1) // 2


def storage_disruption_budget(replicas_per_partition: int) -> int:
    """The storage PodDisruptionBudget's ``maxUnavailable``: the majority's budget, but
    never 0. One replica per partition has no majority to keep, and a budget of 0 would
    block every drain of a node forever; with it, a drained pod's partitions are
    unavailable until it runs again elsewhere (its volume keeps the data)."""
    return max(1, storage_majority_loss_budget(replicas_per_partition))


# --- pods -------------------------------------------------------------------------------


def _pod_security(tier: TierSpec) -> dict[str, Any]:
    base: dict[str, Any] = {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    return {**base, **dict(tier.pod_security_context)}


CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
}


def _probe(path: str, port: int, period: int, failures: int, https: bool) -> dict[str, Any]:
    get: dict[str, Any] = {"path": path, "port": port}
    if https:  # the kubelet does not verify the certificate; it reaches the pod's own port
        get["scheme"] = "HTTPS"
    return {
        "httpGet": get,
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


# A tier's container resources when the spec gives none: never BestEffort (the first
# pods evicted under pressure). The chart's values say the same.
DEFAULT_RESOURCES: dict[str, dict[str, Any]] = {
    "storage": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    # Above the server's memory_budget_bytes (2 GiB by default) plus the process.
    "server": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "3Gi"}},
}

ZONE_LABEL = "topology.kubernetes.io/zone"
HOST_LABEL = "kubernetes.io/hostname"
# Soft, so that a cluster smaller than its zones or hosts still schedules.
DEFAULT_SPREAD: tuple[dict[str, Any], ...] = (
    {"maxSkew": 1, "topologyKey": ZONE_LABEL, "whenUnsatisfiable": "ScheduleAnyway"},
    {"maxSkew": 1, "topologyKey": HOST_LABEL, "whenUnsatisfiable": "ScheduleAnyway"},
)


def _default_affinity(spec: ClusterSpec, component: str) -> dict[str, Any]:
    """Preferably no two pods of a tier on one node."""
    return {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": HOST_LABEL,
                        "labelSelector": {"matchLabels": selector(spec, component)},
                    },
                }
            ]
        }
    }


def _pod_spec(
    spec: ClusterSpec,
    tier: TierSpec,
    component: str,
    container: dict[str, Any],
    volumes: list[dict[str, Any]],
) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": _pod_security(tier),
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": 60,
    }
    # Spread over zones and hosts unless the spec says otherwise: a zone or a node lost
    # takes as few replicas of a partition as the cluster's shape allows.
    pod["affinity"] = dict(tier.affinity) if tier.affinity else _default_affinity(spec, component)
    if tier.tolerations:
        pod["tolerations"] = [dict(t) for t in tier.tolerations]
    pod["topologySpreadConstraints"] = [
        {"labelSelector": {"matchLabels": selector(spec, component)}, **dict(t)}
        for t in (tier.topology_spread_constraints or DEFAULT_SPREAD)
    ]
    if tier.priority_class_name:
        pod["priorityClassName"] = tier.priority_class_name
    if spec.image.pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in spec.image.pull_secrets]
    return pod


# --- Secrets: TLS certificates and the ZooKeeper credential --------------------------------

TLS_DIR = "/etc/waltz/tls"
ZK_TLS_DIR = "/etc/waltz/zk-tls"
ZK_AUTH_DIR = "/etc/waltz/zk-auth"
ZK_AUTH_KEY = "credential"  # the auth Secret's key holding user:password


def _tls_paths(prefix: str, directory: str) -> dict[str, str]:
    """A kubernetes.io/tls Secret's files as a daemon's ``<prefix>cert/key/ca`` settings."""
    return {
        f"{prefix}CERT": f"{directory}/tls.crt",
        f"{prefix}KEY": f"{directory}/tls.key",
        f"{prefix}CA": f"{directory}/ca.crt",
    }


def _secret_volume(
    name: str, secret: str, directory: str, items: list[dict[str, str]] | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, mount): readable by the daemon's group only. Mounted whole, not with
    subPath, so that a Secret rotated in place reaches the running daemon."""
    source: dict[str, Any] = {"secretName": secret, "defaultMode": 0o440}
    if items:
        source["items"] = items
    return (
        {"name": name, "secret": source},
        {"name": name, "mountPath": directory, "readOnly": True},
    )


def allowed_storage_peers(spec: ClusterSpec) -> str:
    """Who storage nodes let in: the operator's CA issues exactly two identities that dial
    storage, the servers' and the admin tools' (pki.py); Secrets of your own, the spec's
    patterns."""
    if spec.tls.mode == OPERATOR:
        return "waltz-server,waltz-admin"
    return spec.tls.allowed_server_identities


def running_tls_mode(workload: Mapping[str, Any] | None) -> str | None:
    """The spec.tls.mode a live StatefulSet's pods were made with (None: no workload). One
    made before the annotation existed says it by its volumes: Secrets, or none."""
    if workload is None:
        return None
    annotations = (workload.get("metadata") or {}).get("annotations") or {}
    if annotations.get(TLS_MODE):
        return str(annotations[TLS_MODE])
    volumes = ((workload.get("spec") or {}).get("template") or {}).get("spec", {}).get("volumes")
    return SECRETS if any(v.get("name") == "tls" for v in volumes or []) else DISABLED


def _workload_metadata(spec: ClusterSpec, name: str, component: str) -> dict[str, Any]:
    meta = _metadata(spec, name, component)
    meta["annotations"] = {TLS_MODE: spec.tls.mode}
    return meta


def _template_annotations(spec: ClusterSpec, annotations: dict[str, str]) -> dict[str, str]:
    """Only HTTPS is marked: a plain cluster's pod template stays as it was (no roll)."""
    return {**annotations, METRICS_SCHEME: "https"} if spec.https_metrics else annotations


def _secrets(spec: ClusterSpec, component: str) -> tuple[dict[str, str], list, list]:
    """The settings, volumes and mounts that give a tier its certificates and credential."""
    env: dict[str, str] = {}
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []

    def mount(
        name: str, secret: str, directory: str, items: list[dict[str, str]] | None = None
    ) -> None:
        volume, volume_mount = _secret_volume(name, secret, directory, items)
        volumes.append(volume)
        mounts.append(volume_mount)

    prefix = f"WALTZ_{component.upper()}_"
    tls = spec.tls
    if tls.enabled:
        if component == "storage":
            mount("tls", spec.storage_tls_secret, TLS_DIR)
            env.update(_tls_paths(f"{prefix}TLS_", TLS_DIR))
            env[f"{prefix}TLS_ALLOWED_PEERS"] = allowed_storage_peers(spec)
        else:
            mount("tls", spec.server_tls_secret, TLS_DIR)
            env.update(_tls_paths(f"{prefix}TLS_", TLS_DIR))
            env[f"{prefix}TLS_VERIFY_PEER"] = "true" if tls.require_client_certificates else "false"
            env.update(_tls_paths(f"{prefix}STORAGE_TLS_", TLS_DIR))
    if spec.https_metrics:
        env[f"{prefix}HTTP_TLS"] = "true"
    if spec.zk_tls_secret and spec.zk_tls_client_certificate:
        mount("zk-tls", spec.zk_tls_secret, ZK_TLS_DIR)
        env.update(_tls_paths(f"{prefix}ZK_TLS_", ZK_TLS_DIR))
    elif spec.zk_tls_secret:  # only a CA: verify ZooKeeper, present no certificate
        mount("zk-tls", spec.zk_tls_secret, ZK_TLS_DIR, [{"key": "ca.crt", "path": "ca.crt"}])
        env[f"{prefix}ZK_TLS_CA"] = f"{ZK_TLS_DIR}/ca.crt"
    if spec.zk_credential_secret and component == "server":  # storage nodes only read
        items = [{"key": ZK_AUTH_KEY, "path": ZK_AUTH_KEY}]
        mount("zk-auth", spec.zk_credential_secret, ZK_AUTH_DIR, items)
        env[f"{prefix}ZK_AUTH_FILE"] = f"{ZK_AUTH_DIR}/{ZK_AUTH_KEY}"
    return env, volumes, mounts


def _env_map(prefix: str, settings: Mapping[str, str]) -> dict[str, str]:
    return {f"{prefix}{k.upper()}": v for k, v in sorted(settings.items())}


def _log_format_env(spec: ClusterSpec, prefix: str) -> dict[str, str]:
    """spec.logFormat as the daemons' log_format; nothing for text, their default, so
    that a cluster without it keeps its pod templates. Before the tier's own settings in
    the ConfigMap: a log_format there wins for that tier."""
    return {f"{prefix}LOG_FORMAT": spec.log_format} if spec.log_format != "text" else {}


def _settings_map(
    spec: ClusterSpec, component: str, data: dict[str, str]
) -> tuple[Manifest, dict[str, str]]:
    """The daemon's settings as a ConfigMap (read with ``envFrom``), and the pod template
    annotation that carries their hash: a settings change changes the template, so the
    pods roll (a ConfigMap change alone would reach them only on their next restart)."""
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(spec, f"{spec.name}-{component}-config", component),
        "data": dict(sorted(data.items())),
    }
    digest = hashlib.sha256(json.dumps(config_map["data"], sort_keys=True).encode()).hexdigest()
    return config_map, {CONFIG_HASH: digest[:16]}


# --- storage ----------------------------------------------------------------------------


def storage_objects(spec: ClusterSpec) -> list[Manifest]:
    name = spec.storage_service
    tier = spec.storage
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, name, "storage"),
        "spec": {
            "clusterIP": "None",
            # Peers resolve a storage pod's name before it is ready (recovery, catch-up).
            "publishNotReadyAddresses": True,
            "selector": selector(spec, "storage"),
            "ports": [
                {"name": "storage", "port": STORAGE_PORT, "targetPort": STORAGE_PORT},
                {"name": "http", "port": STORAGE_HTTP_PORT, "targetPort": STORAGE_HTTP_PORT},
            ],
        },
    }
    secret_env, secret_volumes, secret_mounts = _secrets(spec, "storage")
    config_map, annotations = _settings_map(
        spec,
        "storage",
        {
            "WALTZ_STORAGE_ZOOKEEPER": spec.zookeeper,
            "WALTZ_STORAGE_ZK_ROOT": spec.zk_root,
            "WALTZ_STORAGE_DIRECTORY": DATA,
            "WALTZ_STORAGE_PORT": str(STORAGE_PORT),
            "WALTZ_STORAGE_HTTP_PORT": str(STORAGE_HTTP_PORT),
            **secret_env,
            **_log_format_env(spec, "WALTZ_STORAGE_"),
            **_env_map("WALTZ_STORAGE_", tier.settings),
        },
    )
    env = [  # per pod: not in the ConfigMap
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {
            "name": "WALTZ_STORAGE_ADVERTISED_ADDRESS",
            "value": f"$(POD_NAME).{name}.{spec.namespace}.svc:{STORAGE_PORT}",
        },
    ]
    container = {
        "name": "storage",
        "image": spec.image.of("storage"),
        "imagePullPolicy": spec.image.pull_policy,
        "envFrom": [{"configMapRef": {"name": config_map["metadata"]["name"]}}],
        "env": env,
        "ports": [
            {"name": "storage", "containerPort": STORAGE_PORT},
            {"name": "http", "containerPort": STORAGE_HTTP_PORT},
        ],
        # Opening checks every record: give a large log time before liveness counts.
        "startupProbe": _probe("/healthz", STORAGE_HTTP_PORT, 5, 360, spec.https_metrics),
        "readinessProbe": _probe("/readyz", STORAGE_HTTP_PORT, 5, 3, spec.https_metrics),
        "livenessProbe": _probe("/healthz", STORAGE_HTTP_PORT, 10, 6, spec.https_metrics),
        "resources": dict(tier.resources) or DEFAULT_RESOURCES["storage"],
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [
            {"name": "data", "mountPath": DATA},
            {"name": "tmp", "mountPath": "/tmp"},
            *secret_mounts,
        ],
    }
    claim: dict[str, Any] = {
        "metadata": {"name": "data", "labels": labels(spec, "storage")},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": tier.size}},
        },
    }
    if tier.storage_class_name:
        claim["spec"]["storageClassName"] = tier.storage_class_name
    policy = "Retain" if spec.retain_volumes else "Delete"
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _workload_metadata(spec, name, "storage"),
        "spec": {
            "serviceName": name,
            "replicas": tier.replicas,
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"},  # the operator rolls, quorum-aware
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": policy, "whenScaled": policy},
            "selector": {"matchLabels": selector(spec, "storage")},
            "template": {
                "metadata": {
                    "labels": labels(spec, "storage"),
                    "annotations": _template_annotations(spec, annotations),
                },
                "spec": _pod_spec(
                    spec,
                    tier,
                    "storage",
                    container,
                    [{"name": "tmp", "emptyDir": {}}, *secret_volumes],
                ),
            },
            "volumeClaimTemplates": [claim],
        },
    }
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(spec, name, "storage"),
        "spec": {
            "maxUnavailable": storage_disruption_budget(spec.replicas_per_partition),
            "selector": {"matchLabels": selector(spec, "storage")},
        },
    }
    return [config_map, service, statefulset, budget]


# --- servers ----------------------------------------------------------------------------


def server_tls_name(spec: ClusterSpec) -> str:
    """The name clients check a server's TLS certificate for: the client Service's
    (``<name>.<namespace>.svc``), so the server certificate must carry it."""
    return f"{spec.name}.{spec.namespace}.svc"


def _replace_storage_env(spec: ClusterSpec) -> dict[str, str]:
    """spec.storage.replaceLostAfterSeconds as the servers' replace_storage_after (spec.py
    refuses a different value in spec.server.settings); nothing while it is 0, the
    servers' default, so that a cluster without it keeps its pod template."""
    seconds = spec.storage.replace_lost_after
    return {REPLACE_STORAGE_AFTER_ENV: str(seconds)} if seconds else {}


def server_objects(spec: ClusterSpec) -> list[Manifest]:
    name = f"{spec.name}-server"
    tier = spec.server
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, spec.name, "server"),
        "spec": {
            "selector": selector(spec, "server"),
            "ports": [{"name": "client", "port": SERVER_PORT, "targetPort": SERVER_PORT}],
        },
    }
    secret_env, secret_volumes, secret_mounts = _secrets(spec, "server")
    if spec.tls.enabled:
        # Clients dial a server at its pod IP (a Deployment's pods get no DNS record of
        # their own), which no certificate names: they check the client Service's name,
        # which every server's certificate carries, published beside the address.
        secret_env["WALTZ_SERVER_ADVERTISED_TLS_NAME"] = server_tls_name(spec)
    config_map, annotations = _settings_map(
        spec,
        "server",
        {
            "WALTZ_SERVER_ZOOKEEPER": spec.zookeeper,
            "WALTZ_SERVER_ZK_ROOT": spec.zk_root,
            "WALTZ_SERVER_PORT": str(SERVER_PORT),
            "WALTZ_SERVER_HTTP_PORT": str(SERVER_HTTP_PORT),
            **secret_env,
            **_log_format_env(spec, "WALTZ_SERVER_"),
            **_env_map("WALTZ_SERVER_", tier.settings),
            **_replace_storage_env(spec),
        },
    )
    env = [  # per pod: not in the ConfigMap
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "WALTZ_SERVER_SERVER_ID", "value": "$(POD_NAME)"},
        {"name": "WALTZ_SERVER_ADVERTISED_HOST", "value": "$(POD_IP)"},
    ]
    container = {
        "name": "server",
        "image": spec.image.of("server"),
        "imagePullPolicy": spec.image.pull_policy,
        "envFrom": [{"configMapRef": {"name": config_map["metadata"]["name"]}}],
        "env": env,
        "ports": [
            {"name": "client", "containerPort": SERVER_PORT},
            {"name": "http", "containerPort": SERVER_HTTP_PORT},
        ],
        "readinessProbe": _probe("/readyz", SERVER_HTTP_PORT, 5, 3, spec.https_metrics),
        "livenessProbe": _probe("/healthz", SERVER_HTTP_PORT, 10, 6, spec.https_metrics),
        "resources": dict(tier.resources) or DEFAULT_RESOURCES["server"],
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *secret_mounts],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _workload_metadata(spec, name, "server"),
        "spec": {
            "replicas": tier.replicas,
            # One at a time, never fewer than wanted: partitions move with generations.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "selector": {"matchLabels": selector(spec, "server")},
            "template": {
                "metadata": {
                    "labels": labels(spec, "server"),
                    "annotations": _template_annotations(spec, annotations),
                },
                "spec": _pod_spec(
                    spec,
                    tier,
                    "server",
                    container,
                    [{"name": "tmp", "emptyDir": {}}, *secret_volumes],
                ),
            },
        },
    }
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(spec, name, "server"),
        # One server down at a time (partitions move to the others); never 0 allowed, which
        # with a single server would block every drain.
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(spec, "server")}},
    }
    return [config_map, service, deployment, budget]


# --- network policies -------------------------------------------------------------------

# The operator's pods (the chart's labels), in any namespace: it probes the HTTP ports.
OPERATOR_PEER = {
    "namespaceSelector": {},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "waltz-operator"}},
}


def network_policy_objects(spec: ClusterSpec) -> list[Manifest]:
    """Ingress per tier: the storage port from this cluster's servers and the operator's
    pods (admin tools run there, ``kubectl exec``); the client port from ``clientsFrom``;
    the HTTP ports from ``metricsFrom`` and the operator (an empty list: from anywhere).
    Disabled, the policies allow everything, so that turning them off needs no
    deletion."""
    np = spec.network_policy

    def policy(component: str, ingress: list[dict[str, Any]]) -> Manifest:
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": _metadata(spec, f"{spec.name}-{component}", component),
            "spec": {
                "podSelector": {"matchLabels": selector(spec, component)},
                "policyTypes": ["Ingress"],
                "ingress": ingress,
            },
        }

    def port(number: int, peers: list[Any]) -> dict[str, Any]:
        rule: dict[str, Any] = {"ports": [{"protocol": "TCP", "port": number}]}
        if peers:
            rule["from"] = [dict(p) for p in peers]
        return rule

    if not np.enabled:
        return [policy("storage", [{}]), policy("server", [{}])]
    metrics = [*np.metrics_from, OPERATOR_PEER] if np.metrics_from else []
    dialers = [{"podSelector": {"matchLabels": selector(spec, "server")}}, OPERATOR_PEER]
    return [
        policy("storage", [port(STORAGE_PORT, dialers), port(STORAGE_HTTP_PORT, metrics)]),
        policy(
            "server", [port(SERVER_PORT, list(np.clients_from)), port(SERVER_HTTP_PORT, metrics)]
        ),
    ]


def desired_objects(spec: ClusterSpec) -> list[Manifest]:
    """Every object the cluster wants, storage first."""
    return [*storage_objects(spec), *server_objects(spec), *network_policy_objects(spec)]
