"""Which keys a watched change queues, without a cluster (the cache is filled by hand)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from flexinfer_k8s.controller import Controller
from flexinfer_k8s.metrics import ControllerMetrics
from flexinfer_kube.kubeapi import KubeApi
from flexinfer_kube.resources import (
    CONFIG_MAPS,
    DEPLOYMENTS,
    GPU_GROUPS,
    GPU_LEASES,
    JOBS,
    MODEL_CACHES,
    MODEL_DEPLOYMENTS,
    MODELS,
    PODS,
)


def meta(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": "ns", "resourceVersion": "1", **extra}


def controller() -> Controller:
    ctl = Controller(KubeApi(api_client=None), metrics=ControllerMetrics(CollectorRegistry()),
                     namespaces=["ns"])
    put = ctl.cache.store
    put(MODELS).write_through({"metadata": meta("a"), "spec": {"gpu": {"shared": "g"},
                                                               "cache": {"modelCacheRef": "c"}}})
    put(MODELS).write_through({"metadata": meta("solo"), "spec": {}})
    put(DEPLOYMENTS).write_through(
        {"metadata": meta("a"), "spec": {"selector": {"matchLabels": {"app": "a"}}}}
    )
    put(DEPLOYMENTS).write_through(
        {"metadata": meta("m1"), "spec": {"selector": {"matchLabels": {"app": "m1"}}}}
    )
    put(GPU_GROUPS).write_through({"metadata": meta("gg"), "spec": {"models": [{"name": "m1"}]}})
    return ctl


def test_changes_map_to_the_keys_whose_decision_reads_them() -> None:
    ctl = controller()
    pod = {"metadata": meta("a-1", labels={"app": "a"})}
    assert ctl.keys_for(PODS, pod) == {("shared", "ns", "g")}
    m1_pod = {"metadata": meta("m1-1", labels={"app": "m1"})}
    assert ctl.keys_for(PODS, m1_pod) == {("gpugroup", "ns", "gg")}
    assert ctl.keys_for(PODS, {"metadata": meta("x", labels={"app": "x"})}) == set()
    # A member's pod by its group label, even when its Deployment is gone.
    orphan = {"metadata": meta("gone-1", labels={"ai.flexinfer/group": "g",
                                                  "ai.flexinfer/kind": "Model"})}
    assert ctl.keys_for(PODS, orphan) == {("shared", "ns", "g")}
    assert ctl.keys_for(MODELS, {"metadata": meta("solo"), "spec": {}}) == {
        ("model", "ns", "solo"), ("model-workload", "ns", "solo"),
    }
    assert ctl.keys_for(MODEL_DEPLOYMENTS, {"metadata": meta("m1")}) == {
        ("gpugroup", "ns", "gg"), ("md-workload", "ns", "m1"),
    }
    # The workload a Deployment or Service belongs to is reconciled when it changes.
    assert ("model-workload", "ns", "a") in ctl.keys_for(DEPLOYMENTS, {"metadata": meta("a")})
    lease = {
        "metadata": meta("c-gpu-lease", ownerReferences=[{"kind": "ModelCache", "name": "c"}]),
        "spec": {"group": "g"},
    }
    assert ctl.keys_for(GPU_LEASES, lease) == {("shared", "ns", "g"), ("modelcache", "ns", "c")}
    legacy = {"metadata": meta("gpu-lease-g", labels={"ai.flexinfer/gpu-lease": "g"}), "data": {}}
    assert ctl.keys_for(CONFIG_MAPS, legacy) == {("shared", "ns", "g")}
    assert ctl.keys_for(MODEL_CACHES, {"metadata": meta("c")}) == {
        ("modelcache", "ns", "c"),
        ("shared", "ns", "g"),  # a references the cache: its readiness changes a's runnable
        ("model-workload", "ns", "a"),  # and a's CacheReady condition and volume
    }
    job = {"metadata": meta("c-finetune", ownerReferences=[{"kind": "ModelCache", "name": "c"}])}
    assert ctl.keys_for(JOBS, job) == {("modelcache", "ns", "c")}
    assert ctl.all_keys() == {("shared", "ns", "g"), ("model", "ns", "solo"),
                              ("gpugroup", "ns", "gg"), ("model-workload", "ns", "a"),
                              ("model-workload", "ns", "solo")}


def test_standalone_model_deployments_get_their_own_key() -> None:
    ctl = controller()
    put = ctl.cache.store
    solo = {"metadata": meta("solo-md"), "spec": {}}
    # gpuGroupRef names gg, which does not list m2: a membership conflict, held at zero
    # by m2's own key (not run by gg, and not standalone either).
    unlisted = {"metadata": meta("m2"), "spec": {"gpuGroupRef": "gg"}}
    listed = {"metadata": meta("m1"), "spec": {}}  # in gg's spec.models, no gpuGroupRef
    for md in (solo, unlisted, listed):
        put(MODEL_DEPLOYMENTS).write_through(md)
    put(DEPLOYMENTS).write_through(
        {"metadata": meta("solo-md"), "spec": {"selector": {"matchLabels": {"app": "solo-md"}}}}
    )
    assert ctl.keys_for(MODEL_DEPLOYMENTS, solo) == {
        ("modeldeployment", "ns", "solo-md"), ("md-workload", "ns", "solo-md"),
    }
    assert ctl.keys_for(MODEL_DEPLOYMENTS, unlisted) == {
        ("modeldeployment", "ns", "m2"), ("md-workload", "ns", "m2"),
    }
    assert ctl.keys_for(MODEL_DEPLOYMENTS, listed) == {
        ("gpugroup", "ns", "gg"), ("md-workload", "ns", "m1"),
    }
    assert ctl.cache.model_deployment_on_its_own("ns", "m1") is None
    on_its_own = ctl.cache.model_deployment_on_its_own("ns", "m2")
    assert on_its_own is not None and on_its_own[1].in_conflict
    pod = {"metadata": meta("solo-md-1", labels={"app": "solo-md"})}
    assert ctl.keys_for(PODS, pod) == {("modeldeployment", "ns", "solo-md")}
    assert ("modeldeployment", "ns", "solo-md") in ctl.all_keys()
    assert ("modeldeployment", "ns", "m1") not in ctl.all_keys()
    # m1 leaves its group: the group's old object queues m1's standalone key.
    old_group = ctl.cache.get(GPU_GROUPS, "ns", "gg")
    assert old_group is not None
    put(GPU_GROUPS).write_through({"metadata": meta("gg", resourceVersion="2"),
                                   "spec": {"models": [{"name": "m2"}]}})
    assert ("modeldeployment", "ns", "m1") in ctl.keys_for(GPU_GROUPS, old_group)


def test_a_model_deployment_listed_by_two_groups_queues_both_and_its_own_key() -> None:
    ctl = controller()
    put = ctl.cache.store
    put(MODEL_DEPLOYMENTS).write_through({"metadata": meta("m1"), "spec": {}})
    second = {"metadata": meta("g2"), "spec": {"models": [{"name": "m1"}]}}
    # g2 starts listing m1 (the informer has stored it when the handler runs): gg,
    # which listed it first, must let it go, and m1's own key holds it at zero.
    put(GPU_GROUPS).write_through(second)
    assert ctl.keys_for(MODEL_DEPLOYMENTS, {"metadata": meta("m1"), "spec": {}}) == {
        ("gpugroup", "ns", "gg"),
        ("gpugroup", "ns", "g2"),
        ("modeldeployment", "ns", "m1"),
        ("md-workload", "ns", "m1"),
    }
    assert ctl.keys_for(GPU_GROUPS, second) == {
        ("gpugroup", "ns", "gg"),
        ("gpugroup", "ns", "g2"),
        ("modeldeployment", "ns", "m1"),
        ("md-workload", "ns", "m1"),  # its pods' group label changes
    }


def test_a_group_change_queues_the_model_deployments_that_name_it() -> None:
    ctl = controller()
    named = {"metadata": meta("m3"), "spec": {"gpuGroupRef": "gg"}}
    ctl.cache.store(MODEL_DEPLOYMENTS).write_through(named)
    group = ctl.cache.get(GPU_GROUPS, "ns", "gg")
    assert group is not None
    # gg lists only m1; m3's conflict message says whether gg exists.
    assert ("modeldeployment", "ns", "m3") in ctl.keys_for(GPU_GROUPS, group)


def queued_after(ctl: Controller, resource: Any, old: Any, new: Any) -> set[Any]:
    ctl._handler(resource)(old, new)
    keys = set()
    while (key := ctl.queue.get(timeout=0)) is not None:
        keys.add(key)
        ctl.queue.done(key)
    return keys


def test_the_elections_status_writes_and_rollout_progress_queue_no_render() -> None:
    """A burst of swaps is mostly status updates; rendering reads none of them but the
    fields it writes itself, so they queue the decisions only."""
    ctl = controller()
    model = {"metadata": meta("a"), "spec": {"gpu": {"shared": "g"}},
             "status": {"phase": "Idle", "conditions": [
                 {"type": "Rendered", "status": "True", "reason": "Rendered"}]}}
    elected = {**model, "metadata": meta("a", resourceVersion="2"),
               "status": {**model["status"], "phase": "Ready"}}
    assert queued_after(ctl, MODELS, model, elected) == {("shared", "ns", "g")}
    # its own condition gone (someone else's write dropped it): render to put it back
    dropped = {**elected, "status": {"phase": "Ready", "conditions": []}}
    assert ("model-workload", "ns", "a") in queued_after(ctl, MODELS, elected, dropped)
    # a user's label, a spec change, a deletion and a creation are rendered
    labelled = {**model, "metadata": meta("a", labels={"team": "x"})}
    assert ("model-workload", "ns", "a") in queued_after(ctl, MODELS, model, labelled)
    resized = {**model, "spec": {"gpu": {"shared": "g", "count": 2}}}
    assert ("model-workload", "ns", "a") in queued_after(ctl, MODELS, model, resized)
    assert ("model-workload", "ns", "a") in queued_after(ctl, MODELS, model, None)
    assert ("model-workload", "ns", "a") in queued_after(ctl, MODELS, None, model)
    deployment = {"metadata": meta("a"), "spec": {"replicas": 1}, "status": {"readyReplicas": 0}}
    edited = {**deployment, "spec": {"replicas": 1, "template": {"spec": {"x": 1}}}}
    assert ("model-workload", "ns", "a") in queued_after(ctl, DEPLOYMENTS, deployment, edited)


def test_a_deployments_rollout_progress_and_the_echo_of_our_scale_queue_nothing() -> None:
    """No reconcile reads a Deployment's status: the two or three updates the cluster's
    controllers make to it in a swap, and the watch's copy of the controller's own scale
    write (the cache already holds its replicas), would each reconcile the group for
    nothing."""
    ctl = controller()
    deployment = {"metadata": meta("a", generation=3), "spec": {"replicas": 1},
                  "status": {"readyReplicas": 0}}
    rolled = {**deployment, "metadata": meta("a", generation=3, resourceVersion="9"),
              "status": {"readyReplicas": 1, "availableReplicas": 1}}
    assert queued_after(ctl, DEPLOYMENTS, deployment, rolled) == set()
    # What the writer caches after scaling to 0, and what the watch then delivers: the
    # generation moved, the managers' record too, the replicas are the same.
    scaled = {**deployment, "metadata": meta("a", generation=3, resourceVersion="10"),
              "spec": {"replicas": 0}}
    echo = {**scaled, "metadata": meta("a", generation=4, resourceVersion="10",
                                       managedFields=[{"manager": "flexinfer-scale"}])}
    assert queued_after(ctl, DEPLOYMENTS, scaled, echo) == set()
    # Anything a reconcile reads still queues the group's decision and its render.
    both = {("shared", "ns", "g"), ("model-workload", "ns", "a")}
    for changed in (
        {**rolled, "spec": {"replicas": 2}},  # someone scaled it
        {**rolled, "metadata": meta("a", generation=3, labels={"team": "x"})},
        {**rolled, "metadata": meta("a", generation=3, deletionTimestamp="2026-12-06T00:00:00Z")},
    ):
        assert queued_after(ctl, DEPLOYMENTS, rolled, changed) == both
    assert queued_after(ctl, DEPLOYMENTS, None, deployment) == both
    assert queued_after(ctl, DEPLOYMENTS, deployment, None) == both
    # a cache's status is what a workload reads of it
    cache = {"metadata": meta("c"), "status": {"ready": False}}
    ready = {**cache, "status": {"ready": True}}
    assert ("model-workload", "ns", "a") in queued_after(ctl, MODEL_CACHES, cache, ready)
