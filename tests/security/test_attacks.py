"""Each attack of a tenant on the cluster, tried and refused, on the local control plane.

The tenant is a ServiceAccount whose only rights are to create, read and change
Models, ModelDeployments and ModelCaches in its own namespace (a Role). The
controller runs as deploy/'s ServiceAccount (impersonated: its RBAC and its admission
policies decide), under deploy/policy.yaml, the administrator's policy it ships with.
Each test asserts the condition (or the admission error) that refuses the attack, and
that nothing was rendered for it. Where the controller's check is the first layer,
the rendered manifest it would have written without that check is then sent as the
controller: the admission policy refuses it too (the second layer).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from flexinfer_devcluster.localcluster import FAIL_ANNOTATION, KwokNode, LocalCluster
from flexinfer_devcluster.policy import dev_policy
from flexinfer_k8s.render.local_volume import persistent_volume
from flexinfer_k8s.render.policy import AdminPolicy, admin_policy_from_yaml
from flexinfer_k8s.render.workload import workload_from_model
from flexinfer_k8s.render.workloads import RenderSettings, render_workload
from flexinfer_kube.kubeapi import JSON, KubeApi, NotFound, Rejected, new_api_client
from flexinfer_kube.resources import (
    DEPLOYMENTS,
    EVENTS,
    JOBS,
    MODEL_CACHES,
    MODEL_DEPLOYMENTS,
    MODELS,
    NETWORK_POLICIES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    SECRETS,
    Resource,
)
from tests.k8s.harness import controller
from tests.k8s.kubectl import DEPLOY_DIR, Kubectl, delete_namespace, kubectl_for
from tests.polling import wait_until

pytestmark = pytest.mark.k8s

SYSTEM = "flexinfer-system"
CONTROLLER = f"system:serviceaccount:{SYSTEM}:flexinfer-controller"
SHIPPED = RenderSettings(policy=admin_policy_from_yaml((DEPLOY_DIR / "policy.yaml").read_text()))
CONTROL_PLANE_NODE = "attack-control-plane"

TENANT_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "Role",
    "metadata": {"name": "tenant"},
    "rules": [{
        "apiGroups": ["ai.flexinfer"],
        "resources": ["models", "modeldeployments", "modelcaches"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    }],
}


class Tenant:
    def __init__(self, local: LocalCluster, kubectl: Kubectl, namespace: str) -> None:
        self.namespace = namespace
        self.admin = KubeApi(new_api_client(str(local.kubeconfig)))
        token = kubectl.ok("create", "token", "tenant", "-n", namespace).strip()
        self.api = KubeApi(local.api_client_for_token(token))

    def create(self, resource: Resource, body: JSON) -> None:
        self.api.create(resource, self.namespace, body)

    def condition(self, resource: Resource, name: str, kind: str) -> JSON | None:
        obj = self.api.get(resource, self.namespace, name)
        for item in (obj.get("status") or {}).get("conditions") or []:
            if item.get("type") == kind:
                return dict(item)
        return None

    def refused(self, resource: Resource, name: str, *, field: str, rule: str) -> str:
        """The resource's InvalidSpec (Rendered for a Model or ModelDeployment, Ready
        for a ModelCache) naming `field` and `rule`; nothing was made for it."""
        kind = "Ready" if resource is MODEL_CACHES else "Rendered"
        found = wait_until(lambda: self.condition(resource, name, kind),
                           what=f"{name}'s {kind} condition", timeout=60)
        assert (found["status"], found["reason"]) == ("False", "InvalidSpec"), found
        assert found["message"].startswith(f"{field}: ") or f" {field}: " in found["message"], (
            found["message"])
        assert rule in found["message"], found["message"]
        for made, made_name in ((DEPLOYMENTS, name), (JOBS, f"{name}-download"),
                                (JOBS, f"{name}-finetune")):
            with pytest.raises(NotFound):
                self.admin.get(made, self.namespace, made_name)
        return str(found["message"])


def model(name: str, **spec: Any) -> JSON:
    body = {"backend": "vllm", "source": "HF://org/repo", **spec}
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "metadata": {"name": name},
            "spec": body}


def model_cache(name: str, **spec: Any) -> JSON:
    # ReadWriteOnce: the local cluster's only class (local-path, as on k3s) binds no other.
    body = {"source": "HF://org/repo", "storageStrategy": "SharedPVC", "storageSize": "1Gi",
            "accessModes": ["ReadWriteOnce"], **spec}
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
            "metadata": {"name": name}, "spec": body}


@pytest.fixture(scope="module")
def kubectl(local_cluster: LocalCluster) -> Kubectl:
    return kubectl_for(local_cluster)


@pytest.fixture(scope="module")
def deployed(local_cluster: LocalCluster, kubectl: Kubectl) -> None:
    """deploy/'s CRDs, RBAC and admission policies (its pods are not needed here)."""
    kubectl.ok("apply", "-f", str(DEPLOY_DIR / "namespace.yaml"))
    kubectl.ok("apply", "-k", str(DEPLOY_DIR))
    kubectl.run("delete", "-n", SYSTEM, "deployment", "flexinfer-controller", "flexinfer-proxy")
    kubectl.run("delete", "-n", SYSTEM, "job", "flexinfer-proxy-keys")
    kubectl.ok("wait", "--for=condition=Established", "--timeout=60s",
               "crd/models.ai.flexinfer", "crd/modelcaches.ai.flexinfer")
    try:
        local_cluster.add_node(KwokNode(name=CONTROL_PLANE_NODE, gpus=1, labels={
            "node-role.kubernetes.io/control-plane": ""}))
    except Exception as error:  # already there from an earlier run of this module
        if "already exists" not in str(error).lower():
            raise
    as_controller = KubeApi(new_api_client(str(local_cluster.kubeconfig),
                                           impersonate=CONTROLLER))
    # The admission policies reach the API server a moment after they are created.
    probe = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "probe"},
             "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
                 {"name": "c", "image": "busybox"}]}}}}
    deadline, last = time.monotonic() + 30, ""
    while time.monotonic() < deadline:
        try:
            as_controller.create(JOBS, "default", probe)
        except Rejected as error:
            if "ValidatingAdmissionPolicy 'flexinfer-controller-" in str(error):
                return
            last = str(error)
        else:
            as_controller.delete(JOBS, "default", "probe")
        time.sleep(0.5)
    pytest.fail(f"the controller's admission policies never took effect: {last}")


@pytest.fixture
def tenant(local_cluster: LocalCluster, kubectl: Kubectl, deployed: None) -> Iterator[Tenant]:
    namespace = f"tenant-{int(time.time() * 1000) % 10**8}"
    kubectl.ok("create", "namespace", namespace)
    # The administrator's part: Pod Security "baseline" enforced, "restricted" warned.
    kubectl.ok("label", "namespace", namespace,
               "pod-security.kubernetes.io/enforce=baseline",
               "pod-security.kubernetes.io/warn=restricted")
    kubectl.ok("create", "serviceaccount", "tenant", "-n", namespace)
    kubectl.ok("apply", "-n", namespace, "-f", "-", stdin=json.dumps(TENANT_ROLE))
    kubectl.ok("create", "rolebinding", "tenant", "-n", namespace, "--role=tenant",
               f"--serviceaccount={namespace}:tenant")
    try:
        yield Tenant(local_cluster, kubectl, namespace)
    finally:
        delete_namespace(kubectl, namespace)


def as_the_controller(local_cluster: LocalCluster) -> KubeApi:
    return KubeApi(new_api_client(str(local_cluster.kubeconfig), impersonate=CONTROLLER))


def rendered_without_the_check(obj: JSON, namespace: str) -> tuple[JSON, list[JSON]]:
    """What the controller would apply for `obj` if it did not check the policy: the
    Deployment and the `local` volumes of its host directories."""
    permissive = AdminPolicy(host_path_prefixes=("/",), image_prefixes=("",),
                             node_selector_keys=("*",), allow_control_plane_nodes=True)
    obj = {**obj, "metadata": {**obj["metadata"], "namespace": namespace, "uid": "u"}}
    settings = RenderSettings(policy=permissive)
    rendered = render_workload(workload_from_model(obj), cache=None, settings=settings)
    deployment = rendered.deployment
    volumes = [persistent_volume(v) for v in rendered.host_volumes]
    return {**deployment, "spec": {**deployment["spec"], "replicas": 0}}, volumes


# --- node takeover ---------------------------------------------------------------------


@pytest.mark.parametrize("source", [
    "file:///.",                                       # the node's root, PKI and all
    "file:///run/containerd/containerd.sock",          # the container runtime
    "file:///etc/kubernetes/pki",
])
def test_a_host_path_outside_the_policy_is_refused_at_both_layers(
    local_cluster: LocalCluster, tenant: Tenant, source: str
) -> None:
    attack = model("takeover", backend="vllm", source=source,
                   nodeSelector={"kubernetes.io/hostname": CONTROL_PLANE_NODE})
    tenant.create(MODELS, attack)
    with controller(local_cluster, tenant.namespace, impersonate=CONTROLLER, settings=SHIPPED):
        tenant.refused(MODELS, "takeover", field="spec.source", rule="hostPathPrefixes")
    # Second layer: what an unchecked controller would write. Its pod mounts no host
    # path, only a claim; the `local` volume behind that claim is what admission refuses.
    unchecked, volumes = rendered_without_the_check(attack, tenant.namespace)
    assert not [v for v in unchecked["spec"]["template"]["spec"]["volumes"] if "hostPath" in v]
    (volume,) = volumes
    with pytest.raises(Rejected) as refused:
        as_the_controller(local_cluster).create(PERSISTENT_VOLUMES, "", volume)
    assert "flexinfer-controller-volumes" in str(refused.value)
    assert "under the allowed prefixes" in str(refused.value)


def test_a_controller_whose_check_lets_a_host_path_through_is_stopped_by_admission(
    local_cluster: LocalCluster, tenant: Tenant
) -> None:
    """The second layer end to end: an administrator's policy that allows every host
    path (or a bug in the check) renders the attack; the admission policy refuses the
    controller's write and the Model says so; nothing runs."""
    tenant.create(MODELS, model("takeover", source="file:///."))
    careless = RenderSettings(policy=AdminPolicy(host_path_prefixes=("/",)))
    with controller(local_cluster, tenant.namespace, impersonate=CONTROLLER, settings=careless):
        found = wait_until(lambda: tenant.condition(MODELS, "takeover", "Rendered"),
                           what="takeover's Rendered condition", timeout=60)
    assert (found["status"], found["reason"]) == ("False", "InvalidSpec")
    assert "ValidatingAdmissionPolicy 'flexinfer-controller-volumes'" in found["message"]
    assert "under the allowed prefixes" in found["message"]
    with pytest.raises(NotFound):
        tenant.admin.get(DEPLOYMENTS, tenant.namespace, "takeover")


def test_another_namespaces_cache_directory_is_refused(
    local_cluster: LocalCluster, tenant: Tenant
) -> None:
    tenant.create(MODELS, model("peek", backend="llama-cpp",
                                source="file:///var/lib/flexinfer/models/team-b/tuned/a.gguf"))
    with controller(local_cluster, tenant.namespace, impersonate=CONTROLLER, settings=SHIPPED):
        tenant.refused(MODELS, "peek", field="spec.source",
                       rule=f"/var/lib/flexinfer/models/{tenant.namespace}/")


def test_a_finetune_dataset_outside_the_policy_is_refused(
    local_cluster: LocalCluster, tenant: Tenant
) -> None:
    tenant.create(MODEL_CACHES, model_cache("keys", finetune={
        "dataset": "file:///etc/kubernetes/pki/ca.key", "image": "busybox:1.36"}))
    with controller(local_cluster, tenant.namespace, impersonate=CONTROLLER, settings=SHIPPED):
        message = wait_until(
            lambda: (tenant.api.get(MODEL_CACHES, tenant.namespace, "keys").get("status") or {})
            .get("message"), what="the finetune refused", timeout=90)
        assert message.startswith("spec.finetune.dataset: 'file:///etc/kubernetes/pki/ca.key'")
        assert "hostPathPrefixes" in message
        with pytest.raises(NotFound):
            tenant.admin.get(JOBS, tenant.namespace, "keys-finetune")


@pytest.mark.parametrize(("resource", "body", "field"), [
    (MODELS, model("miner", image="attacker.example/miner:latest"), "spec.image"),
    (MODEL_CACHES, model_cache("miner", downloadImage="attacker.example/tools:1"),
     "spec.downloadImage"),
])
def test_an_image_the_administrator_did_not_allow_is_refused(
    local_cluster: LocalCluster, tenant: Tenant, resource: Resource, body: JSON, field: str
) -> None:
    tenant.create(resource, body)
    with controller(local_cluster, tenant.namespace, impersonate=CONTROLLER, settings=SHIPPED):
        tenant.refused(resource, "miner", field=field, rule="imagePrefixes")


@pytest.mark.parametrize(("spec", "field", "rule"), [
    ({"tolerations": [{"operator": "Exists"}]}, "spec.tolerations[0]", "every taint"),
    ({"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                       "effect": "NoSchedule"}]}, "spec.tolerations[0]", "control plane"),
    ({"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}},
     "spec.nodeSelector[node-role.kubernetes.io/control-plane]", "nodeSelectorKeys"),
])
def test_scheduling_onto_the_control_plane_is_refused(
    local_cluster: LocalCluster, tenant: Tenant, spec: JSON, field: str, rule: str
) -> None:
    tenant.create(MODELS, model("cp", **spec))
    with controller(local_cluster, tenant.namespace, impersonate=CONTROLLER, settings=SHIPPED):
        tenant.refused(MODELS, "cp", field=field, rule=rule)


def test_a_control_plane_node_named_by_hostname_never_gets_the_pod(
    local_cluster: LocalCluster, tenant: Tenant
) -> None:
    """kubernetes.io/hostname is an allowed key; the node affinity every rendered pod
    carries keeps it off a control-plane node all the same."""
    tenant.create(MODEL_DEPLOYMENTS, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "cp-by-name"},
        "spec": {"backend": "vllm", "model": "org/repo",
                 "nodeSelector": {"kubernetes.io/hostname": CONTROL_PLANE_NODE}},
    })
    tenant.admin.patch(MODEL_DEPLOYMENTS, tenant.namespace, "cp-by-name",
                       {"status": {"lastAccessTime": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                   time.gmtime())}},
                       subresource="status")
    with controller(local_cluster, tenant.namespace, impersonate=CONTROLLER, settings=SHIPPED):
        def unschedulable() -> JSON | None:
            for pod in tenant.admin.list(PODS, tenant.namespace).get("items") or []:
                for item in (pod.get("status") or {}).get("conditions") or []:
                    if item.get("reason") == "Unschedulable":
                        return dict(pod)
            return None

        pod = wait_until(unschedulable, what="the pod refused by the scheduler", timeout=90)
        assert not pod["spec"].get("nodeName")
        assert "didn't match Pod's node affinity" in json.dumps(pod["status"]), pod["status"]


# --- pods, metadata and Secrets ---------------------------------------------------------


@pytest.mark.parametrize(("spec", "field", "rule"), [
    ({"podLabels": {"app": "postgres"}}, "spec.podLabels[app]", "podLabelKeys"),
    ({"podLabels": {"ai.flexinfer/group": "other-team"}},
     "spec.podLabels[ai.flexinfer/group]", "never a tenant's"),
    ({"podAnnotations": {"sidecar.istio.io/inject": "false"}},
     "spec.podAnnotations[sidecar.istio.io/inject]", "podAnnotationKeys"),
])
def test_pod_labels_and_annotations_cannot_hijack_or_opt_out(
    local_cluster: LocalCluster, tenant: Tenant, spec: JSON, field: str, rule: str
) -> None:
    tenant.create(MODELS, model("hijack", **spec))
    with controller(local_cluster, tenant.namespace, impersonate=CONTROLLER, settings=SHIPPED):
        tenant.refused(MODELS, "hijack", field=field, rule=rule)


def test_what_is_rendered_passes_pod_security_baseline_and_admits_only_the_proxy(
    local_cluster: LocalCluster, tenant: Tenant
) -> None:
    """The namespace enforces "baseline": a pod the API server refused would never
    appear. Its NetworkPolicy admits only the proxy to port 8000."""
    tenant.create(MODELS, model("fine", nodeSelector={"kubernetes.io/hostname": "kwok-gpu-0"}))
    tenant.admin.patch(MODELS, tenant.namespace, "fine", {"status": {
        "lastActiveTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}},
        subresource="status")
    with controller(local_cluster, tenant.namespace, impersonate=CONTROLLER, settings=SHIPPED):
        pod = wait_until(lambda: next(iter(tenant.admin.list(PODS, tenant.namespace)
                                           .get("items") or []), None),
                         what="fine's pod", timeout=90)
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert not any(m["mountPath"].startswith("/var/run/secrets")
                       for m in pod["spec"]["containers"][0].get("volumeMounts") or [])
        network = tenant.admin.get(NETWORK_POLICIES, tenant.namespace, "fine")
        (rule,) = network["spec"]["ingress"]
        assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]
        assert rule["from"] == [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": SYSTEM}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "flexinfer-proxy"}},
        }]


def test_a_llama_cpp_server_passes_pod_security_restricted(
    local_cluster: LocalCluster, kubectl: Kubectl, tenant: Tenant
) -> None:
    """Its image needs no root: in a namespace that enforces "restricted" its pod is
    created (PodSecurity admission would refuse it otherwise)."""
    kubectl.ok("label", "--overwrite", "namespace", tenant.namespace,
               "pod-security.kubernetes.io/enforce=restricted")
    tenant.admin.create(PERSISTENT_VOLUME_CLAIMS, tenant.namespace, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "weights"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    })
    tenant.create(MODELS, model("small", backend="llama-cpp", source="pvc://weights/q.gguf",
                                nodeSelector={"kubernetes.io/hostname": "kwok-gpu-1"}))
    tenant.admin.patch(MODELS, tenant.namespace, "small", {"status": {
        "lastActiveTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}},
        subresource="status")
    with controller(local_cluster, tenant.namespace, impersonate=CONTROLLER, settings=SHIPPED):
        pod = wait_until(lambda: next(iter(tenant.admin.list(PODS, tenant.namespace)
                                           .get("items") or []), None),
                         what="small's pod, admitted as restricted", timeout=90)
    (server,) = pod["spec"]["containers"]
    assert server["securityContext"]["runAsNonRoot"] is True


def test_a_cache_gets_no_secret_it_does_not_name(local_cluster: LocalCluster,
                                                 tenant: Tenant) -> None:
    """ModelCache `x` used to hand Secret `x-hf-token` to an image of its creator's choice."""
    tenant.admin.create(SECRETS, tenant.namespace, {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "grab-hf-token"},
        "stringData": {"token": "hf_someone_elses"}})
    tenant.create(MODEL_CACHES, model_cache("grab"))
    with controller(local_cluster, tenant.namespace, impersonate=CONTROLLER, settings=SHIPPED):
        job = wait_until(lambda: _get(tenant.admin, JOBS, tenant.namespace, "grab-download"),
                         what="grab's download Job", timeout=60)
    containers = job["spec"]["template"]["spec"]["containers"]
    assert not [e for c in containers for e in c.get("env") or [] if "valueFrom" in e]
    assert job["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_a_job_the_cache_does_not_own_is_neither_used_nor_deleted(
    local_cluster: LocalCluster, tenant: Tenant
) -> None:
    tenant.admin.create(JOBS, tenant.namespace, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "other-download"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "automountServiceAccountToken":
                 False, "containers": [{"name": "c", "image": "busybox:1.36"}]}}}})
    tenant.create(MODEL_CACHES, model_cache("other"))
    with controller(local_cluster, tenant.namespace, impersonate=CONTROLLER, settings=SHIPPED):
        ready = wait_until(lambda: tenant.condition(MODEL_CACHES, "other", "Ready")
                           if (tenant.condition(MODEL_CACHES, "other", "Ready") or {})
                           .get("reason") == "NameClash" else None,
                           what="other's name clash", timeout=60)
        assert f"Job {tenant.namespace}/other-download was not created by flexinfer" in (
            ready["message"])
    assert tenant.admin.get(JOBS, tenant.namespace, "other-download")


def test_a_cleanup_job_name_taken_by_someone_else_is_never_deleted(
    local_cluster: LocalCluster, tenant: Tenant
) -> None:
    tenant.admin.create(JOBS, tenant.namespace, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "local-cleanup"},
        "spec": {"suspend": True, "template": {"spec": {
            "restartPolicy": "Never", "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "busybox:1.36"}]}}}})
    tenant.create(MODEL_CACHES, model_cache("local", storageStrategy="NodeLocal",
                                            nodeSelector={"kubernetes.io/hostname": "kwok-gpu-0"}))
    with controller(local_cluster, tenant.namespace, impersonate=CONTROLLER, settings=SHIPPED):
        wait_until(lambda: tenant.api.get(MODEL_CACHES, tenant.namespace, "local")["metadata"]
                   .get("finalizers"), what="the cleanup finalizer", timeout=60)
        tenant.api.delete(MODEL_CACHES, tenant.namespace, "local")
        wait_until(lambda: _get(tenant.admin, MODEL_CACHES, tenant.namespace, "local") is None,
                   what="the cache gone without its cleanup", timeout=90)
    job = tenant.admin.get(JOBS, tenant.namespace, "local-cleanup")
    assert "ai.flexinfer/modelcache" not in (job["metadata"].get("labels") or {})
    events = tenant.admin.list(EVENTS, tenant.namespace).get("items") or []
    assert any("local-cleanup is not flexinfer's" in (e.get("message") or "") for e in events)


def test_a_failed_downloads_secrets_do_not_reach_the_caches_status(
    local_cluster: LocalCluster, tenant: Tenant
) -> None:
    leak = "401 Unauthorized (Authorization: Bearer hf_LeakedTokenValue42)"
    body = model_cache("leaky", podAnnotations={FAIL_ANNOTATION: leak})
    tenant.create(MODEL_CACHES, body)
    # The kwok annotation is the local cluster administrator's to allow.
    with controller(local_cluster, tenant.namespace, impersonate=CONTROLLER,
                    settings=RenderSettings(policy=dev_policy())):
        message = wait_until(
            lambda: (lambda s: s.get("message") if s.get("phase") == "Failed" else None)(
                tenant.api.get(MODEL_CACHES, tenant.namespace, "leaky").get("status") or {}),
            what="leaky to fail", timeout=120)
    assert "401 Unauthorized" in message
    assert "hf_LeakedTokenValue42" not in message and "[redacted]" in message


def test_a_tenant_cannot_reach_around_the_controller(tenant: Tenant) -> None:
    """Its rights end at the three resources: no pods, Deployments, Jobs or Secrets."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "direct"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    for resource, body in ((PODS, pod), (JOBS, {"metadata": {"name": "j"}})):
        with pytest.raises(Rejected) as refused:
            tenant.api.create(resource, tenant.namespace, body)
        assert refused.value.status == 403
    with pytest.raises(Rejected) as refused:
        tenant.api.list(SECRETS, tenant.namespace)
    assert refused.value.status == 403
    with pytest.raises(Rejected):
        tenant.api.patch(MODELS, tenant.namespace, "x", {"status": {"phase": "Ready"}},
                         subresource="status")


def _get(api: KubeApi, resource: Resource, namespace: str, name: str) -> JSON | None:
    try:
        return api.get(resource, namespace, name)
    except NotFound:
        return None

