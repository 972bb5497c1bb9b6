"""ModelCaches on the local control plane, where a user's data and a real cluster's
rules meet them: a claim already holding a compiled model (seed 002's), a finetune pod
the scheduler cannot place, a deleted node-bound cache, a claim nothing provides.

kwok runs pods without running their containers. Where what a container does is the
point (the download script over a user's files), the test plays its kubelet: the pod
is held Running (`flexinfer.test/complete-delay`), its rendered command runs for real
with /bin/sh, its volumes mapped to the directories behind them (a claim's
PersistentVolume, a node directory under a temporary root), and its end is written to
the pod's status as a kubelet would, termination message included.
"""

# The fixtures come from .harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import os
import subprocess
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from flexinfer_devcluster.localcluster import COMPLETE_DELAY_ANNOTATION, KwokNode
from flexinfer_devcluster.policy import dev_policy
from flexinfer_k8s.reconcile_cache import CacheTimeouts
from flexinfer_k8s.render.cache import cache_from_k8s
from flexinfer_k8s.render.policy import Taint
from flexinfer_k8s.render.workloads import RenderSettings
from flexinfer_kube.kubeapi import NotFound
from flexinfer_kube.resources import (
    GPU_LEASES,
    JOBS,
    MODEL_CACHES,
    MODELS,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PODS,
    Resource,
)
from tests.polling import wait_until
from tests.render.test_caches import mlc_model, tree_hashes

from .harness import (  # noqa: F401  (fixtures)
    Cluster,
    cluster,
    controller,
    crds,
    kubectl,
    model_body,
    now_text,
)

pytestmark = pytest.mark.k8s

PERSISTENT_VOLUMES = Resource("", "v1", "persistentvolumes", "PersistentVolume", namespaced=False)

# Seed 002's ModelCache, as its document prints it (the namespace is the test's).
SEED_002_CACHE = """\
apiVersion: ai.flexinfer/v1alpha1
kind: ModelCache
metadata:
  name: qwen3-8b-abliterated-mlc
  namespace: flexinfer-system
spec:
  storageStrategy: SharedPVC  # SharedPVC, NodeLocal, Memory
  existingClaimName: mlc-models-nfs
  modelPath: Qwen3-8B-abliterated-q4f32_1-MLC
  source: huggingface://huihui-ai/Qwen3-8B-abliterated
  storageSize: 20Gi
"""

# Seed 000's finetune ModelCache, as its document prints it: the source and the training
# parameters are elided there ("# ... source, finetune config ...").
SEED_000_CACHE = """\
apiVersion: ai.flexinfer/v1alpha1
kind: ModelCache
metadata:
  name: qwen3-1p7b-lora
spec:
  # ... source, finetune config ...
  nodeSelector:
    kubernetes.io/hostname: cblevins-5930k   # the lease's Node is derived from this
  finetune:
    # ... training params ...
    gpuLease:
      group: 5930k-textgen     # Model.spec.gpu.shared group to park
      ttlSeconds: 3600         # optional; crash-safety backstop, see below
"""


def get_or_none(c: Cluster, resource: Resource, name: str) -> dict[str, Any] | None:
    try:
        return c.api.get(resource, c.namespace, name)
    except NotFound:
        return None


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return {}


def cache_status(c: Cluster, name: str) -> dict[str, Any]:
    return dict(c.api.get(MODEL_CACHES, c.namespace, name).get("status") or {})


def job_pod(c: Cluster, job: str, *, phase: str = "Running") -> dict[str, Any] | None:
    for pod in c.api.list(PODS, c.namespace).get("items") or []:
        labels = pod["metadata"].get("labels") or {}
        if labels.get("job-name") == job and (pod.get("status") or {}).get("phase") == phase:
            return dict(pod)
    return None


# --- the test's kubelet for one Job pod ----------------------------------------------------


def host_dir_of(c: Cluster, volume: dict[str, Any], node_root: Path) -> Path:
    """The directory behind a pod volume: a claim's PersistentVolume (a `local` one's
    path on the node, under `node_root`, never the real host's); a tenant's pod has
    no host path."""
    assert "hostPath" not in volume, f"a tenant's pod mounts a host path: {volume}"
    claim = c.api.get(PERSISTENT_VOLUME_CLAIMS, c.namespace,
                      volume["persistentVolumeClaim"]["claimName"])
    pv = c.api.get(PERSISTENT_VOLUMES, "", claim["spec"]["volumeName"])
    if "local" in pv["spec"]:
        return node_root / pv["spec"]["local"]["path"].lstrip("/")
    return Path(pv["spec"]["hostPath"]["path"])


def play_pod(c: Cluster, pod: dict[str, Any], *, node_root: Path, log: Path) -> int:
    """Run the pod's one container for real, then write its end as the kubelet would."""
    spec = pod["spec"]
    container = spec["containers"][0]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = []
    for mount in container.get("volumeMounts") or []:
        assert "projected" not in volumes[mount["name"]], "a Job pod got an API token"
        host = host_dir_of(c, volumes[mount["name"]], node_root)
        if mount.get("subPath"):
            host = host / mount["subPath"]
            if not host.exists():
                host.mkdir(parents=True)  # the kubelet makes a missing subPath
        mounts.append((mount["mountPath"], host))

    def mapped(arg: str) -> str:
        if arg == "/dev/termination-log":
            return str(log)
        for inside, host in mounts:
            if arg == inside or arg.startswith(inside + "/"):
                return str(host) + arg[len(inside):]
        return arg

    env = {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}
    log.unlink(missing_ok=True)
    result = subprocess.run([mapped(a) for a in container["command"]], capture_output=True,
                            text=True, timeout=60, env={"PATH": os.environ["PATH"], **env})
    message = log.read_text() if log.exists() else result.stdout[-2048:]
    now = now_text()
    c.api.patch(PODS, c.namespace, pod["metadata"]["name"], {"status": {
        "phase": "Succeeded" if result.returncode == 0 else "Failed",
        "containerStatuses": [{
            "name": container["name"], "image": container["image"], "imageID": "",
            "ready": False, "restartCount": 0, "started": False,
            "state": {"terminated": {
                "exitCode": result.returncode,
                "reason": "Completed" if result.returncode == 0 else "Error",
                "message": message, "startedAt": now, "finishedAt": now,
            }},
        }],
    }}, subresource="status")
    return result.returncode


def pre_bound_claim(c: Cluster, name: str, directory: Path) -> None:
    """A claim bound to a PersistentVolume over `directory`, as a user's NFS share or a
    local-path volume already holding their models (ReadWriteOnce, like local-path)."""
    pv = f"{name}-{c.namespace}"
    c.api.create(PERSISTENT_VOLUMES, "", {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv, "labels": {"flexinfer.test/owner": c.namespace}},
        "spec": {
            "capacity": {"storage": "100Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
            "hostPath": {"path": str(directory)},
            "claimRef": {"namespace": c.namespace, "name": name},
        },
    })
    c.api.create(PERSISTENT_VOLUME_CLAIMS, c.namespace, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv,
                 "resources": {"requests": {"storage": "20Gi"}}},
    })
    wait_until(lambda: (get_or_none(c, PERSISTENT_VOLUME_CLAIMS, name) or {})
               .get("status", {}).get("phase") == "Bound", what=f"claim {name} bound")


@pytest.fixture
def volumes(cluster: Cluster, tmp_path: Path) -> Any:
    yield tmp_path
    for pv in c_list(cluster, PERSISTENT_VOLUMES, f"flexinfer.test/owner={cluster.namespace}"):
        cluster.api.delete(PERSISTENT_VOLUMES, "", pv["metadata"]["name"])


def c_list(c: Cluster, resource: Resource, selector: str) -> list[dict[str, Any]]:
    return list(c.api.list(resource, None, label_selector=selector).get("items") or [])


# --- never destroy what a user has -----------------------------------------------------------


def test_seed_002s_claim_is_adopted_byte_for_byte_and_serves(
    local_cluster: Any, cluster: Cluster, volumes: Path
) -> None:
    c = cluster
    share = volumes / "share"
    mlc_model(share / "Qwen3-8B-abliterated-q4f32_1-MLC")
    (share / "Qwen2.5-7B-q4f32_1-MLC").mkdir()  # another model on the same share
    (share / "Qwen2.5-7B-q4f32_1-MLC" / "params_shard_0.bin").write_bytes(os.urandom(512))
    before = tree_hashes(share)
    pre_bound_claim(c, "mlc-models-nfs", share)
    body = yaml.safe_load(SEED_002_CACHE)
    body["metadata"]["namespace"] = c.namespace
    # Holds the download pod Running until the test has run its container.
    body["metadata"]["annotations"] = {COMPLETE_DELAY_ANNOTATION: "1h"}
    c.api.create(MODEL_CACHES, c.namespace, body)
    name = body["metadata"]["name"]
    with controller(local_cluster, c.namespace):
        for attempt in ("created", "re-created"):
            pod = wait_until(lambda: job_pod(c, f"{name}-download"), what="the download pod")
            assert play_pod(c, pod, node_root=volumes / "node", log=volumes / "log") == 0
            cache = wait_until(
                lambda: (s if (s := cache_status(c, name)).get("ready") else None),
                what=f"the {attempt} cache Ready", timeout=60,
            )
            assert tree_hashes(share) == before, f"the share changed ({attempt})"
            ready = condition({"status": cache}, "Ready")
            assert ready["reason"] == "Adopted"
            assert "mlc-chat-config.json" in ready["message"]
            adopted = condition({"status": cache}, "Adopted")
            assert adopted["status"] == "True"
            assert "never writes" in adopted["message"]
            job = c.api.get(JOBS, c.namespace, f"{name}-download")
            assert job["metadata"]["annotations"]["ai.flexinfer/result"].startswith(
                "flexinfer: adopted")
            if attempt == "created":
                model = model_body("qwen")
                model["spec"]["cache"] = {"modelCacheRef": name}
                c.api.create(MODELS, c.namespace, model)
                c.demand("qwen")
                c.wait_serving("qwen", timeout=90)
                assert tree_hashes(share) == before
                c.api.delete(MODELS, c.namespace, "qwen")
                # A ModelCache deleted and created again over the same copy.
                c.api.delete(MODEL_CACHES, c.namespace, name)
                wait_until(lambda: get_or_none(c, MODEL_CACHES, name) is None
                           and get_or_none(c, JOBS, f"{name}-download") is None,
                           what="the cache and its Job gone", timeout=60)
                c.api.create(MODEL_CACHES, c.namespace, body)
    assert tree_hashes(share) == before


def test_a_claim_of_the_name_flexinfer_would_use_is_a_clash_never_taken_over(
    local_cluster: Any, cluster: Cluster
) -> None:
    c = cluster
    body = {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
            "metadata": {"name": "local", "namespace": c.namespace},
            "spec": {"source": "HF://test/local", "storageStrategy": "NodeLocal",
                     "nodeSelector": {"kubernetes.io/hostname": "kwok-gpu-0"}}}
    name = cache_from_k8s(body).models_volume(dev_policy()).claim_name
    # A user's claim that happens to have that name (with their data behind it).
    c.api.create(PERSISTENT_VOLUME_CLAIMS, c.namespace, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": {"team": "theirs"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-path",
                 "resources": {"requests": {"storage": "1Gi"}}},
    })
    before = c.api.get(PERSISTENT_VOLUME_CLAIMS, c.namespace, name)
    c.api.create(MODEL_CACHES, c.namespace, body)
    with controller(local_cluster, c.namespace):
        status = wait_until(
            lambda: cache_status(c, "local") if condition(
                c.api.get(MODEL_CACHES, c.namespace, "local"), "Ready").get("reason")
            == "NameClash" else None,
            what="the clash reported on the cache")
        assert f"PersistentVolumeClaim {c.namespace}/{name}" in status["message"]
        assert "never taken over" in status["message"]
        assert get_or_none(c, JOBS, "local-download") is None  # nothing else made
        # Nor a volume that the user's claim could be bound to.
        assert not c_list(c, PERSISTENT_VOLUMES, f"ai.flexinfer/namespace={c.namespace}")
    after = c.api.get(PERSISTENT_VOLUME_CLAIMS, c.namespace, name)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["labels"] == {"team": "theirs"}
    assert after["spec"].get("volumeName") in (None, "", before["spec"].get("volumeName"))


def test_a_directory_of_someone_elses_files_is_refused_untouched(
    local_cluster: Any, cluster: Cluster, volumes: Path
) -> None:
    c = cluster
    share = volumes / "share"
    (share / "photos").mkdir(parents=True)
    (share / "photos" / "cat.jpg").write_bytes(os.urandom(1024))
    before = tree_hashes(share)
    pre_bound_claim(c, "nas", share)
    c.api.create(MODEL_CACHES, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
        "metadata": {"name": "w", "annotations": {COMPLETE_DELAY_ANNOTATION: "1h"}},
        "spec": {"source": "HF://org/repo", "existingClaimName": "nas", "modelPath": "photos"},
    })
    with controller(local_cluster, c.namespace):
        pod = wait_until(lambda: job_pod(c, "w-download"), what="the download pod")
        assert play_pod(c, pod, node_root=volumes / "node", log=volumes / "log") == 3
        failed = wait_until(
            lambda: (s if (s := cache_status(c, "w")).get("phase") == "Failed" else None),
            what="the cache Failed", timeout=60)
    assert condition({"status": failed}, "Ready")["reason"] == "ForeignDirectory"
    assert "cat.jpg" in failed["message"] and "spec.modelPath" in failed["message"]
    assert tree_hashes(share) == before
    # The pod failure policy failed the Job at once: no second pod over the same files.
    job = c.api.get(JOBS, c.namespace, "w-download")
    assert job["status"].get("failed") == 1


def test_seed_000s_finetune_cache_applies_and_names_what_to_add(
    local_cluster: Any, cluster: Cluster
) -> None:
    c = cluster
    c.api.create(MODEL_CACHES, c.namespace, yaml.safe_load(SEED_000_CACHE))
    with controller(local_cluster, c.namespace):
        status = wait_until(
            lambda: (s if (s := cache_status(c, "qwen3-1p7b-lora")).get("phase") else None),
            what="the seed's cache to get a status")
    ready = condition({"status": status}, "Ready")
    assert ready["reason"] == "InvalidSpec"
    assert "spec.source" in ready["message"] and "existingClaimName" in ready["message"]
    assert get_or_none(c, PERSISTENT_VOLUME_CLAIMS, "qwen3-1p7b-lora-models") is None
    assert get_or_none(c, JOBS, "qwen3-1p7b-lora-download") is None


# --- a finetune the scheduler cannot place -------------------------------------------------


def base_cache_beside_a_server(c: Cluster) -> None:
    """The ModelCache `ft` a finetune will train from, and the Model `server` of group
    `g` its GPU lease will park."""
    c.api.create(MODEL_CACHES, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
        "metadata": {"name": "ft"},
        # ReadWriteOnce: what the local-path class can bind (as on k3s and kind).
        "spec": {"source": "HF://test/base", "storageSize": "1Gi",
                 "accessModes": ["ReadWriteOnce"]},
    })
    c.add_model("server", group="g")


def serve_and_download(c: Cluster) -> None:
    """Under a running controller: `server` serves and `ft` is downloaded."""
    c.demand("server")
    c.wait_serving("server", timeout=90)
    wait_until(lambda: cache_status(c, "ft").get("ready"), what="ft downloaded", timeout=90)


@pytest.mark.parametrize("blocker", ["no-such-node", "untolerated-taint"])
def test_an_unschedulable_finetune_releases_its_lease_within_the_bound(
    local_cluster: Any, cluster: Cluster, blocker: str
) -> None:
    c = cluster
    bound = timedelta(seconds=3)
    node = f"tainted-{c.namespace}"
    if blocker == "untolerated-taint":
        local_cluster.add_node(KwokNode(name=node, gpus=1))
        c.api.patch(NODES, "", node, {"spec": {"taints": [
            {"key": "flexinfer.test/untolerated", "value": "yes", "effect": "NoSchedule"}]}})
    try:
        base_cache_beside_a_server(c)
        with controller(local_cluster, c.namespace,
                        cache_timeouts=CacheTimeouts(finetune_unschedulable=bound)):
            serve_and_download(c)
            selector = node if blocker == "untolerated-taint" else "no-such-node"
            c.api.patch(MODEL_CACHES, c.namespace, "ft", {"spec": {
                "nodeSelector": {"kubernetes.io/hostname": selector},
                "finetune": {"image": "trainer.local/qlora:1", "gpuLease": {"group": "g"}},
            }})
            words = "node affinity/selector" if blocker == "no-such-node" else "untolerated taint"
            # Whichever the test sees first (no timing assumed): the scheduler's words
            # while the lease still holds, or the finetune already given up.
            said = wait_until(
                lambda: (s if "cannot be scheduled" in (s := cache_status(c, "ft"))
                         .get("message", "") or s.get("phase") == "Failed" else None),
                what="the cache to say the scheduler's message", timeout=60)
            if said.get("phase") == "Finetuning":
                assert words in said["message"]
                assert "released at" in said["message"]
            failed = wait_until(
                lambda: (s if (s := cache_status(c, "ft")).get("phase") == "Failed" else None),
                what="the finetune given up", timeout=bound.total_seconds() + 60)
            assert condition({"status": failed}, "Ready")["reason"] == "FinetuneUnschedulable"
            assert words in failed["message"]
            assert "--finetune-unschedulable-timeout" in failed["message"]
            assert "GPU lease ft-gpu-lease released" in failed["message"]
            wait_until(lambda: get_or_none(c, GPU_LEASES, "ft-gpu-lease") is None,
                       what="the lease released")
            job = c.api.get(JOBS, c.namespace, "ft-finetune")
            assert job["spec"]["suspend"] is True
            # Serving comes back: the group is no longer parked.
            c.demand("server")
            c.wait_serving("server", timeout=90)
    finally:
        if blocker == "untolerated-taint":
            c.api.delete(NODES, "", node)


# --- deleting a node-bound cache ------------------------------------------------------------


HOST_FILE = f"{tempfile.gettempdir()}/local.gguf"


def test_a_deleted_node_local_cache_is_cleaned_on_its_node_then_goes(
    local_cluster: Any, cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    taint = {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
    c.api.create(MODEL_CACHES, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
        "metadata": {"name": "local"},
        # Under the temporary directory: a host path the local cluster's policy allows.
        "spec": {"source": f"file://{HOST_FILE}", "storageStrategy": "Memory",
                 "nodeSelector": {"kubernetes.io/hostname": "kwok-gpu-0"},
                 "tolerations": [taint],
                 "podAnnotations": {COMPLETE_DELAY_ANNOTATION: "1h"}},
    })
    with controller(local_cluster, c.namespace):
        wait_until(lambda: "ai.flexinfer/node-cleanup" in (
            c.api.get(MODEL_CACHES, c.namespace, "local")["metadata"].get("finalizers") or []),
            what="the cleanup finalizer")
        node_root = tmp_path / "kwok-gpu-0"
        pod = wait_until(lambda: job_pod(c, "local-download"), what="the download pod")
        assert taint in pod["spec"]["tolerations"]
        # The download writes the node directory for real (under the test's node root).
        on_node = node_root / HOST_FILE.lstrip("/")
        on_node.parent.mkdir(parents=True)
        on_node.write_bytes(b"GGUF")
        assert play_pod(c, pod, node_root=node_root, log=tmp_path / "log") == 0
        wait_until(lambda: cache_status(c, "local").get("ready"), what="the download over",
                   timeout=60)
        copy = node_root / f"var/lib/flexinfer/models/{c.namespace}/local"
        assert (copy / "local.gguf").read_bytes() == b"GGUF"
        # What a serving pod's flash loader would have left: flexinfer's RAM copy.
        ram = node_root / f"dev/shm/flexinfer/{c.namespace}/local"
        ram.mkdir(parents=True)
        (ram / "model.gguf").write_bytes(b"w")
        (ram / ".flexinfer-complete").write_text("HF://test/local\n")
        c.api.delete(MODEL_CACHES, c.namespace, "local")
        cleanup = wait_until(lambda: job_pod(c, "local-cleanup"), what="the cleanup pod")
        assert cleanup["spec"]["nodeName"] == "kwok-gpu-0"
        assert taint in cleanup["spec"]["tolerations"]
        assert play_pod(c, cleanup, node_root=node_root, log=tmp_path / "log") == 0
        wait_until(lambda: get_or_none(c, MODEL_CACHES, "local") is None,
                   what="the cache gone once cleaned", timeout=60)
    assert not ram.exists()
    assert not copy.exists()
    events = [e for e in c.events("local") if e["reason"] == "CleanedUp"]
    assert events and "removed" in events[0]["message"]


def test_a_cleanup_that_cannot_run_lets_the_cache_go_within_the_bound(
    local_cluster: Any, cluster: Cluster
) -> None:
    c = cluster
    node = f"doomed-{c.namespace}"
    local_cluster.add_node(KwokNode(name=node, gpus=1))
    try:
        c.api.create(MODEL_CACHES, c.namespace, {
            "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
            "metadata": {"name": "local"},
            "spec": {"source": "HF://test/local", "storageStrategy": "NodeLocal",
                     "nodeSelector": {"kubernetes.io/hostname": node}},
        })
        with controller(local_cluster, c.namespace,
                        cache_timeouts=CacheTimeouts(cleanup=timedelta(seconds=3))):
            wait_until(lambda: cache_status(c, "local").get("ready"), what="downloaded",
                       timeout=60)
            # The node goes away under the cache: the cleanup pod has nowhere to run.
            c.api.patch(NODES, "", node, {"spec": {"taints": [
                {"key": "flexinfer.test/gone", "value": "yes", "effect": "NoSchedule"}]}})
            c.api.delete(MODEL_CACHES, c.namespace, "local")
            wait_until(lambda: get_or_none(c, MODEL_CACHES, "local") is None,
                       what="the cache released after the bound", timeout=90)
        warnings = [e for e in c.events("local") if e["reason"] == "CleanupFailed"]
        assert warnings and warnings[0]["type"] == "Warning"
        assert "rm -rf /var/lib/flexinfer/models/" in warnings[0]["message"]
    finally:
        c.api.delete(NODES, "", node)


# --- storage --------------------------------------------------------------------------------


def test_a_pending_claim_says_the_binders_words_and_a_fixed_spec_rebinds(
    local_cluster: Any, cluster: Cluster
) -> None:
    c = cluster
    c.api.create(MODEL_CACHES, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
        "metadata": {"name": "w"},
        "spec": {"source": "HF://test/w", "storageSize": "1Gi",
                 "accessModes": ["ReadWriteOnce"], "storageClassName": "no-such-class"},
    })
    with controller(local_cluster, c.namespace):
        pending = wait_until(
            lambda: (s if "no-such-class" in (s := cache_status(c, "w")).get("message", "")
                     else None),
            what="the claim's own words on the cache", timeout=60)
        assert condition({"status": pending}, "Ready")["reason"] == "ClaimPending"
        assert "spec.storageClassName" in pending["message"]
        warnings = wait_until(lambda: [e for e in c.events("w") if e["type"] == "Warning"],
                              what="a Warning Event", timeout=30)
        assert warnings[0]["reason"] == "ClaimPending"
        # The fix the message names: the Pending claim (empty) is made again with it.
        c.api.patch(MODEL_CACHES, c.namespace, "w", {"spec": {"storageClassName": "local-path"}})
        wait_until(lambda: (get_or_none(c, PERSISTENT_VOLUME_CLAIMS, "w-models") or {})
                   .get("metadata", {}).get("deletionTimestamp"),
                   what="the Pending claim deleted", timeout=30)
        wait_until(lambda: job_pod(c, "w-download", phase="Pending") is None
                   and get_or_none(c, JOBS, "w-download") is None,
                   what="its download Job and pod gone (they held the claim)", timeout=30)
        # This control plane runs no pvc-protection controller: play it (no pod uses the
        # claim any more, so it would now let it go).
        c.api.patch(PERSISTENT_VOLUME_CLAIMS, c.namespace, "w-models",
                    {"metadata": {"finalizers": None}})
        ready = wait_until(lambda: (s if (s := cache_status(c, "w")).get("ready") else None),
                           what="the cache Ready on a bound claim", timeout=90)
        assert ready["phase"] == "Ready"
        claim = c.api.get(PERSISTENT_VOLUME_CLAIMS, c.namespace, "w-models")
        assert claim["spec"]["storageClassName"] == "local-path"
        assert ready["path"] == "pvc://w-models/w"


RESOURCE_QUOTAS = Resource("", "v1", "resourcequotas", "ResourceQuota")


def no_pods_quota(c: Cluster) -> None:
    """A ResourceQuota of no pods: the API server's quota admission refuses every new
    pod ("exceeded quota"), which the Job controller reports as `FailedCreate`. This
    control plane runs no quota controller, so the test writes the quota's status (hard
    and used) as that controller would: admission reads only the status."""
    hard = {"pods": "0"}
    c.api.create(RESOURCE_QUOTAS, c.namespace, {
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "no-pods"}, "spec": {"hard": hard}})
    c.api.patch(RESOURCE_QUOTAS, c.namespace, "no-pods",
                {"status": {"hard": hard, "used": {"pods": "0"}}}, subresource="status")


def test_a_download_whose_pod_the_api_server_refuses_says_so_not_downloading(
    local_cluster: Any, cluster: Cluster
) -> None:
    # The Job stays active with no pod for ever; its FailedCreate Event is the only
    # place the refusal is said. The cache quotes it instead of "is copying".
    c = cluster
    no_pods_quota(c)
    c.api.create(MODEL_CACHES, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
        "metadata": {"name": "q"},
        "spec": {"source": "HF://test/q", "storageSize": "1Gi",
                 "accessModes": ["ReadWriteOnce"]},
    })
    with controller(local_cluster, c.namespace):
        refused = wait_until(
            lambda: (s if (s := cache_status(c, "q")).get("phase") == "Pending"
                     and "FailedCreate" in s.get("message", "") else None),
            what="the cache to quote the Job's FailedCreate", timeout=90)
        assert condition({"status": refused}, "Ready")["reason"] == "JobPodRefused"
        assert "q-download cannot create its pod" in refused["message"]
        assert "quota" in refused["message"]
        warnings = wait_until(
            lambda: [e for e in c.events("q") if e["reason"] == "JobPodRefused"],
            what="a Warning Event on the cache", timeout=30)
        assert warnings[0]["type"] == "Warning"


def test_a_finetune_whose_pod_the_api_server_refuses_releases_its_lease_within_the_bound(
    local_cluster: Any, cluster: Cluster
) -> None:
    # Without the bound, the lease would park the group until the Job's deadline while
    # no training pod can even be created.
    c = cluster
    bound = timedelta(seconds=3)
    base_cache_beside_a_server(c)
    with controller(local_cluster, c.namespace,
                    cache_timeouts=CacheTimeouts(finetune_unschedulable=bound)):
        serve_and_download(c)
        no_pods_quota(c)
        c.api.patch(MODEL_CACHES, c.namespace, "ft", {"spec": {
            "finetune": {"image": "trainer.local/qlora:1", "gpuLease": {"group": "g"}},
        }})
        failed = wait_until(
            lambda: (s if (s := cache_status(c, "ft")).get("phase") == "Failed" else None),
            what="the finetune given up", timeout=bound.total_seconds() + 90)
        assert condition({"status": failed}, "Ready")["reason"] == "FinetuneUnschedulable"
        assert "the API server refuses its pod: FailedCreate" in failed["message"]
        assert "GPU lease ft-gpu-lease released" in failed["message"]
        wait_until(lambda: get_or_none(c, GPU_LEASES, "ft-gpu-lease") is None,
                   what="the lease released")
        assert c.api.get(JOBS, c.namespace, "ft-finetune")["spec"]["suspend"] is True


def test_download_resources_the_api_server_refuses_are_a_condition_naming_the_field(
    local_cluster: Any, cluster: Cluster
) -> None:
    c = cluster
    # A request above the default 4Gi limit without a limit of its own: the Job is invalid.
    c.api.create(MODEL_CACHES, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
        "metadata": {"name": "big"},
        "spec": {"source": "HF://test/big", "storageSize": "1Gi",
                 "downloadResources": {"requests": {"memory": "8Gi"}}},
    })
    with controller(local_cluster, c.namespace):
        failed = wait_until(
            lambda: (s if (s := cache_status(c, "big")).get("phase") == "Failed" else None),
            what="the cache Failed", timeout=60)
    assert condition({"status": failed}, "Ready")["reason"] == "InvalidSpec"
    assert "spec.downloadResources" in failed["message"]
    assert "memory" in failed["message"]
    assert get_or_none(c, JOBS, "big-download") is None


def test_a_download_on_a_tainted_node_says_so_and_runs_once_tolerated(
    local_cluster: Any, cluster: Cluster
) -> None:
    c = cluster
    node = f"gpu-{c.namespace}"
    local_cluster.add_node(KwokNode(name=node, gpus=1))
    # A taint of the lab's own, which the controller's policy does not list yet (the GPU
    # nodes' dedicated=gpu is tolerated without asking, and a tenant may tolerate only
    # what the policy lists).
    lab = Taint("lab", "reserved", "NoSchedule")
    c.api.patch(NODES, "", node, {"spec": {"taints": [
        {"key": lab.key, "value": lab.value, "effect": lab.effect}]}})
    try:
        c.api.create(MODEL_CACHES, c.namespace, {
            "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
            "metadata": {"name": "local"},
            "spec": {"source": "HF://test/local", "storageStrategy": "NodeLocal",
                     "nodeSelector": {"kubernetes.io/hostname": node}},
        })
        with controller(local_cluster, c.namespace):
            stuck = wait_until(
                lambda: (s if "untolerated taint" in (s := cache_status(c, "local"))
                         .get("message", "") else None),
                what="the scheduler's words on the cache", timeout=60)
            assert stuck["phase"] == "Downloading"
            first = c.api.get(JOBS, c.namespace, "local-download")["metadata"]["uid"]
        # The administrator lists the lab's taint among the GPU nodes' (gpuNodeTaints):
        # the stuck Job is made again with its toleration, and runs.
        policy = dev_policy()
        listed = attrs.evolve(policy, gpu_node_taints=(*policy.gpu_node_taints, lab))
        with controller(local_cluster, c.namespace, settings=RenderSettings(policy=listed)):
            wait_until(lambda: cache_status(c, "local").get("ready"),
                       what="the download run on the tainted node", timeout=90)
            job = c.api.get(JOBS, c.namespace, "local-download")
            assert job["metadata"]["uid"] != first  # made again with the toleration
            tolerations = job["spec"]["template"]["spec"]["tolerations"]
            assert lab.toleration() in tolerations
            assert tolerations[0]["key"] == "dedicated"  # the GPU nodes' own, in order
    finally:
        c.api.delete(NODES, "", node)


def test_a_volume_whose_claim_was_deleted_binds_the_claim_made_again(
    local_cluster: Any, cluster: Cluster
) -> None:
    """A namespace's claims gone (as when it is deleted and made again): the `local`
    volume is Released, keeping the old claim's uid; the controller lets the claim it
    makes again bind the same volume, which it never deletes."""
    c = cluster
    body = {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
            "metadata": {"name": "again", "namespace": c.namespace},
            "spec": {"source": "HF://test/again", "storageStrategy": "NodeLocal",
                     "nodeSelector": {"kubernetes.io/hostname": "kwok-gpu-0"}}}
    wanted = cache_from_k8s(body).models_volume(dev_policy())
    c.api.create(MODEL_CACHES, c.namespace, body)
    with controller(local_cluster, c.namespace):
        wait_until(lambda: cache_status(c, "again").get("ready"), what="downloaded",
                   timeout=90)
    first = c.api.get(PERSISTENT_VOLUMES, "", wanted.volume_name)
    # What deleting the namespace does: its pods go, then its claims.
    c.api.delete(JOBS, c.namespace, "again-download")
    wait_until(lambda: not c.api.list(PODS, c.namespace).get("items"), what="pods gone")
    c.api.delete(PERSISTENT_VOLUME_CLAIMS, c.namespace, wanted.claim_name)
    # The local cluster runs no pvc-protection controller: its work, by hand.
    c.api.patch(PERSISTENT_VOLUME_CLAIMS, c.namespace, wanted.claim_name,
                {"metadata": {"finalizers": None}})
    wait_until(lambda: c.api.get(PERSISTENT_VOLUMES, "", wanted.volume_name)["status"]
               .get("phase") == "Released", what="the volume Released")
    with controller(local_cluster, c.namespace):
        wait_until(lambda: (get_or_none(c, PERSISTENT_VOLUME_CLAIMS, wanted.claim_name) or {})
                   .get("status", {}).get("phase") == "Bound", what="the new claim bound",
                   timeout=60)
    again = c.api.get(PERSISTENT_VOLUMES, "", wanted.volume_name)
    assert again["metadata"]["uid"] == first["metadata"]["uid"]
    claim = c.api.get(PERSISTENT_VOLUME_CLAIMS, c.namespace, wanted.claim_name)
    assert again["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
    assert claim["metadata"]["uid"] != first["spec"]["claimRef"]["uid"]
