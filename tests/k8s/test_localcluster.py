"""The local control plane behaves like a cluster, and like our users' homelab ones:
scheduling onto tainted kwok GPU nodes and an untainted CPU node, the `local-path`
StorageClass (ReadWriteOnce, WaitForFirstConsumer) and pre-populated claims, annotated
readiness delays, Jobs, garbage collection, RBAC, isolation and clean stops.

Every wait is a polling wait with a generous deadline; durations are checked only
against the timestamps the cluster itself recorded.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from flexinfer_devcluster.assets import ensure_assets
from flexinfer_devcluster.localcluster import (
    COMPLETE_DELAY_ANNOTATION,
    GPU_NODE_TAINT,
    GPU_NODE_TOLERATION,
    GPU_RESOURCE,
    READY_DELAY_ANNOTATION,
    STORAGE_CLASS,
    TERMINATE_DELAY_ANNOTATION,
    KwokNode,
    LocalCluster,
    LocalClusterError,
    processes_mentioning,
)
from tests.polling import wait_until

pytestmark = pytest.mark.k8s


@pytest.fixture
def namespace(local_cluster: LocalCluster) -> Iterator[str]:
    core = client.CoreV1Api(local_cluster.api_client)
    name = f"lc-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    # Pods need the namespace's default ServiceAccount, which a controller creates.
    wait_until(
        lambda: _found(lambda: core.read_namespaced_service_account("default", name)),
        what=f"ServiceAccount {name}/default",
    )
    yield name
    core.delete_namespace(name)


def _found(read: Any) -> bool:
    try:
        read()
    except client.ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def _pod_template(
    app: str,
    *,
    annotations: dict[str, str],
    gpus: int = 1,
    restart: str = "Always",
    tolerate_gpu_nodes: bool = True,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": restart,
        "terminationGracePeriodSeconds": 5,
        "containers": [
            {
                "name": "server",
                "image": "example.invalid/model-server:1",
                "resources": {"limits": {GPU_RESOURCE: str(gpus)}} if gpus else {},
            }
        ],
    }
    if tolerate_gpu_nodes:
        spec["tolerations"] = [dict(GPU_NODE_TOLERATION)]
    return {"metadata": {"labels": {"app": app}, "annotations": annotations}, "spec": spec}


def _pods(core: Any, namespace: str, app: str) -> list[Any]:
    return list(core.list_namespaced_pod(namespace, label_selector=f"app={app}").items)


def _condition(pod: Any, kind: str) -> Any:
    for condition in pod.status.conditions or []:
        if condition.type == kind:
            return condition
    return None


def _seconds_between(earlier: datetime, later: datetime) -> float:
    return (later - earlier).total_seconds()


def test_gpu_nodes_advertise_gpus_and_are_tainted_and_a_cpu_node_is_not(
    local_cluster: LocalCluster,
) -> None:
    nodes = {
        n.metadata.name: n
        for n in client.CoreV1Api(local_cluster.api_client).list_node().items
        if n.metadata.name.startswith("kwok-")
    }
    assert set(nodes) == {"kwok-gpu-0", "kwok-gpu-1", "kwok-cpu-0"}
    for name, node in nodes.items():
        assert node.metadata.labels["kubernetes.io/hostname"] == name
        assert _condition(node, "Ready").status == "True"
        taints = [(t.key, t.value, t.effect) for t in node.spec.taints or []]
        if name.startswith("kwok-gpu-"):
            assert node.status.capacity[GPU_RESOURCE] == "1"
            assert node.status.allocatable[GPU_RESOURCE] == "1"
            assert taints == [("dedicated", "gpu", "NoSchedule")]
        else:
            assert GPU_RESOURCE not in node.status.capacity
            assert taints == []


def test_a_gpu_pod_without_the_toleration_stays_pending_naming_the_taint(
    local_cluster: LocalCluster, namespace: str
) -> None:
    core = client.CoreV1Api(local_cluster.api_client)
    template = _pod_template("untolerated", annotations={}, tolerate_gpu_nodes=False)
    core.create_namespaced_pod(
        namespace,
        {"metadata": {"name": "untolerated", **template["metadata"]}, "spec": template["spec"]},
    )
    unschedulable = wait_until(
        lambda: (
            (c := _condition(core.read_namespaced_pod("untolerated", namespace), "PodScheduled"))
            and c.status == "False"
            and c
        ),
        what="the scheduler to report the untolerated pod unschedulable",
    )
    # The two GPU nodes refuse it for their taint, the CPU node for its missing GPU.
    assert "2 node(s) had untolerated taint(s)" in unschedulable.message
    assert f"1 Insufficient {GPU_RESOURCE}" in unschedulable.message


def test_a_pod_without_a_gpu_or_toleration_runs_on_the_cpu_node(
    local_cluster: LocalCluster, namespace: str
) -> None:
    core = client.CoreV1Api(local_cluster.api_client)
    template = _pod_template("plain", annotations={}, gpus=0, tolerate_gpu_nodes=False)
    core.create_namespaced_pod(
        namespace,
        {"metadata": {"name": "plain", **template["metadata"]}, "spec": template["spec"]},
    )
    pod = wait_until(
        lambda: (p := core.read_namespaced_pod("plain", namespace)).spec.node_name and p,
        what="the plain pod to be scheduled",
    )
    assert pod.spec.node_name == "kwok-cpu-0"


def test_the_only_storage_class_is_the_default_rwo_local_path(
    local_cluster: LocalCluster,
) -> None:
    storage = client.StorageV1Api(local_cluster.api_client)
    classes = storage.list_storage_class().items
    assert [c.metadata.name for c in classes] == [STORAGE_CLASS]
    [local_path] = classes
    assert local_path.metadata.annotations["storageclass.kubernetes.io/is-default-class"] == (
        "true"
    )
    assert local_path.provisioner == "rancher.io/local-path"
    assert local_path.volume_binding_mode == "WaitForFirstConsumer"
    volumes = client.CoreV1Api(local_cluster.api_client).list_persistent_volume(
        label_selector="flexinfer.dev/static=yes"
    ).items
    assert volumes
    for volume in volumes:
        assert volume.spec.access_modes == ["ReadWriteOnce"]
        assert volume.spec.storage_class_name == STORAGE_CLASS


def _claim(name: str, mode: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "1Gi"}}},
    }


def _claim_pod(name: str, claim: str) -> dict[str, Any]:
    template = _pod_template(name, annotations={}, gpus=0, tolerate_gpu_nodes=False)
    template["spec"]["volumes"] = [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]
    template["spec"]["containers"][0]["volumeMounts"] = [{"name": "v", "mountPath": "/v"}]
    return {"metadata": {"name": name, **template["metadata"]}, "spec": template["spec"]}


def test_a_rwo_claim_binds_for_its_first_pod_and_a_rwx_claim_never_binds(
    local_cluster: LocalCluster, namespace: str
) -> None:
    core = client.CoreV1Api(local_cluster.api_client)
    core.create_namespaced_persistent_volume_claim(namespace, _claim("rwo", "ReadWriteOnce"))
    core.create_namespaced_persistent_volume_claim(namespace, _claim("rwx", "ReadWriteMany"))
    # WaitForFirstConsumer: no pod, no binding, even for a claim a volume fits.
    claim = core.read_namespaced_persistent_volume_claim("rwo", namespace)
    assert claim.spec.storage_class_name == STORAGE_CLASS  # the default class, filled in
    assert claim.status.phase == "Pending"
    core.create_namespaced_pod(namespace, _claim_pod("uses-rwo", "rwo"))
    core.create_namespaced_pod(namespace, _claim_pod("uses-rwx", "rwx"))
    wait_until(
        lambda: core.read_namespaced_persistent_volume_claim("rwo", namespace).status.phase
        == "Bound",
        what="the ReadWriteOnce claim to bind once its pod is scheduled",
    )
    events = wait_until(
        lambda: [
            e
            for e in core.list_namespaced_event(
                namespace, field_selector="involvedObject.name=rwx"
            ).items
            if "rancher.io/local-path" in (e.message or "")
        ],
        what="the ReadWriteMany claim to wait for a provisioner",
    )
    assert events
    assert core.read_namespaced_persistent_volume_claim("rwx", namespace).status.phase == (
        "Pending"
    )


def test_a_populated_claim_binds_to_its_own_files(
    local_cluster: LocalCluster, namespace: str
) -> None:
    core = client.CoreV1Api(local_cluster.api_client)
    directory = local_cluster.populate_claim(
        namespace, "mine", files={"m/lib.so": b"\x7fELF", "m/config.json": "{}"}
    )
    assert (directory / "m" / "lib.so").read_bytes() == b"\x7fELF"
    claim = wait_until(
        lambda: (c := core.read_namespaced_persistent_volume_claim("mine", namespace)).status.phase
        == "Bound"
        and c,
        what="the populated claim to bind without a pod",
    )
    volume = core.read_persistent_volume(claim.spec.volume_name)
    assert volume.spec.host_path.path == str(directory)
    assert volume.spec.claim_ref.name == "mine"
    assert volume.spec.access_modes == ["ReadWriteOnce"]


def test_deployment_pod_becomes_ready_after_its_delay_and_leaves_at_zero(
    local_cluster: LocalCluster, namespace: str
) -> None:
    core = client.CoreV1Api(local_cluster.api_client)
    apps = client.AppsV1Api(local_cluster.api_client)
    delay_seconds = 3
    apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "model-a"},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "model-a"}},
                "template": _pod_template(
                    "model-a",
                    annotations={
                        READY_DELAY_ANNOTATION: f"{delay_seconds}s",
                        TERMINATE_DELAY_ANNOTATION: "1s",
                    },
                ),
            },
        },
    )
    apps.patch_namespaced_deployment_scale("model-a", namespace, {"spec": {"replicas": 1}})

    pods = wait_until(
        lambda: [p for p in _pods(core, namespace, "model-a") if p.spec.node_name],
        what="a model-a pod bound to a node",
    )
    node = core.read_node(pods[0].spec.node_name)
    assert node.metadata.annotations["kwok.x-k8s.io/node"] == "fake"

    ready = wait_until(
        lambda: next(
            (
                p
                for p in _pods(core, namespace, "model-a")
                if _condition(p, "Ready") is not None and _condition(p, "Ready").status == "True"
            ),
            None,
        ),
        what="the model-a pod to become Ready",
    )
    assert ready.status.phase == "Running"
    # kwok records when the container started and when it turned Ready; the gap is the
    # annotated load time (timestamps have one-second resolution, so floor-to-floor it
    # cannot be shorter than the delay).
    became_ready = _condition(ready, "Ready").last_transition_time
    assert _seconds_between(ready.status.start_time, became_ready) >= delay_seconds

    apps.patch_namespaced_deployment_scale("model-a", namespace, {"spec": {"replicas": 0}})
    wait_until(
        lambda: not _pods(core, namespace, "model-a") or None,
        what="model-a's pod to be gone after scaling to zero",
    )
    assert apps.read_namespaced_deployment("model-a", namespace).status.ready_replicas in (None, 0)


def test_a_pod_wanting_more_gpus_than_a_node_has_stays_pending(
    local_cluster: LocalCluster, namespace: str
) -> None:
    core = client.CoreV1Api(local_cluster.api_client)
    template = _pod_template("greedy", annotations={}, gpus=2)
    core.create_namespaced_pod(
        namespace,
        {"metadata": {"name": "greedy", **template["metadata"]}, "spec": template["spec"]},
    )
    unschedulable = wait_until(
        lambda: (
            (c := _condition(core.read_namespaced_pod("greedy", namespace), "PodScheduled"))
            and c.status == "False"
            and c
        ),
        what="the scheduler to report the greedy pod unschedulable",
    )
    assert unschedulable.reason == "Unschedulable"
    assert GPU_RESOURCE in unschedulable.message


def test_job_pods_run_to_completion_and_deleting_the_job_deletes_them(
    local_cluster: LocalCluster, namespace: str
) -> None:
    core = client.CoreV1Api(local_cluster.api_client)
    batch = client.BatchV1Api(local_cluster.api_client)
    batch.create_namespaced_job(
        namespace,
        {
            "metadata": {"name": "finetune"},
            "spec": {
                "backoffLimit": 0,
                "template": _pod_template(
                    "finetune",
                    annotations={READY_DELAY_ANNOTATION: "1s", COMPLETE_DELAY_ANNOTATION: "2s"},
                    restart="Never",
                ),
            },
        },
    )
    wait_until(
        lambda: [p for p in _pods(core, namespace, "finetune") if p.status.phase == "Running"],
        what="the Job's pod to run",
    )
    job = wait_until(
        lambda: (j := batch.read_namespaced_job("finetune", namespace)).status.succeeded and j,
        what="the Job to succeed",
    )
    assert any(c.type == "Complete" and c.status == "True" for c in job.status.conditions)
    pods = _pods(core, namespace, "finetune")
    assert [p.status.phase for p in pods] == ["Succeeded"]
    assert pods[0].metadata.owner_references[0].kind == "Job"

    batch.delete_namespaced_job("finetune", namespace, propagation_policy="Background")
    wait_until(
        lambda: not _pods(core, namespace, "finetune") or None,
        what="the garbage collector to delete the Job's pods",
    )


def test_deleting_an_owner_deletes_its_dependents(
    local_cluster: LocalCluster, namespace: str
) -> None:
    core = client.CoreV1Api(local_cluster.api_client)
    apps = client.AppsV1Api(local_cluster.api_client)
    apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "model-b"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "model-b"}},
                "template": _pod_template("model-b", annotations={}),
            },
        },
    )
    wait_until(lambda: _pods(core, namespace, "model-b"), what="model-b's pod")
    replica_sets = apps.list_namespaced_replica_set(namespace).items
    assert [rs.metadata.owner_references[0].name for rs in replica_sets] == ["model-b"]

    apps.delete_namespaced_deployment("model-b", namespace, propagation_policy="Background")
    wait_until(
        lambda: (
            not apps.list_namespaced_replica_set(namespace).items
            and not _pods(core, namespace, "model-b")
        ),
        what="the garbage collector to delete model-b's ReplicaSet and pod",
    )


def test_a_service_account_without_rights_is_refused_with_403(
    local_cluster: LocalCluster, namespace: str
) -> None:
    core = client.CoreV1Api(local_cluster.api_client)
    rbac = client.RbacAuthorizationV1Api(local_cluster.api_client)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "nobody"}})
    token = core.create_namespaced_service_account_token(
        "nobody", namespace, {"spec": {"expirationSeconds": 600}}
    ).status.token

    as_nobody = client.CoreV1Api(local_cluster.api_client_for_token(token))
    with pytest.raises(client.ApiException) as refused:
        as_nobody.list_namespaced_pod(namespace)
    assert refused.value.status == 403
    assert f"system:serviceaccount:{namespace}:nobody" in refused.value.body

    # The same token works once RBAC grants the verb: the 403 was authorization.
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "nobody-reads-pods"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "nobody", "namespace": namespace}],
        },
    )
    wait_until(lambda: _lists(as_nobody, namespace), what="the RoleBinding to take effect")


def _lists(core: Any, namespace: str) -> bool:
    try:
        core.list_namespaced_pod(namespace)
    except client.ApiException as error:
        if error.status == 403:
            return False
        raise
    return True


def test_two_clusters_run_side_by_side_and_stop_leaves_nothing(
    local_cluster: LocalCluster,
) -> None:
    syncs = "--concurrent-deployment-syncs=7"
    other = LocalCluster(nodes=[KwokNode(name="other-gpu-0", gpus=2)], name="flexinfer-other",
                         extra_args={"kube-controller-manager": [syncs]})
    assert KwokNode(name="n").taints == (GPU_NODE_TAINT,)
    assert KwokNode(name="n", gpus=0).taints == ()
    other.start()
    try:
        assert other.server != local_cluster.server
        assert other.workdir != local_cluster.workdir
        mine = {
            n.metadata.name for n in client.CoreV1Api(local_cluster.api_client).list_node().items
        }
        theirs = {n.metadata.name for n in client.CoreV1Api(other.api_client).list_node().items}
        assert theirs == {"other-gpu-0"}
        assert not mine & theirs
        assert other.kubectl("get", "nodes", "-o", "name").stdout.split() == ["node/other-gpu-0"]
        workdir: Path = other.workdir
        pids = other.pids()
        assert set(pids) == {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        }
        # A component's extra flags (a benchmark's setting) reach it, and only it.
        def argv(name: str) -> list[bytes]:
            return Path(f"/proc/{pids[name]}/cmdline").read_bytes().split(b"\0")

        assert syncs.encode() in argv("kube-controller-manager")
        assert syncs.encode() not in argv("kube-scheduler")
    finally:
        other.stop()

    assert not workdir.exists()
    assert processes_mentioning(str(workdir)) == []
    for name, pid in pids.items():
        assert not Path(f"/proc/{pid}").exists(), f"{name} (pid {pid}) survived stop()"
    # The session cluster is untouched.
    local_cluster.check_alive()
    assert client.CoreV1Api(local_cluster.api_client).list_node().items


def test_a_binary_that_dies_at_start_is_named_with_its_log(tmp_path: Path) -> None:
    real = ensure_assets(build=False)
    broken = tmp_path / "assets"
    broken.mkdir()
    for binary in real.iterdir():
        (broken / binary.name).symlink_to(binary)
    (broken / "kube-apiserver").unlink()
    (broken / "kube-apiserver").write_text(
        "#!/bin/sh\necho 'Error: unknown flag: --pretend-this-broke' >&2\nexit 3\n"
    )
    (broken / "kube-apiserver").chmod(0o755)

    name = f"flexinfer-broken-{uuid.uuid4().hex[:8]}"  # unique: other runs may be going on
    cluster = LocalCluster(assets_dir=broken, name=name)
    with pytest.raises(LocalClusterError) as failure:
        cluster.start()
    message = str(failure.value)
    assert "kube-apiserver exited with code 3" in message
    assert "unknown flag: --pretend-this-broke" in message
    assert processes_mentioning(name) == []


def test_a_port_taken_between_choosing_and_binding_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flexinfer_devcluster import localcluster

    real_free_ports = localcluster._free_ports
    handed_out: list[list[int]] = []

    def racy_free_ports(count: int) -> list[int]:
        ports = real_free_ports(count)
        if not handed_out:  # the first time, someone else grabs etcd's port meanwhile
            ports[0] = squatter.getsockname()[1]
        handed_out.append(ports)
        return ports

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        monkeypatch.setattr(localcluster, "_free_ports", racy_free_ports)
        with LocalCluster(nodes=[KwokNode(name="retry-gpu-0")], name="flexinfer-retry") as cluster:
            assert len(handed_out) == 2
            assert str(handed_out[1][2]) in cluster.server
