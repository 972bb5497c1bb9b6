"""What a tenant may ask for under the administrator's policy, and what every pod gets.

The expectations are the rules of docs/security.md written out by hand; each refusal
must name the field, the value and the policy field that would allow it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.cache import CacheImages, download_job
from flexinfer_k8s.render.cache_dir import DirResult
from flexinfer_k8s.render.pod_security import NON_ROOT_UID, secure_job
from flexinfer_k8s.render.policy import AdminPolicy, Taint, admin_policy_from_yaml
from flexinfer_k8s.render.tenant_policy import (
    cache_within_policy,
    check_finetune,
    check_workload,
    image_repository,
)
from flexinfer_k8s.render.workload import workload_from_model, workload_from_model_deployment
from flexinfer_k8s.render.workloads import RenderSettings, render_workload
from tests.render.host_dirs import host_dir
from tests.render.test_caches import run_download

DEFAULT = RenderSettings()


def model(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"backend": "vllm", "source": "HF://org/repo"}
    body.update(spec)
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
            "metadata": {"name": "m", "namespace": "team-a", "uid": "u1"}, "spec": body}


def model_cache(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"source": "HF://org/repo", "storageStrategy": "NodeLocal",
                            "nodeSelector": {"kubernetes.io/hostname": "gpu-1"}}
    body.update(spec)
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
            "metadata": {"name": "c", "namespace": "team-a", "uid": "u2"}, "spec": body}


def render(obj: dict[str, Any], settings: RenderSettings = DEFAULT) -> Any:
    return render_workload(workload_from_model(obj), cache=None, settings=settings)


def refused(obj: dict[str, Any], settings: RenderSettings = DEFAULT) -> InvalidFieldError:
    with pytest.raises(InvalidFieldError) as raised:
        render(obj, settings)
    return raised.value


# --- host paths ----------------------------------------------------------------------


@pytest.mark.parametrize("source", [
    "file:///.",                                   # the node's root
    "file:///run/containerd/containerd.sock",      # the runtime's socket
    "file:///etc/kubernetes/pki",                  # the control plane's keys
    "file:///var/lib/flexinfer/models/../../../etc",
])
def test_a_host_path_outside_the_allowed_prefixes_is_refused(source: str) -> None:
    error = refused(model(backend="llama-cpp", source=source))
    assert error.field == "spec.source"
    assert error.value == source
    assert "hostPathPrefixes" in str(error)
    assert "/var/lib/flexinfer/models, /dev/shm/flexinfer" in str(error)


def test_another_namespaces_cache_directory_is_not_a_tenants_to_read() -> None:
    for source in ("file:///var/lib/flexinfer/models/team-b/weights/x.gguf",
                   "file:///var/lib/flexinfer/models", "file:///dev/shm/flexinfer/team-b"):
        error = refused(model(backend="llama-cpp", source=source))
        assert error.field == "spec.source"
        assert "/var/lib/flexinfer/models/team-a/" in str(error) or (
            "/dev/shm/flexinfer/team-a/" in str(error))


def test_a_host_path_is_reached_through_its_namespace_root_or_the_admin_prefix() -> None:
    def source(rendered: Any) -> tuple[str, str, str]:
        pod_spec = rendered.deployment["spec"]["template"]["spec"]
        volume = next(v for v in pod_spec["volumes"] if v["name"] == "model-source")
        mount = next(m for m in pod_spec["containers"][0]["volumeMounts"]
                     if m["name"] == "model-source")
        (needed,) = rendered.host_volumes
        return host_dir(volume, mount, rendered.host_volumes), needed.root, mount["subPath"]

    rendered = render(model(backend="llama-cpp",
                            source="file:///var/lib/flexinfer/models/team-a/qwen.gguf"))
    # The volume is the namespace's own root, never the whole cache directory.
    assert source(rendered) == ("/var/lib/flexinfer/models/team-a/qwen.gguf",
                                "/var/lib/flexinfer/models/team-a", "qwen.gguf")
    directory = render(model(backend="vllm", source="file:///srv/models/qwen"),
                       RenderSettings(policy=AdminPolicy(host_path_prefixes=("/srv/models",))))
    assert source(directory) == ("/srv/models/qwen", "/srv/models", "qwen")


def test_a_caches_file_source_and_a_finetune_dataset_obey_the_same_prefixes() -> None:
    with pytest.raises(InvalidFieldError) as raised:
        cache_within_policy(model_cache(source="file:///root/.ssh"), AdminPolicy(), images=())
    assert (raised.value.field, raised.value.value) == ("spec.source", "file:///root/.ssh")
    cache = cache_within_policy(model_cache(), AdminPolicy(), images=())
    with pytest.raises(InvalidFieldError) as raised:
        check_finetune({"dataset": "file:///etc/shadow"}, cache, AdminPolicy(), images=())
    assert raised.value.field == "spec.finetune.dataset"
    check_finetune({"dataset": "file:///var/lib/flexinfer/models/team-a/data.jsonl"}, cache,
                   AdminPolicy(), images=())


def test_every_download_removes_symbolic_links_before_its_marker(tmp_path: Path) -> None:
    """A link copied into a cache directory (here from a tenant's directory holding
    `root -> /`) would be followed on the node by a later host path through it."""
    (tmp_path / "src" / "models").mkdir(parents=True)
    (tmp_path / "src" / "models" / "model.gguf").write_bytes(b"GGUF")
    (tmp_path / "src" / "models" / "root").symlink_to("/")
    target = tmp_path / "copy"
    result, report = run_download("file:///models/models", target, tmp_path)
    assert result.returncode == 0, result.stderr
    assert report.result is DirResult.DOWNLOADED
    assert (target / "models" / "model.gguf").read_bytes() == b"GGUF"
    assert not (target / "models" / "root").is_symlink()
    assert (target / ".flexinfer-complete").exists()


# --- images --------------------------------------------------------------------------


def test_images_come_from_the_administrators_prefixes_or_flexinfers_own_repositories() -> None:
    error = refused(model(image="evil.example/miner:latest"))
    assert (error.field, error.value) == ("spec.image", "evil.example/miner:latest")
    assert "imagePrefixes" in str(error) and "docker.io/vllm/vllm-openai" in str(error)
    # Another tag or a digest of a repository flexinfer renders by default is fine.
    for image in ("vllm/vllm-openai:v0.9.2", "docker.io/vllm/vllm-openai@sha256:0123",
                  "rocm/vllm:rocm6.4"):
        assert render(model(image=image)).deployment["spec"]["template"]["spec"][
            "containers"][0]["image"] == image
    allowed = RenderSettings(policy=AdminPolicy(image_prefixes=("registry.local/",)))
    render(model(image="registry.local/vllm:mine"), allowed)
    # An administrator's --image is a repository flexinfer renders.
    render(model(backend="mlc-llm", source="file:///var/lib/flexinfer/models/team-a/q",
                 image="harbor.lan/mlc/server:2"),
           RenderSettings(images={("mlc-llm", None): "harbor.lan/mlc/server:1"}))


def test_image_repositories_spell_out_docker_hubs_implicit_parts() -> None:
    assert image_repository("busybox:1.36") == "docker.io/library/busybox"
    assert image_repository("ollama/ollama@sha256:ab") == "docker.io/ollama/ollama"
    assert image_repository("localhost:5000/a/b:1") == "localhost:5000/a/b"
    assert image_repository("ghcr.io/ggml-org/llama.cpp:server") == "ghcr.io/ggml-org/llama.cpp"


def test_download_and_trainer_images_are_checked_too() -> None:
    with pytest.raises(InvalidFieldError) as raised:
        cache_within_policy(model_cache(downloadImage="attacker/tools:1"), AdminPolicy(),
                            images=DEFAULT.rendered_images())
    assert raised.value.field == "spec.downloadImage"
    cache_within_policy(model_cache(downloadImage="busybox:1.37"), AdminPolicy(),
                        images=DEFAULT.rendered_images())
    cache = cache_within_policy(model_cache(), AdminPolicy(), images=())
    with pytest.raises(InvalidFieldError) as raised:
        check_finetune({"image": "attacker/trainer"}, cache, AdminPolicy(), images=())
    assert raised.value.field == "spec.finetune.image"
    check_finetune({"image": "lab/trainer:2"}, cache, AdminPolicy(),
                   images=RenderSettings(finetune_image="lab/trainer:1").rendered_images())


# --- scheduling ----------------------------------------------------------------------


@pytest.mark.parametrize(("toleration", "why"), [
    ({"operator": "Exists"}, "has no key"),
    ({"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
      "effect": "NoSchedule"}, "control plane"),
    ({"key": "dedicated", "operator": "Exists"}, "did not list"),
    ({"key": "dedicated", "value": "infra", "effect": "NoSchedule"}, "did not list"),
    ({"key": "dedicated", "value": "gpu", "effect": "NoExecute"}, "did not list"),
])
def test_only_the_gpu_nodes_taints_may_be_tolerated(toleration: dict[str, str], why: str) -> None:
    error = refused(model(tolerations=[toleration]))
    assert error.field == "spec.tolerations[0]"
    assert why in str(error)


def test_the_listed_gpu_taint_is_tolerated_with_or_without_its_effect() -> None:
    for toleration in ({"key": "dedicated", "operator": "Equal", "value": "gpu",
                        "effect": "NoSchedule"}, {"key": "dedicated", "value": "gpu"}):
        pod = render(model(tolerations=[toleration])).deployment["spec"]["template"]["spec"]
        assert toleration in pod["tolerations"]


def test_node_selector_keys_are_the_administrators() -> None:
    error = refused(model(nodeSelector={"node-role.kubernetes.io/control-plane": ""}))
    assert error.field == "spec.nodeSelector[node-role.kubernetes.io/control-plane]"
    assert "nodeSelectorKeys" in str(error)
    render(model(nodeSelector={"kubernetes.io/hostname": "gpu-1",
                               "flexinfer.ai/gpu.vendor": "AMD"}))


def test_no_rendered_pod_lands_on_a_control_plane_node_unless_the_administrator_says() -> None:
    pod = render(model()).deployment["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert {"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"} in term[
        "matchExpressions"]
    assert {"key": "node-role.kubernetes.io/master", "operator": "DoesNotExist"} in term[
        "matchExpressions"]
    single = RenderSettings(policy=admin_policy_from_yaml("allowControlPlaneNodes: true"))
    assert "affinity" not in render(model(), single).deployment["spec"]["template"]["spec"]


# --- pod metadata --------------------------------------------------------------------


def test_pod_labels_and_annotations_need_the_administrators_keys() -> None:
    error = refused(model(podLabels={"app": "postgres"}))  # another Service's selector
    assert (error.field, error.value) == ("spec.podLabels[app]", "postgres")
    assert "podLabelKeys" in str(error)
    error = refused(model(podAnnotations={"sidecar.istio.io/inject": "false"}))
    assert error.field == "spec.podAnnotations[sidecar.istio.io/inject]"
    assert "podAnnotationKeys" in str(error)
    allowed = RenderSettings(policy=AdminPolicy(pod_label_keys=("team",),
                                                pod_annotation_keys=("example.com/*",)))
    template = render(model(podLabels={"team": "a"}, podAnnotations={"example.com/x": "1"}),
                      allowed).deployment["spec"]["template"]["metadata"]
    assert template["labels"]["team"] == "a"
    assert template["annotations"] == {"example.com/x": "1"}


@pytest.mark.parametrize(("field", "key"), [
    ("podLabels", "ai.flexinfer/group"),              # would join another shared group
    ("podLabels", "app.kubernetes.io/managed-by"),
    ("podLabels", "pod-template-hash"),
    ("podAnnotations", "container.apparmor.security.beta.kubernetes.io/server"),
    ("podAnnotations", "demand.ai.flexinfer/x"),
])
def test_flexinfers_and_kubernetes_keys_are_never_a_tenants(field: str, key: str) -> None:
    everything = RenderSettings(policy=AdminPolicy(pod_label_keys=("*",),
                                                   pod_annotation_keys=("*",)))
    error = refused(model(**{field: {key: "x"}}), everything)
    assert error.field == f"spec.{field}[{key}]"
    assert "never a tenant's" in str(error)


# --- what every pod gets -------------------------------------------------------------


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*(pod.get("initContainers") or []), *pod["containers"]]


def test_every_serving_container_is_hardened_and_gets_no_token() -> None:
    for obj in (model(backend="ollama", source="ollama://llama3.2:1b"), model()):
        pod = render(obj).deployment["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in containers(pod):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            assert "privileged" not in context


def test_llama_cpp_runs_as_a_non_root_user_and_vllm_as_its_image_says() -> None:
    llama = render(model(backend="llama-cpp",
                         source="file:///var/lib/flexinfer/models/team-a/q.gguf"))
    (server,) = llama.deployment["spec"]["template"]["spec"]["containers"]
    assert server["securityContext"]["runAsNonRoot"] is True
    assert server["securityContext"]["runAsUser"] == NON_ROOT_UID != 0
    assert server["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    (vllm,) = render(model()).deployment["spec"]["template"]["spec"]["containers"]
    assert "runAsNonRoot" not in vllm["securityContext"]


def test_writers_keep_only_the_capabilities_baseline_allows() -> None:
    baseline = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
    spec = cache_within_policy(model_cache(), AdminPolicy(), images=())
    job = secure_job(download_job(spec, CacheImages()), policy=AdminPolicy(),
                     writers=["download"])
    pod = job["spec"]["template"]["spec"]
    (download,) = pod["containers"]
    assert download["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert set(download["securityContext"]["capabilities"]["add"]) <= baseline
    assert pod["automountServiceAccountToken"] is False


def test_the_network_policy_admits_only_the_proxy_to_port_8000() -> None:
    rendered = render(model())
    policy = rendered.network_policy
    assert policy["metadata"]["name"] == "m"
    assert policy["metadata"]["ownerReferences"] == rendered.deployment["metadata"][
        "ownerReferences"]
    assert policy["spec"]["podSelector"] == {"matchLabels": rendered.service["spec"]["selector"]}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{
        "from": [{
            "namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": "flexinfer-system"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "flexinfer-proxy"}},
        }],
        "ports": [{"protocol": "TCP", "port": 8000}],
    }]
    own = admin_policy_from_yaml(
        "backendIngressFrom: [{namespaceSelector: {matchLabels: {team: ai}}}]")
    ingress = render(model(), RenderSettings(policy=own)).network_policy["spec"]["ingress"]
    assert ingress[0]["from"] == [{"namespaceSelector": {"matchLabels": {"team": "ai"}}}]


# --- the policy file -----------------------------------------------------------------


@pytest.mark.parametrize(("text", "field"), [
    ("gpuNodeTaints: [{key: node-role.kubernetes.io/control-plane}]", "gpuNodeTaints[0].key"),
    ("allowControlPlaneNodes: yes please", "allowControlPlaneNodes"),
    ("backendIngressFrom: [{}]", "backendIngressFrom[0]"),
    ("backendIngressFrom: [{ports: [80]}]", "backendIngressFrom[0]"),
])
def test_a_bad_policy_names_its_field(text: str, field: str) -> None:
    with pytest.raises(InvalidFieldError) as raised:
        admin_policy_from_yaml(text)
    assert raised.value.field == field


# --- the manifests users start from ---------------------------------------------------

# The Model, ModelDeployments and ModelCaches of flexinfer's first user documents (GPU
# sharing, the CRD reference, RAM caches, node placement), as users copy them.
USER_DOCUMENTS = """
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {name: qwen3-8b}
spec:
  backend: mlc-llm
  source: HF://mlc-ai/Qwen3-8B-q4f16_1-MLC
  gpu: {shared: homelab-gpu, priority: 100}
---
apiVersion: ai.flexinfer/v1alpha1
kind: ModelDeployment
metadata:
  name: qwen3-8b-abliterated
  labels: {app: qwen3-abliterated, backend: mlc-llm, gpu-vendor: amd}
spec:
  backend: mlc-llm
  model: Qwen3-8B-abliterated-q4f32_1-MLC
  replicas: 1
  mlcllm:
    mode: server
    modelLibPath: /models/Qwen3-8B-abliterated-q4f32_1-MLC/lib_rocm_gfx1100.so
    gpuMemoryBytes: 23000000000
    jitPolicy: "OFF"
    overrides: {prefillChunkSize: 512, maxTotalSeqLength: 32768}
  resources:
    requests: {amd.com/gpu: "1", cpu: "4", memory: 16Gi}
    limits: {amd.com/gpu: "1", cpu: "8", memory: 24Gi}
  nodeSelector: {kubernetes.io/hostname: cblevins-5930k}
  healthCheck: {initialDelaySeconds: 120, periodSeconds: 30, timeoutSeconds: 10,
                failureThreshold: 3}
---
apiVersion: ai.flexinfer/v1alpha1
kind: ModelDeployment
metadata: {name: qwen3-32b}
spec:
  backend: mlc-llm
  model: Qwen3-32B-q4f16_1-MLC
  nodeSelector: {flexinfer.ai/gpu.vendor: AMD}
  mlcllm: {mode: local}
---
apiVersion: ai.flexinfer/v1alpha1
kind: ModelCache
metadata: {name: qwen3-8b-abliterated-mlc}
spec:
  storageStrategy: SharedPVC
  existingClaimName: mlc-models-nfs
  modelPath: Qwen3-8B-abliterated-q4f32_1-MLC
  source: huggingface://huihui-ai/Qwen3-8B-abliterated
  storageSize: 20Gi
---
apiVersion: ai.flexinfer/v1alpha1
kind: ModelCache
metadata: {name: qwen3-8b-ram}
spec:
  source: HF://mlc-ai/Qwen3-8B-abliterated-q4f16_1-MLC
  storageStrategy: Memory
  nodeSelector: {kubernetes.io/hostname: gpu-node-1}
---
apiVersion: ai.flexinfer/v1alpha1
kind: ModelCache
metadata: {name: qwen3-1p7b-lora}
spec:
  source: HF://Qwen/Qwen3-1.7B
  storageStrategy: NodeLocal
  nodeSelector: {kubernetes.io/hostname: cblevins-5930k}
  finetune:
    gpuLease: {group: 5930k-textgen, ttlSeconds: 3600}
"""


def test_the_manifests_users_start_from_stay_within_the_default_policy() -> None:
    # mlc-llm has no default image: the administrator names one with --image.
    settings = RenderSettings(images={("mlc-llm", None): "registry.lab/mlc-llm:rocm"})
    for document in yaml.safe_load_all(USER_DOCUMENTS):
        document["metadata"].update(namespace="flexinfer-system", uid="u")
        if document["kind"] == "ModelCache":
            cache_within_policy(document, settings.policy, images=settings.rendered_images())
            continue
        read = workload_from_model if document["kind"] == "Model" else (
            workload_from_model_deployment)
        # Only the policy: mlc-llm's own needs (a local model) are not this test's.
        check_workload(read(document), settings.policy, images=settings.rendered_images())


def test_the_default_policy_is_what_the_docs_say() -> None:
    policy = AdminPolicy()
    assert policy.gpu_node_taints == (Taint("dedicated", "gpu", "NoSchedule"),)
    assert policy.host_path_prefixes == ("/var/lib/flexinfer/models", "/dev/shm/flexinfer")
    assert policy.node_selector_keys == ("kubernetes.io/hostname", "flexinfer.ai/*")
    assert (policy.image_prefixes, policy.pod_label_keys, policy.pod_annotation_keys) == (
        (), (), ())
    assert policy.allow_control_plane_nodes is False
    assert policy.host_cache_max_size == "200Gi"
