"""What kube-apiserver's Go code does for the built-in kinds, beyond their schemas: a few
defaults (the ones that matter to a reader or to ownership: Service type and clusterIP,
port protocols, the StatefulSet and Deployment strategies), and the validation rules of
pkg/apis/*/validation the operator could run into, with their messages:

* StatefulSet: an update may change only replicas, ordinals, template, updateStrategy,
  persistentVolumeClaimRetentionPolicy and minReadySeconds; the selector must match the
  template's labels.
* Deployment, ReplicaSet: the selector is immutable and must match the template.
* PersistentVolumeClaim: the spec is immutable but for a bound claim's storage request,
  which may only grow, and only where its StorageClass allows expansion.
* Service: clusterIP is allocated, then immutable (an update that leaves it out keeps
  it); several ports need names.
* PodDisruptionBudget: minAvailable or maxUnavailable, not both (the selector is
  mutable).
* Pod: containers need a name and an image, mounts need their volume; an update may
  change only images, activeDeadlineSeconds, tolerations (additions) and
  terminationGracePeriodSeconds.
* Secret, ConfigMap: ``immutable: true`` freezes the data; keys must be config keys.
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import Any

from .errors import ApiError, FieldError, forbidden
from .names import name_problems, validate_labels
from .quantity import QuantityError, parse_quantity
from .selectors import selector_from_match

STATEFULSET_FORBIDDEN = (
    "updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', "
    "'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are "
    "forbidden"
)
STATEFULSET_MUTABLE = (
    "replicas",
    "ordinals",
    "template",
    "updateStrategy",
    "persistentVolumeClaimRetentionPolicy",
    "minReadySeconds",
)
POD_FORBIDDEN = (
    "pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only "
    "additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be "
    "set to 1 if it was previously negative)"
)
PVC_FORBIDDEN = (
    "spec is immutable after creation except resources.requests and "
    "volumeAttributesClassName for bound claims"
)
IMMUTABLE = "field is immutable when `immutable` is set"
CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
CONFIG_KEY_MESSAGE = (
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. "
    "'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
)


class ClusterIPs:
    """Allocates Service cluster IPs from 10.96.0.0/12, as the apiserver's allocator."""

    def __init__(self) -> None:
        self._next = int(ipaddress.ip_address("10.96.0.10"))

    def allocate(self) -> str:
        self._next += 1
        return str(ipaddress.ip_address(self._next))


# --- defaults ---------------------------------------------------------------------------


def _default_containers(pod_spec: Any) -> None:
    if not isinstance(pod_spec, dict):
        return
    for group in ("containers", "initContainers"):
        for container in pod_spec.get(group) or []:
            for port in (container.get("ports") or []) if isinstance(container, dict) else []:
                if isinstance(port, dict):
                    port.setdefault("protocol", "TCP")
    pod_spec.setdefault("restartPolicy", "Always")
    pod_spec.setdefault("terminationGracePeriodSeconds", 30)
    pod_spec.setdefault("dnsPolicy", "ClusterFirst")


def _template_spec(obj: Mapping[str, Any]) -> Any:
    return ((obj.get("spec") or {}).get("template") or {}).get("spec")


def apply_defaults(
    kind: str, obj: dict[str, Any], old: Mapping[str, Any] | None, ips: ClusterIPs
) -> None:
    spec = obj.get("spec")
    if kind == "Pod":
        _default_containers(spec)
    elif kind in ("StatefulSet", "Deployment", "ReplicaSet") and isinstance(spec, dict):
        _default_containers(_template_spec(obj))
        spec.setdefault("replicas", 1)
        if kind == "StatefulSet":
            spec.setdefault("podManagementPolicy", "OrderedReady")
            spec.setdefault("revisionHistoryLimit", 10)
            strategy = spec.setdefault("updateStrategy", {"type": "RollingUpdate"})
            if strategy.get("type") == "RollingUpdate":
                strategy.setdefault("rollingUpdate", {"partition": 0})
            spec.setdefault(
                "persistentVolumeClaimRetentionPolicy",
                {"whenDeleted": "Retain", "whenScaled": "Retain"},
            )
            for claim in spec.get("volumeClaimTemplates") or []:
                if isinstance(claim, dict) and isinstance(claim.get("spec"), dict):
                    claim["spec"].setdefault("volumeMode", "Filesystem")
        elif kind == "Deployment":
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault("progressDeadlineSeconds", 600)
            strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
            if strategy.get("type") == "RollingUpdate":
                strategy.setdefault("rollingUpdate", {"maxUnavailable": "25%", "maxSurge": "25%"})
    elif kind == "Service" and isinstance(spec, dict):
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for port in spec.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")
                port.setdefault("targetPort", port.get("port"))
        old_spec = (old or {}).get("spec") or {}
        if not spec.get("clusterIP") and old_spec.get("clusterIP"):
            # kube-apiserver copies an allocated IP into an update that leaves it out
            spec["clusterIP"] = old_spec["clusterIP"]
            spec.setdefault(
                "clusterIPs", list(old_spec.get("clusterIPs") or [old_spec["clusterIP"]])
            )
        if spec["type"] != "ExternalName" and not spec.get("clusterIP"):
            spec["clusterIP"] = ips.allocate()
        if spec.get("clusterIP"):
            spec.setdefault("clusterIPs", [spec["clusterIP"]])
    elif kind == "PersistentVolumeClaim" and isinstance(spec, dict):
        spec.setdefault("volumeMode", "Filesystem")
    elif kind == "Secret":
        obj.setdefault("type", "Opaque")
        # stringData is write-only: it lands in data, base64-encoded
        for key, value in (obj.pop("stringData", None) or {}).items():
            obj.setdefault("data", {})[key] = base64.b64encode(str(value).encode()).decode()
    elif kind == "Namespace":
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        obj.setdefault("status", {}).setdefault("phase", "Active")


# --- validation -------------------------------------------------------------------------


def _selector_matches_template(obj: Mapping[str, Any], errors: list[FieldError]) -> None:
    spec = obj.get("spec") or {}
    selector = spec.get("selector")
    if not isinstance(selector, Mapping) or not (
        selector.get("matchLabels") or selector.get("matchExpressions")
    ):
        errors.append(
            FieldError(
                "Invalid",
                "spec.selector",
                "empty selector is invalid for deployment",
                selector or {},
            )
        )
        return
    errors += validate_labels(selector.get("matchLabels"), "spec.selector.matchLabels")
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if not selector_from_match(selector)(labels):
        errors.append(
            FieldError(
                "Invalid",
                "spec.template.metadata.labels",
                "`selector` does not match template `labels`",
                labels,
            )
        )


def _pod_spec_errors(spec: Any, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    if not isinstance(spec, Mapping):
        return errors
    volumes = set()
    for i, volume in enumerate(spec.get("volumes") or []):
        name = volume.get("name", "") if isinstance(volume, Mapping) else ""
        if name in volumes:
            errors.append(FieldError("Duplicate", f"{path}.volumes[{i}].name", value=name))
        volumes.add(name)
    containers = spec.get("containers") or []
    if not containers:
        errors.append(FieldError("Required", f"{path}.containers"))
    names: set[str] = set()
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or []):
            where = f"{path}.{group}[{i}]"
            if not isinstance(container, Mapping):
                continue
            name = container.get("name") or ""
            if not name:
                errors.append(FieldError("Required", f"{where}.name"))
            else:
                for problem in name_problems(name, "label"):
                    errors.append(FieldError("Invalid", f"{where}.name", problem, name))
                if name in names:
                    errors.append(FieldError("Duplicate", f"{where}.name", value=name))
                names.add(name)
            if not container.get("image"):
                errors.append(FieldError("Required", f"{where}.image"))
            for j, mount in enumerate(container.get("volumeMounts") or []):
                if isinstance(mount, Mapping) and mount.get("name") not in volumes:
                    errors.append(
                        FieldError(
                            "NotFound", f"{where}.volumeMounts[{j}].name", value=mount.get("name")
                        )
                    )
    restart = spec.get("restartPolicy")
    if restart not in (None, "Always", "OnFailure", "Never"):
        errors.append(
            FieldError(
                "NotSupported",
                f"{path}.restartPolicy",
                'supported values: "Always", "OnFailure", "Never"',
                restart,
            )
        )
    return errors


def _replicas(obj: Mapping[str, Any], errors: list[FieldError]) -> None:
    replicas = (obj.get("spec") or {}).get("replicas")
    if isinstance(replicas, int) and replicas < 0:
        errors.append(
            FieldError("Invalid", "spec.replicas", "must be greater than or equal to 0", replicas)
        )


def validate(kind: str, obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    """The kind's rules for a create (``old`` None) or an update."""
    errors: list[FieldError] = []
    spec = obj.get("spec") or {}
    old_spec = (old or {}).get("spec") or {}
    if kind == "StatefulSet":
        _replicas(obj, errors)
        _selector_matches_template(obj, errors)
        template_spec = _template_spec(obj) or {}
        if template_spec.get("restartPolicy", "Always") != "Always":
            errors.append(
                FieldError(
                    "NotSupported",
                    "spec.template.spec.restartPolicy",
                    'supported values: "Always"',
                    template_spec.get("restartPolicy"),
                )
            )
        for i, claim in enumerate(spec.get("volumeClaimTemplates") or []):
            name = ((claim or {}).get("metadata") or {}).get("name", "")
            for problem in name_problems(name, "subdomain"):
                errors.append(
                    FieldError(
                        "Invalid", f"spec.volumeClaimTemplates[{i}].metadata.name", problem, name
                    )
                )
        if old is not None:
            frozen_new = {k: v for k, v in spec.items() if k not in STATEFULSET_MUTABLE}
            frozen_old = {k: v for k, v in old_spec.items() if k not in STATEFULSET_MUTABLE}
            if frozen_new != frozen_old:
                errors.append(FieldError("Forbidden", "spec", STATEFULSET_FORBIDDEN))
    elif kind in ("Deployment", "ReplicaSet"):
        _replicas(obj, errors)
        _selector_matches_template(obj, errors)
        errors += _pod_spec_errors(_template_spec(obj), "spec.template.spec")
        if old is not None and spec.get("selector") != old_spec.get("selector"):
            errors.append(
                FieldError("Invalid", "spec.selector", "field is immutable", spec.get("selector"))
            )
    elif kind == "Pod":
        errors += _pod_spec_errors(spec, "spec")
        if old is not None:
            errors += _pod_update(spec, old_spec)
    elif kind == "PodDisruptionBudget":
        if "minAvailable" in spec and "maxUnavailable" in spec:
            errors.append(
                FieldError(
                    "Invalid",
                    "spec",
                    "minAvailable and maxUnavailable cannot be both set",
                    spec,
                )
            )
        selector = spec.get("selector")
        if isinstance(selector, Mapping):
            errors += validate_labels(selector.get("matchLabels"), "spec.selector.matchLabels")
    elif kind == "Service":
        errors += _service(spec, old_spec if old is not None else None)
    elif kind == "PersistentVolumeClaim":
        errors += _claim(obj, old)
    elif kind in ("Secret", "ConfigMap"):
        errors += _data(kind, obj, old)
    return errors


def _pod_update(spec: Mapping[str, Any], old_spec: Mapping[str, Any]) -> list[FieldError]:
    mutable = copy.deepcopy(dict(spec))
    for group in ("containers", "initContainers"):
        olds = old_spec.get(group) or []
        news = mutable.get(group) or []
        if len(olds) == len(news):
            for new_container, old_container in zip(news, olds, strict=True):
                if isinstance(new_container, dict) and isinstance(old_container, Mapping):
                    new_container["image"] = old_container.get("image")
    for name in ("activeDeadlineSeconds", "terminationGracePeriodSeconds"):
        mutable.pop(name, None)
    old_cmp = {
        k: v
        for k, v in old_spec.items()
        if k not in ("activeDeadlineSeconds", "terminationGracePeriodSeconds")
    }
    old_tolerations = list(old_spec.get("tolerations") or [])
    new_tolerations = list(mutable.pop("tolerations", None) or [])
    old_cmp.pop("tolerations", None)
    if mutable != old_cmp or any(t not in new_tolerations for t in old_tolerations):
        return [FieldError("Forbidden", "spec", POD_FORBIDDEN)]
    return []


def _service(spec: Mapping[str, Any], old_spec: Mapping[str, Any] | None) -> list[FieldError]:
    errors: list[FieldError] = []
    ports = spec.get("ports") or []
    headless = spec.get("clusterIP") == "None"
    if not ports and not headless and spec.get("type") != "ExternalName":
        errors.append(FieldError("Required", "spec.ports"))
    names: set[str] = set()
    for i, port in enumerate(ports):
        name = (port or {}).get("name") or ""
        if len(ports) > 1 and not name:
            errors.append(FieldError("Required", f"spec.ports[{i}].name"))
        if name and name in names:
            errors.append(FieldError("Duplicate", f"spec.ports[{i}].name", value=name))
        names.add(name)
    errors += validate_labels(spec.get("selector"), "spec.selector")
    if (
        old_spec is not None
        and old_spec.get("clusterIP")
        and spec.get("clusterIP") != old_spec.get("clusterIP")
    ):
        errors.append(
            FieldError(
                "Invalid",
                "spec.clusterIPs[0]",
                "may not change once set",
                [spec.get("clusterIP")],
            )
        )
    return errors


def _storage(claim: Mapping[str, Any] | None) -> Any:
    return (
        (((claim or {}).get("spec") or {}).get("resources") or {})
        .get("requests", {})
        .get("storage")
    )


def _claim(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    errors: list[FieldError] = []
    spec = obj.get("spec") or {}
    if not spec.get("accessModes"):
        errors.append(
            FieldError("Required", "spec.accessModes", "at least 1 access mode is required")
        )
    size = _storage(obj)
    if size is None:
        errors.append(FieldError("Required", "spec.resources[storage]"))
    if old is None:
        return errors
    old_spec = old.get("spec") or {}
    bound = ((old.get("status") or {}).get("phase")) == "Bound"
    new_cmp = copy.deepcopy(dict(spec))
    old_cmp = copy.deepcopy(dict(old_spec))
    if bound:  # a bound claim's storage request may change (grow); nothing else
        for side in (new_cmp, old_cmp):
            side.get("resources", {}).get("requests", {}).pop("storage", None)
    for side in (new_cmp, old_cmp):
        side.pop("volumeAttributesClassName", None)
    if new_cmp != old_cmp:
        errors.append(FieldError("Forbidden", "spec", PVC_FORBIDDEN))
    try:
        if size is not None and parse_quantity(size) < parse_quantity(_storage(old) or 0):
            errors.append(
                FieldError(
                    "Forbidden",
                    "spec.resources.requests.storage",
                    "field can not be less than previous value",
                )
            )
    except QuantityError:
        pass  # the schema's check reports it
    return errors


def check_resize(
    obj: Mapping[str, Any],
    old: Mapping[str, Any],
    expandable: Callable[[str | None], bool],
) -> None:
    """The PersistentVolumeClaimResize admission plugin: growing a claim needs a
    StorageClass that allows volume expansion (403 otherwise)."""
    try:
        grows = parse_quantity(_storage(obj) or 0) > parse_quantity(_storage(old) or 0)
    except QuantityError:
        return
    if not grows:
        return
    storage_class = ((obj.get("spec") or {}).get("storageClassName")) or None
    if not expandable(storage_class):
        meta = obj.get("metadata") or {}
        raise forbidden(
            "",
            "persistentvolumeclaims",
            meta.get("name", ""),
            "only dynamically provisioned pvc can be resized and the storageclass that "
            "provisions the pvc must support resize",
        )


def _data(kind: str, obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[FieldError]:
    errors: list[FieldError] = []
    for field in ("data", "binaryData") if kind == "ConfigMap" else ("data", "stringData"):
        for key in obj.get(field) or {}:
            if not CONFIG_KEY.match(key) or len(key) > 253:
                errors.append(FieldError("Invalid", f"{field}[{key}]", CONFIG_KEY_MESSAGE, key))
    if old is not None:
        if old.get("immutable") is True:
            if obj.get("immutable") is not True:
                errors.append(FieldError("Forbidden", "immutable", IMMUTABLE))
            for field in ("data", "binaryData"):
                if (obj.get(field) or {}) != (old.get(field) or {}):
                    errors.append(FieldError("Forbidden", field, IMMUTABLE))
        if kind == "Secret" and obj.get("type") != old.get("type"):
            errors.append(FieldError("Invalid", "type", "field is immutable", obj.get("type")))
    return errors


def decode_error(kind: str, version: str, detail: str) -> ApiError:
    """A body that does not decode into the kind's Go type: 400, as kube-apiserver."""
    return ApiError(
        400,
        "BadRequest",
        f'{kind} in version "{version}" cannot be handled as a {kind}: {detail}',
    )
