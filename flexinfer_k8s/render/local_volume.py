"""Host directories as claims: how a tenant's pod reaches a node directory without a
hostPath.

A node-bound cache's directory (`cache_dir.node_dir`, `cache_dir.memory_dir`) and a
`file://` path under an administrator's prefix are reached through a `local`
PersistentVolume the controller creates, pre-bound (its `claimRef`, the claim's
`volumeName`) to a claim in the tenant's namespace; pods mount that claim with a
`subPath`. One volume per namespace, root and node selector (`HostVolume`):

- `<NODE_MODELS_ROOT>/<namespace>` and `<MEMORY_ROOT>/<namespace>`: flexinfer's own
  roots, made on the node by `directory_job` (a Job in the controller's namespace, the
  only namespace whose pods may mount a host path);
- an administrator's `hostPathPrefixes` entry (the longest one holding the path), which
  exists on the node already (the administrator's data).

The volume's node affinity is the pod's nodeSelector (a cache's `kubernetes.io/hostname`,
any label); none: every node (`kubernetes.io/hostname` Exists), as a hostPath used to
mean. Names are deterministic: a hash of namespace, root and selector, so one reconcile
or another, one controller or the next, always names the same pair. A volume keeps its
data when deleted (`Retain`, and a `local` volume is never wiped by Kubernetes).

Pure: values in, manifests out.
"""

from __future__ import annotations

import hashlib
import posixpath

import attrs

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.cache_dir import MEMORY_ROOT, NODE_MODELS_ROOT
from flexinfer_k8s.render.policy import AdminPolicy
from flexinfer_kube.objects import JSON

Pairs = tuple[tuple[str, str], ...]

MANAGED_BY = {"app.kubernetes.io/managed-by": "flexinfer", "app.kubernetes.io/part-of": "flexinfer"}
NAMESPACE_LABEL = "ai.flexinfer/namespace"
"""On a volume: the namespace whose claim it is bound to (volumes have no namespace)."""
ROOT_ANNOTATION = "ai.flexinfer/host-root"
HOSTNAME_LABEL = "kubernetes.io/hostname"
DIRECTORY_IMAGE = "busybox:1.36"
DIRECTORY_JOB_TTL_SECONDS = 600
"""A directory Job goes this long after it ends, and the next reconcile makes it again:
so a `/dev/shm` emptied by a reboot gets its directory back within this plus a resync."""

DIRECTORY_SCRIPT = """\
set -eu
mkdir -p "$1"
chmod 0755 "$1"
echo "flexinfer: directory $1"
"""


@attrs.frozen
class HostVolume:
    """A host directory one namespace reaches on the nodes a selector picks."""

    namespace: str
    root: str
    """The volume's `local.path`: `<flexinfer root>/<namespace>` or an admin prefix."""
    kind: str
    """`models`, `memory` (flexinfer's roots, made by `directory_job`) or `host`."""
    selector: Pairs
    capacity: str

    @property
    def made_by_flexinfer(self) -> bool:
        return self.kind != "host"

    @property
    def digest(self) -> str:
        text = "\0".join([self.namespace, self.root, *(f"{k}={v}" for k, v in self.selector)])
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    @property
    def volume_name(self) -> str:
        """Cluster-unique: the namespace is part of it (volumes are cluster-scoped)."""
        return f"flexinfer-{self.kind}-{self.namespace[:40]}-{self.digest}"

    @property
    def claim_name(self) -> str:
        return f"flexinfer-{self.kind}-{self.digest}"

    @property
    def directory_job_name(self) -> str:
        return f"flexinfer-dir-{self.kind}-{self.namespace[:30]}-{self.digest}"

    def volume(self, name: str, *, read_only: bool = False) -> JSON:
        claim: JSON = {"claimName": self.claim_name}
        if read_only:
            claim["readOnly"] = True
        return {"name": name, "persistentVolumeClaim": claim}


def host_volume(
    path: str, *, namespace: str, selector: Pairs, policy: AdminPolicy, field: str = "spec.source"
) -> tuple[HostVolume, str]:
    """The volume that holds `path` for pods of `namespace` placed by `selector`, and the
    `subPath` of `path` inside it ("" for the root itself). `InvalidFieldError` when no
    root holds it (the tenant policy refuses such a path before this is asked)."""
    normal = posixpath.normpath(path)
    roots = [(NODE_MODELS_ROOT, "models"), (MEMORY_ROOT, "memory")]
    for base, kind in roots:
        root = f"{base}/{namespace}"
        if _under(normal, root):
            return _volume(root, kind, namespace, selector, policy), _relative(normal, root)
    if any(_under(normal, base) for base, _ in roots):
        raise InvalidFieldError(
            field,
            f"file://{normal}",
            f"is in flexinfer's cache directories but not under <root>/{namespace}/: a "
            "namespace reaches only its own",
        )
    prefixes = sorted(
        (p for p in policy.host_path_prefixes if _under(normal, p)), key=len, reverse=True
    )
    if not prefixes:
        # Outside every prefix: `tenant_policy` refuses such a path before anything is
        # rendered; rendered anyway (a test's), the volume is the path's own directory.
        own = normal if host_path_type(normal) == "Directory" else posixpath.dirname(normal)
        return _volume(own, "host", namespace, selector, policy), _relative(normal, own)
    root = prefixes[0].rstrip("/") or "/"
    return _volume(root, "host", namespace, selector, policy), _relative(normal, root)


def cache_volume(kind: str, *, namespace: str, selector: Pairs, policy: AdminPolicy) -> HostVolume:
    """The volume of a namespace's node cache root (`models` or `memory`)."""
    base = NODE_MODELS_ROOT if kind == "models" else MEMORY_ROOT
    return _volume(f"{base}/{namespace}", kind, namespace, selector, policy)


def _volume(
    root: str, kind: str, namespace: str, selector: Pairs, policy: AdminPolicy
) -> HostVolume:
    return HostVolume(
        namespace=namespace,
        root=root,
        kind=kind,
        selector=tuple(sorted(selector)),
        capacity=policy.host_cache_max_size,
    )


def host_path_type(path: str) -> str:
    """`File` for a path that names a file, `Directory` otherwise. A path is a file
    when its last element has an extension (`model.gguf`, `data.jsonl`) and does not
    end in `/`."""
    last = posixpath.basename(path)
    return "File" if not path.endswith("/") and "." in last.strip(".") else "Directory"


def _under(path: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root.rstrip("/") + "/")


def _relative(path: str, root: str) -> str:
    return "" if path == root else posixpath.relpath(path, root)


def _labels(volume: HostVolume, component: str) -> dict[str, str]:
    return {
        **MANAGED_BY,
        "app.kubernetes.io/component": component,
        NAMESPACE_LABEL: volume.namespace,
    }


def node_affinity(selector: Pairs) -> JSON:
    if selector:
        expressions = [{"key": k, "operator": "In", "values": [v]} for k, v in selector]
    else:
        expressions = [{"key": HOSTNAME_LABEL, "operator": "Exists"}]
    return {"required": {"nodeSelectorTerms": [{"matchExpressions": expressions}]}}


def persistent_volume(volume: HostVolume) -> JSON:
    """The `local` volume, pre-bound to the namespace's claim; `Retain`: deleting it
    never touches the directory."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": volume.volume_name,
            "labels": _labels(volume, "host-directory"),
            "annotations": {ROOT_ANNOTATION: volume.root},
        },
        "spec": {
            "capacity": {"storage": volume.capacity},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "volumeMode": "Filesystem",
            "local": {"path": volume.root},
            "nodeAffinity": node_affinity(volume.selector),
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": volume.namespace,
                "name": volume.claim_name,
            },
        },
    }


def claim(volume: HostVolume) -> JSON:
    """The tenant namespace's claim on the volume (bound by name: `volumeName`)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": volume.claim_name,
            "namespace": volume.namespace,
            "labels": _labels(volume, "host-directory"),
            "annotations": {ROOT_ANNOTATION: volume.root},
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": volume.volume_name,
            "resources": {"requests": {"storage": volume.capacity}},
        },
    }


def directory_job(
    volume: HostVolume, *, controller_namespace: str, policy: AdminPolicy, image: str = ""
) -> JSON | None:
    """The Job that makes `<root>/<namespace>` on the volume's node (None for an admin
    prefix, which is the administrator's). It runs in the controller's namespace, the
    one namespace whose pods the admission policy lets mount a host path; it goes
    `DIRECTORY_JOB_TTL_SECONDS` after it ends, so the next reconcile makes it again (a
    reboot empties `/dev/shm`)."""
    if not volume.made_by_flexinfer:
        return None
    parent = posixpath.dirname(volume.root)
    labels = _labels(volume, "host-directory")
    pod: JSON = {
        "restartPolicy": "OnFailure",
        "automountServiceAccountToken": False,
        "containers": [
            {
                "name": "directory",
                "image": image or DIRECTORY_IMAGE,
                "command": [
                    "sh", "-c", DIRECTORY_SCRIPT, "directory",
                    f"/parent/{posixpath.basename(volume.root)}",
                ],
                "volumeMounts": [{"name": "parent", "mountPath": "/parent"}],
                "resources": {
                    "requests": {"cpu": "10m", "memory": "16Mi"},
                    "limits": {"memory": "64Mi"},
                },
            }
        ],
        "volumes": [
            {"name": "parent", "hostPath": {"path": parent, "type": "DirectoryOrCreate"}}
        ],
        "tolerations": policy.gpu_node_tolerations(),
    }
    if volume.selector:
        pod["nodeSelector"] = dict(volume.selector)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": volume.directory_job_name,
            "namespace": controller_namespace,
            "labels": labels,
            "annotations": {ROOT_ANNOTATION: volume.root},
        },
        "spec": {
            "backoffLimit": 3,
            "activeDeadlineSeconds": 600,
            "ttlSecondsAfterFinished": DIRECTORY_JOB_TTL_SECONDS,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }
