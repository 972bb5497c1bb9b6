"""What every pod flexinfer renders gets, whatever the tenant wrote.

- No ServiceAccount token (`automountServiceAccountToken: false`): a model server, a
  download or a trainer has no business with the API server.
- seccomp `RuntimeDefault`; every container and init container without privilege
  escalation and with every capability dropped. A container that writes a tenant's
  storage as root (a download, the flash loader, a trainer) keeps `CHOWN`,
  `DAC_OVERRIDE` and `FOWNER`, which Pod Security "baseline" allows, so that copying
  into an existing claim whose files another user owns keeps working.
- A server whose image works as any user (`NON_ROOT_BACKENDS`: llama.cpp only reads its
  model file) runs as uid and gid `NON_ROOT_UID` with `runAsNonRoot`: with no writer
  beside it, its pod passes Pod Security "restricted". The other backends' images run
  as root and write under `/root` (vLLM's and Ollama's caches), so their pods are
  "baseline".
- A required node affinity that keeps the pod off control-plane nodes
  (`node-role.kubernetes.io/control-plane` and `…/master` must not exist), unless
  the administrator's policy sets `allowControlPlaneNodes`.

Pure: a pod spec in, a hardened copy out.
"""

from __future__ import annotations

import copy
from collections.abc import Collection

from flexinfer_k8s.render.policy import CONTROL_PLANE_NODE_LABELS, AdminPolicy
from flexinfer_kube.objects import JSON

NON_ROOT_UID = 65532
"""The conventional "nonroot" uid and gid of distroless images; any non-zero id works."""
NON_ROOT_BACKENDS = frozenset({"llama-cpp"})
WRITER_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER")


def _container_context(*, writer: bool, non_root: bool) -> JSON:
    capabilities: JSON = {"drop": ["ALL"]}
    if writer:
        capabilities["add"] = list(WRITER_CAPABILITIES)
    context: JSON = {"allowPrivilegeEscalation": False, "capabilities": capabilities}
    if non_root:
        context.update(runAsNonRoot=True, runAsUser=NON_ROOT_UID, runAsGroup=NON_ROOT_UID)
    return context


def _off_control_plane(affinity: JSON | None) -> JSON:
    """`affinity` with every required node selector term also excluding control-plane
    nodes (terms are ORed, so each one needs the exclusion)."""
    merged = copy.deepcopy(affinity) if affinity else {}
    node = merged.setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    if not terms:
        terms.append({})
    exclusion = [{"key": label, "operator": "DoesNotExist"} for label in CONTROL_PLANE_NODE_LABELS]
    for term in terms:
        expressions = term.setdefault("matchExpressions", [])
        expressions.extend(e for e in exclusion if e not in expressions)
    return merged


def secure_pod(
    pod: JSON,
    *,
    policy: AdminPolicy,
    writers: Collection[str] = (),
    non_root: Collection[str] = (),
) -> JSON:
    """A copy of the pod spec `pod` hardened as the module says; `writers` and `non_root`
    name the containers (or init containers) that write storage as root and that run
    as `NON_ROOT_UID`."""
    secured = copy.deepcopy(pod)
    secured["automountServiceAccountToken"] = False
    context = dict(secured.get("securityContext") or {})
    context["seccompProfile"] = {"type": "RuntimeDefault"}
    secured["securityContext"] = context
    for kind in ("initContainers", "containers"):
        for container in secured.get(kind) or []:
            name = container.get("name")
            container["securityContext"] = {
                **(container.get("securityContext") or {}),
                **_container_context(writer=name in writers, non_root=name in non_root),
            }
    if not policy.allow_control_plane_nodes:
        secured["affinity"] = _off_control_plane(secured.get("affinity"))
    return secured


def secure_job(job: JSON, *, policy: AdminPolicy, writers: Collection[str] = ()) -> JSON:
    """A Job whose pod template is `secure_pod`'s."""
    secured = copy.deepcopy(job)
    template = secured["spec"]["template"]
    template["spec"] = secure_pod(template["spec"], policy=policy, writers=writers)
    return secured
