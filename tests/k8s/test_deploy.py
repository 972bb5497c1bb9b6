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
    assert "(Forbidden)" in result.stderr, result.stderr


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
    assert kinds.count("ServiceAccount") == 2
    assert kinds.count("ClusterRole") == 2
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
        if doc["kind"] == "Deployment"
        for container in doc["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"flexinfer:0.1.0"}


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


def test_controller_can_do_its_job(kubectl: Kubectl, controller: Kubectl, namespace: str) -> None:
    apply(kubectl, namespace, MODEL)
    apply(kubectl, namespace, MODEL_DEPLOYMENT)
    apply(kubectl, namespace, GROUP)
    for plural in ("models", "gpuleases", "gpugroups", "modelcaches", "modeldeployments"):
        controller.ok("get", f"{plural}.ai.flexinfer", "--all-namespaces")
    status = {"status": {"phase": "Idle", "message": "nobody asked for it"}}
    controller.patch_status(namespace, "model/rbac-model", status)
    controller.patch_status(namespace, "gpugroup/rbac-group", {"status": {"phase": "Idle"}})
    controller.patch_status(
        namespace, "modeldeployment/rbac-deployment", {"status": {"phase": "Idle"}}
    )
    # Render, then scale through the scale subresource.
    controller.ok("create", "deployment", "rbac-model", "-n", namespace, "--image=flexinfer:0.1.0")
    controller.ok("scale", "-n", namespace, "deployment/rbac-model", "--replicas=0")
    assert kubectl.json("get", "-n", namespace, "deployment/rbac-model")["spec"]["replicas"] == 0
    controller.ok("create", "service", "clusterip", "rbac-model", "-n", namespace, "--tcp=8000")
    controller.ok("get", "pods", "-n", namespace)
    lease = {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "GPULease",
        "metadata": {"name": "rbac-lease"},
        "spec": {"group": "homelab-gpu", "owner": "finetune"},
    }
    apply(controller, namespace, lease)
    controller.ok("delete", "-n", namespace, "gpulease/rbac-lease")
    controller.ok(
        "create", "configmap", "gpu-lease-homelab-gpu", "-n", namespace, "--from-literal=group=g"
    )
    controller.ok("create", "job", "rbac-finetune", "-n", namespace, "--image=flexinfer:0.1.0")
    controller.ok("delete", "-n", namespace, "job/rbac-finetune")
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "rbac-model.preempted"},
        "involvedObject": {"kind": "Model", "name": "rbac-model", "namespace": namespace},
        "reason": "Preempted",
        "message": "rbac test",
        "type": "Normal",
    }
    controller.ok("create", "-n", namespace, "-f", "-", stdin=json.dumps(event))
    election = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "rbac-election"},
        "spec": {"holderIdentity": "controller-0", "leaseDurationSeconds": 15},
    }
    controller.ok("create", "-n", SYSTEM_NAMESPACE, "-f", "-", stdin=json.dumps(election))
    controller.ok("delete", "-n", SYSTEM_NAMESPACE, "lease/rbac-election")


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
    # The same refusal seen by the kubernetes client: HTTP 403.
    api = k8s_client.CoreV1Api(
        local_cluster.api_client_for_token(token_for(kubectl, CONTROLLER_SA))
    )
    with pytest.raises(k8s_client.ApiException) as refused:
        api.read_namespaced_secret("rbac-secret", namespace)
    assert refused.value.status == 403


def test_proxy_signals_demand_and_nothing_more(
    kubectl: Kubectl, proxy: Kubectl, namespace: str, proxy_policy_active: None
) -> None:
    apply(kubectl, namespace, MODEL)
    apply(kubectl, namespace, MODEL_DEPLOYMENT)
    apply(kubectl, namespace, GROUP)
    for plural in ("models", "modeldeployments", "gpugroups"):
        proxy.ok("get", f"{plural}.ai.flexinfer", "--all-namespaces")
    proxy.ok("get", "services", "--all-namespaces")
    now = "2026-11-29T17:00:00Z"
    proxy.patch_status(namespace, "model/rbac-model", {"status": {"lastActiveTime": now}})
    proxy.patch_status(
        namespace, "modeldeployment/rbac-deployment", {"status": {"lastAccessTime": now}}
    )
    demand = json.dumps({"queued": 1, "oldestWaiting": now, "reportedAt": now})
    patch = {"metadata": {"annotations": {"demand.ai.flexinfer/rbac-deployment": demand}}}
    proxy.ok(
        "patch", "-n", namespace, "gpugroup/rbac-group", "--type=merge", "-p", json.dumps(patch)
    )
    stored = kubectl.json("get", "-n", namespace, "model/rbac-model")
    assert stored["status"]["lastActiveTime"] == now

    assert_forbidden(proxy.run("delete", "-n", namespace, "model/rbac-model"))
    spec_patch = json.dumps({"spec": {"gpu": {"priority": 1000}}})
    assert_forbidden(
        proxy.run("patch", "-n", namespace, "model/rbac-model", "--type=merge", "-p", spec_patch)
    )
    assert_forbidden(proxy.run("get", "secrets", "-n", namespace))
    assert_forbidden(proxy.run("get", "gpuleases.ai.flexinfer", "-n", namespace))
    kubectl.ok("create", "deployment", "rbac-scaled", "-n", namespace, "--image=flexinfer:0.1.0")
    assert_forbidden(proxy.run("scale", "-n", namespace, "deployment/rbac-scaled", "--replicas=0"))


def test_proxy_writes_are_narrowed_to_its_fields(
    kubectl: Kubectl, proxy: Kubectl, namespace: str, proxy_policy_active: None
) -> None:
    """RBAC allows the patch; the admission policy allows only the proxy's fields."""
    apply(kubectl, namespace, MODEL)
    apply(kubectl, namespace, MODEL_DEPLOYMENT)
    apply(kubectl, namespace, GROUP)

    def refused(result: Any, message: str) -> None:
        assert result.returncode != 0, result.stdout
        assert "flexinfer-proxy-writes" in result.stderr, result.stderr
        assert message in result.stderr, result.stderr

    only_demand = "may change only demand.ai.flexinfer/* annotations"
    for patch in (
        {"metadata": {"annotations": {"ai.flexinfer/other": "x"}}},
        {"metadata": {"labels": {"team": "x"}}},
        {"spec": {"antiThrashing": {"enabled": False}}},
    ):
        result = proxy.run(
            "patch", "-n", namespace, "gpugroup/rbac-group", "--type=merge", "-p", json.dumps(patch)
        )
        refused(result, only_demand)
    result = proxy.patch_status(
        namespace, "model/rbac-model", {"status": {"phase": "Ready"}}, check=False
    )
    refused(result, "may change only status.lastActiveTime of a Model")
    result = proxy.patch_status(
        namespace, "modeldeployment/rbac-deployment", {"status": {"phase": "Running"}}, check=False
    )
    refused(result, "may change only status.lastAccessTime of a ModelDeployment")
    # The controller is not narrowed by the policy.
    controller_patch = {"metadata": {"annotations": {"ai.flexinfer/other": "x"}}}
    kubectl.ok(
        "patch", "-n", namespace, "gpugroup/rbac-group", "--type=merge",
        "-p", json.dumps(controller_patch),
    )  # fmt: skip


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
    kubectl: Kubectl, controller: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """`python -m flexinfer_k8s --leader-elect` with only the deploy base's rights."""
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
    identity = "sa-controller-0"
    election = "flexinfer-controller-rbac-test"  # not the real lease other suites may use
    process = start(
        [
            "-m", "flexinfer_k8s", "--kubeconfig", controller.kubeconfig,
            "--leader-elect", "--leader-election-id", election, "--identity", identity,
            "--namespace", namespace, "--metrics-port", "0", "--health-port", "0",
            "--bind-address", "127.0.0.1",
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
        service = kubectl.json("get", "-n", namespace, "service/sa-model")
        assert service["metadata"]["annotations"]["ai.flexinfer/active-services"] == "sa"
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
