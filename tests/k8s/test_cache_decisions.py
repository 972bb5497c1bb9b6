"""The ModelCache reconciler's readings of the cluster, without one: the scheduler's
message of a finetune pod (the GPU itself, or anything else), a Pending claim's hint,
the script's result line."""

from __future__ import annotations

from flexinfer_k8s.reconcile_cache import claim_hint, pod_report, unschedulable, waits_for_gpu
from flexinfer_k8s.render.cache import cache_from_k8s
from flexinfer_k8s.render.cache_dir import DirResult, parse_result
from tests.render.test_backends import cache

GPU = "amd.com/gpu"


def test_only_a_node_short_of_free_gpus_is_a_wait_the_lease_ends() -> None:
    assert waits_for_gpu("0/3 nodes are available: 3 Insufficient amd.com/gpu.", GPU)
    assert waits_for_gpu(
        "0/3 nodes are available: 1 Insufficient amd.com/gpu, 2 node(s) had untolerated "
        "taint {dedicated: gpu}.", GPU)
    assert not waits_for_gpu(
        "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.", GPU)
    assert not waits_for_gpu(
        "0/2 nodes are available: 2 node(s) had untolerated taint {dedicated: gpu}.", GPU)
    assert not waits_for_gpu("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.", GPU)
    assert not waits_for_gpu("0/2 nodes are available: 2 Insufficient cpu.", GPU)


def pending(reason: str, message: str, since: str = "2026-01-01T00:00:00Z") -> dict[str, object]:
    return {"metadata": {"creationTimestamp": since}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": reason, "message": message,
         "lastTransitionTime": since}]}}


def test_the_newest_pods_scheduler_message_and_since_when() -> None:
    stuck = unschedulable([pending("Unschedulable", "0/1 nodes are available: taint")])
    assert stuck is not None
    assert stuck[0] == "0/1 nodes are available: taint"
    assert stuck[1] is not None and stuck[1].year == 2026
    assert unschedulable([pending("SchedulingGated", "gated")]) is None
    assert unschedulable([{"status": {"phase": "Running"}}]) is None
    assert unschedulable([]) is None


def test_a_pending_claims_hint_names_what_to_set() -> None:
    rwx = cache_from_k8s(cache("c"))
    local_path = ('ProvisioningFailed: failed to provision volume with StorageClass '
                  '"local-path": Only support ReadWriteOnce access mode')
    hint = claim_hint(rwx, local_path)
    assert "spec.accessModes: [ReadWriteOnce]" in hint and "kubernetes.io/hostname" in hint
    assert "spec.storageClassName" in claim_hint(
        rwx, 'ProvisioningFailed: storageclass.storage.k8s.io "nfs" not found')
    rwo = cache_from_k8s(cache("c", accessModes=["ReadWriteOnce"]))
    assert "accessModes" not in claim_hint(rwo, local_path)


def test_the_scripts_result_line_is_read_from_the_termination_message() -> None:
    report = parse_result("pip noise\nflexinfer: adopted mlc-chat-config.json (mlc-llm)\n")
    assert report is not None and report.result is DirResult.ADOPTED
    assert report.detail == "mlc-chat-config.json (mlc-llm)"
    assert parse_result("Traceback: boom") is None
    assert parse_result("flexinfer: exploded x") is None
    pod = {"status": {"containerStatuses": [{"state": {"terminated": {
        "message": "flexinfer: present HF://org/repo"}}}]}}
    found = pod_report([pod])
    assert found is not None and found.result is DirResult.PRESENT
