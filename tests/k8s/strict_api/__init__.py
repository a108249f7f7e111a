"""A strict in-memory Kubernetes API server for tests: kopf and the operator run against
it over HTTP(S), and it refuses what kube-apiserver refuses.

One idea per module:

* ``server``: ``strict_api(...)`` (an async context manager) and ``StrictApi``, the
  test-side API (``put``, ``get``, ``list``, ``remove``, ``patch``, ``update_status``,
  ``events``, ``requests``, ``request`` over HTTP, ``load_crd``, ``gc_idle``);
* ``http``: paths, verbs, discovery, watch streams, the request log;
* ``auth``: bearer tokens and client certificates (401 otherwise); ``pki``: a CA,
  certificates and kubeconfigs for tests;
* ``store``: objects and the bookkeeping of every write (resourceVersion, uid,
  generation, status subresource, conflicts, finalizers, deletion, watch history);
* ``admission``: the order of a write's checks; ``validation``: pruning, defaulting and
  structural validation; ``cel``: x-kubernetes-validations; ``schema``: the schema view
  (CRDs and the built-in kinds' OpenAPI); ``builtins``: the built-in kinds' Go rules and
  defaults; ``names``: names, labels, owner references; ``quantity``: quantities;
* ``patches``: merge, JSON and strategic merge patch; ``fieldsets`` and ``ssa``: field
  ownership and server-side apply; ``selectors``: label and field selectors;
* ``gc``: the garbage collector and namespace controller; ``registry``: the resources
  served; ``errors``: Status bodies and field errors in kube-apiserver's words.

Knowingly not enforced (tests must not rely on their absence either): authorization
(RBAC) and admission plugins other than NamespaceLifecycle and PersistentVolumeClaimResize
(no quotas, limit ranges, pod security, webhooks); the built-in kinds' Go validation
beyond the rules in ``builtins`` (their OpenAPI types, enums and formats are checked,
and only a few Go defaults are applied); one version per resource (events.k8s.io/v1
Events are stored apart from core/v1 Events, no conversion); CEL cost limits,
``optionalOldSelf`` and validation ratcheting; list ``resourceVersion`` semantics (a list
is always the latest state; continue tokens do not pin a snapshot); ``dryRun`` (a 400);
controllers other than the garbage collector and the namespace controller (tests play
them: ``tests/k8s/kubelet.py``); PVC shrinking back to ``status.capacity`` after a failed
expansion (Kubernetes 1.34 allows it: refused here).
"""

from .errors import ApiError, FieldError
from .http import RequestRecord
from .pki import CertFiles, Pki, make_pki, write_kubeconfig
from .registry import ResourceType
from .server import ADMIN_TOKEN, Response, StrictApi, strict_api

__all__ = [
    "ADMIN_TOKEN",
    "ApiError",
    "CertFiles",
    "FieldError",
    "Pki",
    "RequestRecord",
    "ResourceType",
    "Response",
    "StrictApi",
    "make_pki",
    "strict_api",
    "write_kubeconfig",
]
