"""The deploy/ kustomize base on a real API server, and what its RBAC really allows.

Rights are checked with the ServiceAccounts' own tokens (TokenRequest), so the API
server's authenticator and RBAC authorizer decide, not a simulation of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s_client

from flexinfer_devcluster.localcluster import (
    KWOK_NODE_LABEL,
    KWOK_NODE_LABEL_VALUE,
    READY_DELAY_ANNOTATION,
    LocalCluster,
)
from flexinfer_devcluster.policy import dev_policy_yaml
from flexinfer_kube.kubeapi import KubeApi, Rejected
from flexinfer_kube.resources import (
    CONFIG_MAPS,
    DEPLOYMENTS,
    EVENTS,
    GPU_GROUPS,
    GPU_LEASES,
    JOBS,
    MODEL_CACHES,
    MODEL_DEPLOYMENTS,
    MODELS,
    NETWORK_POLICIES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    RESOURCE_CLAIMS,
    SERVICES,
)
from tests.polling import wait_until

from .kubectl import (
    CRD_NAMES,
    DEPLOY_DIR,
    ROOT,
    Kubectl,
    create_namespace,
    delete_namespace,
    kubectl_for,
)

pytestmark = pytest.mark.k8s

SYSTEM_NAMESPACE = "flexinfer-system"
CONTROLLER_SA = "flexinfer-controller"
PROXY_SA = "flexinfer-proxy"


@pytest.fixture(scope="module")
def kubectl(local_cluster: LocalCluster) -> Kubectl:
    return kubectl_for(local_cluster)


@pytest.fixture(scope="module")
def deployed(kubectl: Kubectl) -> Iterator[None]:
    # A server-side dry run cannot create the namespace the rest is checked in.
    kubectl.ok("apply", "-f", str(DEPLOY_DIR / "namespace.yaml"))
    kubectl.ok("apply", "--dry-run=server", "-k", str(DEPLOY_DIR))
    kubectl.ok("apply", "-k", str(DEPLOY_DIR))
    kubectl.ok(
        "wait", "--for=condition=Established", "--timeout=60s", *(f"crd/{n}" for n in CRD_NAMES)
    )
    yield
    # The image does not exist here; leave no pods behind for other suites. The
    # namespace, CRDs and RBAC stay: other suites may rely on them.
    kubectl.run(
        "delete", "-n", SYSTEM_NAMESPACE, "deployment", "flexinfer-controller", "flexinfer-proxy"
    )
    kubectl.run("delete", "-n", SYSTEM_NAMESPACE, "job", "flexinfer-proxy-keys")


@pytest.fixture(scope="module")
def namespace(kubectl: Kubectl, deployed: None) -> Iterator[str]:
    name = create_namespace(kubectl, "rbac")
    yield name
    delete_namespace(kubectl, name)


def token_for(kubectl: Kubectl, service_account: str) -> str:
    return kubectl.ok(
        "create", "token", service_account, "-n", SYSTEM_NAMESPACE, "--duration=10m"
    ).strip()


@pytest.fixture(scope="module")
def controller(
    kubectl: Kubectl, deployed: None, tmp_path_factory: pytest.TempPathFactory
) -> Kubectl:
    return kubectl.as_token(token_for(kubectl, CONTROLLER_SA), tmp_path_factory.mktemp("sa"))


@pytest.fixture(scope="module")
def proxy(kubectl: Kubectl, deployed: None, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    return kubectl.as_token(token_for(kubectl, PROXY_SA), tmp_path_factory.mktemp("sa"))


@pytest.fixture(scope="module")
def proxy_policy_active(kubectl: Kubectl, proxy: Kubectl, namespace: str) -> None:
    """Wait until the API server enforces the freshly created admission policy.

    Policies reach the admission chain asynchronously, a moment after creation.
    """
    apply(kubectl, namespace, GROUP)
    probe = json.dumps({"metadata": {"labels": {"policy-probe": "x"}}})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        result = proxy.run(
            "patch", "-n", namespace, "gpugroup/rbac-group", "--type=merge", "-p", probe
        )
        if "flexinfer-proxy-writes" in result.stderr:
            return
        if result.returncode == 0:  # admitted before the policy was active: undo
            kubectl.ok("label", "-n", namespace, "gpugroup/rbac-group", "policy-probe-")
        time.sleep(0.5)
    pytest.fail("the flexinfer-proxy-writes policy never took effect")


def assert_forbidden(result: Any) -> None:
    assert result.returncode != 0, result.stdout
    assert "(Forbidden)" in result.stderr or "is forbidden: User" in result.stderr, result.stderr


def apply(kubectl: Kubectl, namespace: str, manifest: dict[str, Any]) -> None:
    kubectl.ok("apply", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))


MODEL = {
    "apiVersion": "ai.flexinfer/v1alpha2",
    "kind": "Model",
    "metadata": {"name": "rbac-model"},
    "spec": {"backend": "vllm", "source": "HF://Qwen/Qwen2.5-7B-Instruct"},
}
GROUP = {
    "apiVersion": "ai.flexinfer/v1alpha1",
    "kind": "GPUGroup",
    "metadata": {"name": "rbac-group"},
    "spec": {"models": [{"name": "rbac-deployment"}]},
}
MODEL_DEPLOYMENT = {
    "apiVersion": "ai.flexinfer/v1alpha1",
    "kind": "ModelDeployment",
    "metadata": {"name": "rbac-deployment"},
    "spec": {
        "backend": "vllm",
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "gpuGroupRef": "rbac-group",
    },
}


def test_base_renders_with_kubectls_kustomize(kubectl: Kubectl) -> None:
    rendered = [doc for doc in yaml.safe_load_all(kubectl.ok("kustomize", str(DEPLOY_DIR))) if doc]
    kinds = sorted(doc["kind"] for doc in rendered)
    assert kinds.count("CustomResourceDefinition") == 5
    assert kinds.count("Deployment") == 2
    assert kinds.count("ServiceAccount") == 3  # controller, proxy, the keys Job
    assert kinds.count("ClusterRole") == 3  # controller, its volumes, proxy
    assert kinds.count("ValidatingAdmissionPolicy") == 5
    assert kinds.count("NetworkPolicy") == 2
    assert kinds.count("Job") == 1
    assert "Namespace" in kinds
    cluster_scoped = {
        "CustomResourceDefinition",
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for doc in rendered:
        if doc["kind"] in cluster_scoped:
            assert "namespace" not in doc["metadata"], doc["metadata"]
        else:
            assert doc["metadata"]["namespace"] == SYSTEM_NAMESPACE, doc["metadata"]
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "flexinfer"
    images = {
        container["image"]
        for doc in rendered
        if doc["kind"] in ("Deployment", "Job")
        for container in doc["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"flexinfer:0.1.0"}
    # The controller reads the administrator's policy from the generated ConfigMap.
    (config_map,) = [d for d in rendered if d["kind"] == "ConfigMap"]
    assert config_map["metadata"]["name"].startswith("flexinfer-policy-")
    controller = next(d for d in rendered if d["metadata"]["name"] == "flexinfer-controller"
                      and d["kind"] == "Deployment")
    pod = controller["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    assert command[command.index("--policy") + 1] == "/etc/flexinfer/policy.yaml"
    volume = next(v for v in pod["volumes"] if v["name"] == "policy")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    assert yaml.safe_load(config_map["data"]["policy.yaml"]) == yaml.safe_load(
        (DEPLOY_DIR / "policy.yaml").read_text())
    # API keys are on.
    proxy = next(d for d in rendered if d["metadata"]["name"] == "flexinfer-proxy"
                 and d["kind"] == "Deployment")
    command = proxy["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--api-key-secret") + 1] == (
        "flexinfer-system/flexinfer-proxy-api-keys")


def test_the_namespaced_overlay_binds_rights_per_namespace(kubectl: Kubectl) -> None:
    rendered = [
        doc for doc in yaml.safe_load_all(kubectl.ok("kustomize", str(ROOT / "deploy-namespaced")))
        if doc
    ]
    # The one cluster-wide binding left: the local volumes, which are cluster-scoped
    # (get, create, patch; never delete).
    assert [d["metadata"]["name"] for d in rendered if d["kind"] == "ClusterRoleBinding"] == [
        "flexinfer-controller-volumes"]
    (volumes,) = [d for d in rendered if d["kind"] == "ClusterRole"
                  and d["metadata"]["name"] == "flexinfer-controller-volumes"]
    assert [(r["resources"], r["verbs"]) for r in volumes["rules"]] == [
        (["persistentvolumes"], ["get", "create", "patch"])]
    bindings = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in rendered
                if d["kind"] == "RoleBinding"}
    assert {("team-a", "flexinfer-controller"), ("team-a", "flexinfer-proxy")} <= bindings
    for name in ("flexinfer-controller", "flexinfer-proxy"):
        deployment = next(d for d in rendered if d["kind"] == "Deployment"
                          and d["metadata"]["name"] == name)
        assert deployment["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == [
            "--namespace", "team-a"]


def test_a_namespace_binding_grants_the_controllers_rules_there_only(
    kubectl: Kubectl, deployed: None, tmp_path: Path
) -> None:
    """What the overlay's RoleBinding does, for a ServiceAccount bound by nothing else."""
    home = create_namespace(kubectl, "overlay-sa")
    watched = create_namespace(kubectl, "overlay-watched")
    other = create_namespace(kubectl, "overlay-other")
    try:
        kubectl.ok("create", "serviceaccount", "flexinfer-controller", "-n", home)
        (binding,) = [d for d in yaml.safe_load_all(
            (ROOT / "deploy-namespaced" / "rolebindings.yaml").read_text())
            if d and d["metadata"]["name"] == "flexinfer-controller"]
        binding["metadata"]["namespace"] = watched
        binding["subjects"][0]["namespace"] = home
        kubectl.ok("apply", "-f", "-", stdin=json.dumps(binding))
        token = kubectl.ok("create", "token", "flexinfer-controller", "-n", home).strip()
        scoped = kubectl.as_token(token, tmp_path)
        scoped.ok("get", "models.ai.flexinfer", "-n", watched)
        scoped.ok("get", "pods", "-n", watched)
        assert_forbidden(scoped.run("get", "models.ai.flexinfer", "-n", other))
        assert_forbidden(scoped.run("get", "models.ai.flexinfer", "--all-namespaces"))
    finally:
        for name in (home, watched, other):
            delete_namespace(kubectl, name)


def test_base_applies_and_its_pods_are_created(kubectl: Kubectl, deployed: None) -> None:
    controller = kubectl.json("get", "-n", SYSTEM_NAMESPACE, "deployment/flexinfer-controller")
    assert controller["spec"]["replicas"] == 2
    proxy = kubectl.json("get", "-n", SYSTEM_NAMESPACE, "deployment/flexinfer-proxy")
    assert proxy["spec"]["replicas"] == 1
    kubectl.json("get", "-n", SYSTEM_NAMESPACE, "service/flexinfer-proxy")
    # The ReplicaSet controller creating the pods proves the pod template (security
    # context, probes, service account) is accepted, not only the Deployment.
    deadline = time.monotonic() + 60
    pods: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        listed = kubectl.json(
            "get",
            "pods",
            "-n",
            SYSTEM_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=flexinfer-controller",
        )
        pods = listed["items"]
        if len(pods) == 2:
            break
        time.sleep(0.5)
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["serviceAccountName"] == CONTROLLER_SA
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


MANAGED = {"app.kubernetes.io/managed-by": "flexinfer"}


def hardened_pod(**extra: Any) -> dict[str, Any]:
    """A pod template as the renderer writes it (render.pod_security)."""
    return {
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "c", "image": "flexinfer:0.1.0",
            "securityContext": {"allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}},
        }],
        **extra,
    }


def workload(kind: str, name: str, *, labels: dict[str, str] | None = None,
             pod: dict[str, Any] | None = None) -> dict[str, Any]:
    template = {"metadata": {"labels": {"app": name}}, "spec": pod or hardened_pod()}
    if kind == "Job":
        template["spec"] = {"restartPolicy": "Never", **template["spec"]}
        spec: dict[str, Any] = {"template": template}
        version = "batch/v1"
    else:
        spec = {"selector": {"matchLabels": {"app": name}}, "template": template}
        version = "apps/v1"
    return {"apiVersion": version, "kind": kind,
            "metadata": {"name": name, "labels": MANAGED if labels is None else labels},
            "spec": spec}


def server_side_apply(kubectl: Kubectl, namespace: str, manifest: dict[str, Any],
                      *, check: bool = True) -> Any:
    args = ("apply", "--server-side", "--field-manager=flexinfer-controller", "-n", namespace,
            "-f", "-")
    if check:
        return kubectl.ok(*args, stdin=json.dumps(manifest))
    return kubectl.run(*args, stdin=json.dumps(manifest))


@pytest.fixture(scope="module")
def controller_policy_active(kubectl: Kubectl, controller: Kubectl, namespace: str) -> None:
    """Wait until the API server enforces controller-policy.yaml (policies reach the
    admission chain a moment after they are created)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        result = server_side_apply(
            controller, namespace, workload("Deployment", "policy-probe", labels={}), check=False)
        if "flexinfer-controller-writes" in result.stderr:
            return
        if result.returncode == 0:
            kubectl.ok("delete", "-n", namespace, "deployment/policy-probe")
        time.sleep(0.5)
    pytest.fail("the flexinfer-controller-writes policy never took effect")


def test_controller_can_do_its_job(
    local_cluster: LocalCluster, kubectl: Kubectl, controller: Kubectl, namespace: str,
    controller_policy_active: None,
) -> None:
    """Each request the controller sends, sent as it sends it (KubeApi, no kubectl
    read-before-write), on the ServiceAccount's token."""
    api = KubeApi(local_cluster.api_client_for_token(token_for(kubectl, CONTROLLER_SA)))
    apply(kubectl, namespace, MODEL)
    apply(kubectl, namespace, MODEL_DEPLOYMENT)
    apply(kubectl, namespace, GROUP)
    for resource in (MODELS, GPU_LEASES, GPU_GROUPS, MODEL_CACHES, MODEL_DEPLOYMENTS, PODS,
                     CONFIG_MAPS, JOBS, PERSISTENT_VOLUME_CLAIMS, NETWORK_POLICIES, SERVICES,
                     DEPLOYMENTS):
        api.list(resource, None)
    status = {"status": {"phase": "Idle", "message": "nobody asked for it"}}
    api.patch(MODELS, namespace, "rbac-model", status, subresource="status")
    api.get(MODELS, namespace, "rbac-model")
    api.patch(GPU_GROUPS, namespace, "rbac-group", {"status": {"phase": "Idle"}},
              subresource="status")
    api.patch(MODEL_DEPLOYMENTS, namespace, "rbac-deployment", {"status": {"phase": "Idle"}},
              subresource="status")
    # Render by server-side apply (a patch, creating too), then scale.
    manager = "flexinfer-controller"
    api.apply(DEPLOYMENTS, namespace, "rbac-model", workload("Deployment", "rbac-model"),
              field_manager=manager)
    api.patch(DEPLOYMENTS, namespace, "rbac-model", {"spec": {"replicas": 0}},
              subresource="scale", field_manager="flexinfer-scale")
    assert kubectl.json("get", "-n", namespace, "deployment/rbac-model")["spec"]["replicas"] == 0
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "rbac-model", "labels": MANAGED},
               "spec": {"selector": {"app": "rbac-model"}, "ports": [{"port": 8000}]}}
    api.apply(SERVICES, namespace, "rbac-model", service, field_manager=manager)
    api.patch(SERVICES, namespace, "rbac-model",
              {"metadata": {"annotations": {"ai.flexinfer/active-services": "x"}}})
    network = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": "rbac-model", "labels": MANAGED},
               "spec": {"podSelector": {"matchLabels": {"app": "rbac-model"}},
                        "policyTypes": ["Ingress"]}}
    api.apply(NETWORK_POLICIES, namespace, "rbac-model", network, field_manager=manager)
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": {"name": "rbac-models", "labels": MANAGED},
             "spec": {"accessModes": ["ReadWriteMany"],
                      "resources": {"requests": {"storage": "1Gi"}}}}
    api.apply(PERSISTENT_VOLUME_CLAIMS, namespace, "rbac-models", claim, field_manager=manager)
    api.get(PERSISTENT_VOLUME_CLAIMS, namespace, "rbac-models")
    lease = {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "GPULease",
        "metadata": {"name": "rbac-lease"},
        "spec": {"group": "homelab-gpu", "owner": "finetune"},
    }
    api.create(GPU_LEASES, namespace, lease)
    api.patch(GPU_LEASES, namespace, "rbac-lease", {"status": {"active": True}},
              subresource="status")
    api.patch(GPU_LEASES, namespace, "rbac-lease", {"spec": {"expiresAt": "2030-01-01T00:00:00Z"}})
    api.get(GPU_LEASES, namespace, "rbac-lease")
    api.delete(GPU_LEASES, namespace, "rbac-lease")
    api.create(JOBS, namespace, workload("Job", "rbac-finetune"))
    api.get(JOBS, namespace, "rbac-finetune")
    api.delete(JOBS, namespace, "rbac-finetune")
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "rbac-model.preempted"},
        "involvedObject": {"kind": "Model", "name": "rbac-model", "namespace": namespace},
        "reason": "Preempted",
        "message": "rbac test",
        "type": "Normal",
    }
    api.create(EVENTS, namespace, event)
    election = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "rbac-election"},
        "spec": {"holderIdentity": "controller-0", "leaseDurationSeconds": 15},
    }
    controller.ok("create", "-n", SYSTEM_NAMESPACE, "-f", "-", stdin=json.dumps(election))
    controller.ok("get", "-n", SYSTEM_NAMESPACE, "lease/rbac-election")
    kubectl.ok("delete", "-n", SYSTEM_NAMESPACE, "lease/rbac-election")


def test_controller_is_refused_what_it_must_not_do(
    local_cluster: LocalCluster, kubectl: Kubectl, controller: Kubectl, namespace: str
) -> None:
    kubectl.ok("create", "secret", "generic", "rbac-secret", "-n", namespace, "--from-literal=k=v")
    assert_forbidden(controller.run("get", "secrets", "-n", namespace))
    assert_forbidden(controller.run("get", "secret/rbac-secret", "-n", namespace))
    assert_forbidden(controller.run("create", "namespace", "rbac-not-allowed"))
    assert_forbidden(controller.run("get", "nodes"))
    assert_forbidden(
        controller.run("create", "-n", namespace, "-f", "-", stdin=json.dumps(pod_manifest()))
    )
    # Leader election is confined to the controller's own namespace.
    assert_forbidden(controller.run("get", "leases.coordination.k8s.io", "-n", namespace))
    apply(kubectl, namespace, MODEL)
    assert_forbidden(controller.run("delete", "-n", namespace, "model/rbac-model"))
    # Verbs it never uses are not granted: deleting or replacing workloads, writing
    # ConfigMaps, deleting claims.
    kubectl.ok("create", "deployment", "users-app", "-n", namespace, "--image=flexinfer:0.1.0")
    assert_forbidden(controller.run("delete", "-n", namespace, "deployment/users-app"))
    assert_forbidden(controller.run("create", "configmap", "x", "-n", namespace))
    assert_forbidden(controller.run("create", "configmap", "x", "-n", "kube-system"))
    kubectl.ok("create", "service", "clusterip", "users-svc", "-n", namespace, "--tcp=80")
    assert_forbidden(controller.run("delete", "-n", namespace, "service/users-svc"))
    # The same refusal seen by the kubernetes client: HTTP 403.
    api = k8s_client.CoreV1Api(
        local_cluster.api_client_for_token(token_for(kubectl, CONTROLLER_SA))
    )
    with pytest.raises(k8s_client.ApiException) as refused:
        api.read_namespaced_secret("rbac-secret", namespace)
    assert refused.value.status == 403


@pytest.fixture(scope="module")
def controller_api(local_cluster: LocalCluster, kubectl: Kubectl, deployed: None) -> KubeApi:
    """Requests as the controller sends them, on its ServiceAccount's token."""
    return KubeApi(local_cluster.api_client_for_token(token_for(kubectl, CONTROLLER_SA)))


def refused_by(write: Any, policy: str, message: str) -> None:
    with pytest.raises(Rejected) as refused:
        write()
    assert policy in str(refused.value), refused.value
    assert message in str(refused.value), refused.value


def test_admission_narrows_the_controllers_writes_to_what_flexinfer_makes(
    kubectl: Kubectl, controller_api: KubeApi, namespace: str, controller_policy_active: None
) -> None:
    """RBAC allows the patch; the admission policy allows only flexinfer's objects."""
    writes, api = "flexinfer-controller-writes", controller_api
    manager = "flexinfer-controller"
    # A user's Deployment (pod template as baseline as ours) cannot be taken over by an
    # apply, nor relabelled into ours.
    apply(kubectl, namespace, workload("Deployment", "users-db", labels={"app": "db"}))
    refused_by(lambda: api.apply(DEPLOYMENTS, namespace, "users-db",
                                 workload("Deployment", "users-db"), field_manager=manager),
               writes, "managed-by=flexinfer")
    refused_by(lambda: api.patch(DEPLOYMENTS, namespace, "users-db", {"metadata": {"labels": {
        "app.kubernetes.io/managed-by": "flexinfer"}}}), writes, "managed-by=flexinfer")
    kubectl.ok("create", "service", "clusterip", "users-db", "-n", namespace, "--tcp=5432")
    refused_by(lambda: api.patch(SERVICES, namespace, "users-db", {"metadata": {
        "annotations": {"x": "y"}}}), writes, "managed-by=flexinfer")
    refused_by(lambda: api.apply(DEPLOYMENTS, namespace, "unlabelled",
                                 workload("Deployment", "unlabelled", labels={}),
                                 field_manager=manager), writes, "managed-by=flexinfer")
    kubectl.ok("create", "job", "users-job", "-n", namespace, "--image=busybox:1.36")
    refused_by(lambda: api.delete(JOBS, namespace, "users-job"), writes, "managed-by=flexinfer")
    refused_by(lambda: api.create(JOBS, "kube-system", workload("Job", "in-kube-system")),
               writes, "cluster's own namespaces")
    # Of a tenant's ModelCache (the one it may patch at all) it changes the finalizers
    # only: a node cache's cleanup.
    resources = "flexinfer-controller-resources"
    cache = {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
             "metadata": {"name": "rbac-cache"}, "spec": {"source": "HF://o/r"}}
    apply(kubectl, namespace, cache)
    for change in ({"spec": {"source": "file:///."}}, {"metadata": {"labels": {"x": "y"}}},
                   {"metadata": {"annotations": {"x": "y"}}}):
        refused_by(lambda change=change: api.patch(MODEL_CACHES, namespace, "rbac-cache",
                                                   change),
                   resources, "changes only the finalizers")
    api.patch(MODEL_CACHES, namespace, "rbac-cache",
              {"metadata": {"finalizers": ["ai.flexinfer/node-cleanup"]}})
    api.patch(MODEL_CACHES, namespace, "rbac-cache", {"metadata": {"finalizers": None}})


def resource_claim(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A budgeted group's card as the renderer writes it (render.gpu_claim)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "labels": labels},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.amd.com", "allocationMode": "ExactCount",
                "count": 1}}]}}}


def test_the_controller_writes_only_the_resource_claims_flexinfer_labels(
    kubectl: Kubectl, controller_api: KubeApi, namespace: str, controller_policy_active: None
) -> None:
    """A budgeted group's ResourceClaim (--gpu-device-class): RBAC grants get, create,
    patch and delete (what reconcile_workload sends); the admission policy narrows the
    writes to claims labelled managed-by flexinfer."""
    writes, api = "flexinfer-controller-writes", controller_api
    name = "flexinfer-gpu-shared-rbac"
    api.create(RESOURCE_CLAIMS, namespace, resource_claim(name, MANAGED))
    api.get(RESOURCE_CLAIMS, namespace, name)
    api.patch(RESOURCE_CLAIMS, namespace, name,
              {"metadata": {"labels": {"ai.flexinfer/group": "rbac"}}})
    api.delete(RESOURCE_CLAIMS, namespace, name)
    refused_by(lambda: api.create(RESOURCE_CLAIMS, namespace, resource_claim("unlabelled", {})),
               writes, "managed-by=flexinfer")
    # A tenant's claim: neither relabelled into flexinfer's, nor changed, nor deleted.
    apply(kubectl, namespace, resource_claim("users-claim", {"team": "ml"}))
    refused_by(lambda: api.patch(RESOURCE_CLAIMS, namespace, "users-claim",
                                 {"metadata": {"labels": MANAGED}}), writes, "managed-by=flexinfer")
    refused_by(lambda: api.patch(RESOURCE_CLAIMS, namespace, "users-claim",
                                 {"metadata": {"ownerReferences": []}}),
               writes, "managed-by=flexinfer")
    refused_by(lambda: api.delete(RESOURCE_CLAIMS, namespace, "users-claim"),
               writes, "managed-by=flexinfer")
    # It reads a group's claim by name only: no list, no watch.
    with pytest.raises(Rejected) as refused:
        api.list(RESOURCE_CLAIMS, namespace)
    assert refused.value.status == 403


@pytest.mark.parametrize(("pod", "message"), [
    (hardened_pod(hostNetwork=True), "network, PID or IPC namespace"),
    (hardened_pod(hostPID=True), "network, PID or IPC namespace"),
    # Outside the controller's namespace no host path at all, not even flexinfer's own
    # cache directory (tenants' pods reach it through claims on local volumes).
    (hardened_pod(volumes=[{"name": "root", "hostPath": {"path": "/", "type": "Directory"}}]),
     "mounts no host path"),
    (hardened_pod(volumes=[{"name": "cache", "hostPath": {
        "path": "/var/lib/flexinfer/models/team/x", "type": "DirectoryOrCreate"}}]),
     "mounts no host path"),
    (hardened_pod(automountServiceAccountToken=True), "without a token"),
    (hardened_pod(serviceAccountName="flexinfer-controller"), "default ServiceAccount"),
    (hardened_pod(securityContext={}), "RuntimeDefault seccomp"),
    (hardened_pod(nodeName="control-plane-0"), "names no node"),
    (hardened_pod(tolerations=[{"operator": "Exists"}]), "tolerates no taint without a key"),
    (hardened_pod(nodeSelector={"node-role.kubernetes.io/control-plane": ""}),
     "selects no control-plane role"),
    # (A privileged container is refused before admission here: the local API server
    # runs with --allow-privileged=false. The same rule refuses it on other clusters.)
    (hardened_pod(containers=[{"name": "c", "image": "x", "securityContext": {
        "allowPrivilegeEscalation": False, "capabilities": {"add": ["SYS_ADMIN"]}}}]),
     "no capability beyond"),
    (hardened_pod(containers=[{"name": "c", "image": "x"}]), "never escalates"),
    (hardened_pod(containers=[{"name": "c", "image": "x", "ports": [{
        "containerPort": 22, "hostPort": 22}], "securityContext": {
        "allowPrivilegeEscalation": False}}]), "binds no host port"),
])
def test_admission_keeps_the_controllers_pods_within_baseline_and_the_policy(
    controller_api: KubeApi, namespace: str, controller_policy_active: None,
    pod: dict[str, Any], message: str,
) -> None:
    refused_by(lambda: controller_api.apply(
        DEPLOYMENTS, namespace, "escape", workload("Deployment", "escape", pod=pod),
        field_manager="flexinfer-controller"), "flexinfer-controller-pods", message)
    refused_by(lambda: controller_api.create(JOBS, namespace, workload("Job", "escape", pod=pod)),
               "flexinfer-controller-pods", message)


@pytest.mark.parametrize(("volume", "message"), [
    ({"path": "/", "type": "Directory"}, "host paths only under the allowed prefixes"),
    ({"path": "/var/lib/flexinfer/models"}, "as a Directory"),
    ({"path": "/var/lib/flexinfer/models/x.gguf", "type": "File"}, "as a Directory"),
    ({"path": "/var/lib/flexinfer/models-and-more", "type": "Directory"},
     "host paths only under the allowed prefixes"),
])
def test_in_its_own_namespace_the_controllers_host_paths_stay_under_the_prefixes(
    controller_api: KubeApi, controller_policy_active: None, volume: dict[str, Any],
    message: str,
) -> None:
    pod = hardened_pod(volumes=[{"name": "parent", "hostPath": volume}])
    refused_by(lambda: controller_api.create(JOBS, SYSTEM_NAMESPACE,
                                             workload("Job", "escape", pod=pod)),
               "flexinfer-controller-pods", message)


def test_admission_lets_the_controllers_own_pods_through(
    kubectl: Kubectl, controller_api: KubeApi, namespace: str, controller_policy_active: None
) -> None:
    # The directory Job, in the controller's namespace.
    directory = hardened_pod(volumes=[{"name": "parent", "hostPath": {
        "path": "/var/lib/flexinfer/models", "type": "DirectoryOrCreate"}}])
    directory["containers"][0]["securityContext"]["capabilities"]["add"] = ["CHOWN", "FOWNER"]
    controller_api.create(JOBS, SYSTEM_NAMESPACE,
                          workload("Job", "allowed-directory", pod=directory))
    kubectl.ok("delete", "-n", SYSTEM_NAMESPACE, "job", "allowed-directory")
    # A tenant's download: its node directory is a claim.
    cache = hardened_pod(volumes=[{"name": "target", "persistentVolumeClaim": {
        "claimName": "flexinfer-models-x"}}])
    controller_api.create(JOBS, namespace, workload("Job", "allowed-download", pod=cache))
    controller_api.delete(JOBS, namespace, "allowed-download")


def local_volume(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
        "local": {"path": "/var/lib/flexinfer/models/team"},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}},
        "claimRef": {"namespace": "team", "name": "flexinfer-models-x"},
    }
    body.update(spec)
    return {"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "flexinfer"}},
            "spec": {k: v for k, v in body.items() if v is not None}}


def test_the_controllers_volumes_are_local_under_the_prefixes_and_kept(
    kubectl: Kubectl, controller_api: KubeApi, controller_policy_active: None
) -> None:
    volumes = "flexinfer-controller-volumes"
    refused_by(lambda: controller_api.create(PERSISTENT_VOLUMES, "", local_volume(
        "pv-root", local={"path": "/"})), volumes, "under the allowed prefixes")
    refused_by(lambda: controller_api.create(PERSISTENT_VOLUMES, "", local_volume(
        "pv-host", local=None, hostPath={"path": "/var/lib/flexinfer/models/team"})),
        volumes, "local volume")
    refused_by(lambda: controller_api.create(PERSISTENT_VOLUMES, "", local_volume(
        "pv-delete", persistentVolumeReclaimPolicy="Delete")), volumes, "Retain")
    refused_by(lambda: controller_api.create(PERSISTENT_VOLUMES, "", local_volume(
        "pv-system", claimRef={"namespace": "kube-system", "name": "x"})), volumes,
        "tenant's namespace")
    unlabelled = local_volume("pv-unlabelled")
    unlabelled["metadata"]["labels"] = {}
    refused_by(lambda: controller_api.create(PERSISTENT_VOLUMES, "", unlabelled),
               "flexinfer-controller-writes", "managed-by=flexinfer")
    controller_api.create(PERSISTENT_VOLUMES, "", local_volume("pv-allowed"))
    # Nor may it delete one (RBAC: get, create and patch only).
    with pytest.raises(Rejected) as refused:
        controller_api.delete(PERSISTENT_VOLUMES, "", "pv-allowed")
    assert refused.value.status == 403
    kubectl.ok("delete", "pv", "pv-allowed", "--wait=false")


def pod_manifest() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "rbac-pod"},
        "spec": {"containers": [{"name": "c", "image": "flexinfer:0.1.0"}]},
    }


# --- the real processes on their ServiceAccounts' tokens ---------------------------------


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "POD_NAMESPACE": SYSTEM_NAMESPACE}
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, *args], stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def assert_never_forbidden(log: Path) -> None:
    text = log.read_text(errors="replace")
    assert "Forbidden" not in text and " 403" not in text, text[-3000:]


def test_controller_process_works_on_its_service_account(
    kubectl: Kubectl, controller: Kubectl, namespace: str, tmp_path: Path,
    controller_policy_active: None,
) -> None:
    """`python -m flexinfer_k8s --leader-elect` with only the deploy base's rights, and
    under its admission policies: what it renders passes them."""
    shared = {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": "sa-model"},
        "spec": {
            "backend": "vllm",
            "source": "HF://test/sa-model",
            "gpu": {"shared": "sa-group"},
            "serviceLabels": ["sa"],
            # The controller renders its Deployment and Service (with only the deploy
            # base's rights); kwok runs the pod.
            "nodeSelector": {KWOK_NODE_LABEL: KWOK_NODE_LABEL_VALUE},
            "podAnnotations": {READY_DELAY_ANNOTATION: "1s"},
        },
    }
    apply(kubectl, namespace, shared)
    log = tmp_path / "controller.log"
    # The kwok annotations and node label are the local cluster's administrator's to allow.
    policy = tmp_path / "policy.yaml"
    policy.write_text(dev_policy_yaml())
    identity = "sa-controller-0"
    election = "flexinfer-controller-rbac-test"  # not the real lease other suites may use
    process = start(
        [
            "-m", "flexinfer_k8s", "--kubeconfig", controller.kubeconfig,
            "--leader-elect", "--leader-election-id", election, "--identity", identity,
            "--namespace", namespace, "--metrics-port", "0", "--health-port", "0",
            "--bind-address", "127.0.0.1", "--policy", str(policy),
        ],
        log,
    )  # fmt: skip
    try:

        def leading() -> bool:
            result = kubectl.run("get", "-n", SYSTEM_NAMESPACE, f"lease/{election}", "-o", "json")
            if result.returncode != 0:
                return False
            return bool(json.loads(result.stdout)["spec"].get("holderIdentity") == identity)

        wait_until(leading, what="the controller to lead", timeout=60)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        kubectl.patch_status(namespace, "model/sa-model", {"status": {"lastActiveTime": now}})

        def serving() -> dict[str, Any] | None:
            status = kubectl.json("get", "-n", namespace, "model/sa-model").get("status") or {}
            ok = (
                status.get("phase") == "Ready"
                and (status.get("sharedGroup") or {}).get("state") == "Active"
            )
            return status if ok else None

        wait_until(serving, what="sa-model to be Ready and Active", timeout=60)
        deployment = kubectl.json("get", "-n", namespace, "deployment/sa-model")
        assert deployment["spec"]["replicas"] == 1
        assert process.poll() is None, log.read_text()
    finally:
        stop(process)
    assert_never_forbidden(log)


def test_proxy_process_signals_demand_on_its_service_account(
    kubectl: Kubectl, proxy: Kubectl, namespace: str, proxy_policy_active: None, tmp_path: Path
) -> None:
    """`python -m flexinfer_proxy` with only its rights, under the admission policy."""
    parked = {**MODEL, "metadata": {"name": "sa-parked"}}
    apply(kubectl, namespace, parked)
    apply(kubectl, namespace, MODEL_DEPLOYMENT)
    apply(kubectl, namespace, GROUP)
    kubectl.ok(
        "annotate", "-n", namespace, "gpugroup/rbac-group", "demand.ai.flexinfer/rbac-deployment-"
    )
    log = tmp_path / "proxy.log"
    process = subprocess.Popen(
        [
            sys.executable, "-m", "flexinfer_proxy", "--kubeconfig", proxy.kubeconfig,
            "--namespace", namespace, "--host", "127.0.0.1", "--port", "0",
            "--min-queue-wait", "20s",
        ],
        stdout=subprocess.PIPE, stderr=log.open("ab"),
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        assert line.startswith("listening on 127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])

        def knows_both() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
                    ids = {m["id"] for m in json.loads(r.read())["data"]}
            except urllib.error.URLError:
                return False
            return {"sa-parked", "rbac-deployment"} <= ids

        wait_until(knows_both, what="the proxy to list the models", timeout=30)

        def ask(model: str) -> None:
            body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                data=body.encode(),
                headers={"Content-Type": "application/json"},
            )
            # The answer (503 once the queue wait passes) does not matter here.
            try:
                with urllib.request.urlopen(request, timeout=30):
                    pass
            except (urllib.error.URLError, TimeoutError):
                pass

        askers = [
            threading.Thread(target=ask, args=(name,), daemon=True)
            for name in ("sa-parked", "rbac-deployment")
        ]
        for asker in askers:
            asker.start()

        def demanded() -> bool:
            model = kubectl.json("get", "-n", namespace, "model/sa-parked")
            return bool((model.get("status") or {}).get("lastActiveTime"))

        try:
            wait_until(demanded, what="the proxy to record demand on sa-parked", timeout=30)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{log.read_text()[-3000:]}") from None

        def queued() -> dict[str, Any] | None:
            group = kubectl.json("get", "-n", namespace, "gpugroup/rbac-group")
            annotations = group["metadata"].get("annotations") or {}
            value = annotations.get("demand.ai.flexinfer/rbac-deployment")
            return json.loads(value) if value else None

        report = wait_until(queued, what="the proxy's demand annotation", timeout=30)
        assert report["queued"] >= 1
    finally:
        stop(process)
    assert_never_forbidden(log)
