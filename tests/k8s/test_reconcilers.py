"""The reconcilers without a cluster: a fake API server, the controller's real stores and
work queue, and a manual clock.

What a real cluster cannot stage on demand: the exact order of writes, a status write
that conflicts (again and again) or is refused, and a scale-up held back by a pod the
live list still shows.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from flexinfer_core.timestamps import format_rfc3339
from flexinfer_k8s.controller import (
    MAX_BACKOFF,
    MAX_IMMEDIATE_RETRIES,
    Controller,
    WorkKey,
    backoff_delay,
)
from flexinfer_k8s.convert_leases import GPU_LEASE_LABEL
from flexinfer_k8s.metrics import ControllerMetrics
from flexinfer_k8s.outcome import Outcome
from flexinfer_k8s.reconcile_shared import DEFAULT_COALESCE
from flexinfer_k8s.render.workloads import GROUP_LABEL, KIND_LABEL, MODEL_LABEL, RenderSettings
from flexinfer_kube.clock import ManualClock
from flexinfer_kube.kubeapi import Conflict, Rejected
from flexinfer_kube.resources import (
    CONFIG_MAPS,
    DEPLOYMENTS,
    GPU_GROUPS,
    MODEL_DEPLOYMENTS,
    MODELS,
    PODS,
    SERVICES,
    Resource,
)

from .fake_api import FakeApi
from .harness import metric_value

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
NS = "ns"
KEY: WorkKey = ("shared", NS, "g")
JSON = dict[str, Any]


def model(
    name: str, *, priority: int = 100, status: JSON | None = None, swap_cooldown: str = "2s"
) -> JSON:
    return {
        "metadata": {"name": name, "namespace": NS, "generation": 1, "uid": f"uid-{name}"},
        "spec": {
            "gpu": {"shared": "g", "priority": priority, "swapCooldown": swap_cooldown},
            "serverless": {"idleTimeout": "5m", "coldStartTimeout": "10s"},
            "serviceLabels": [f"{name}-svc"],
        },
        "status": status or {},
    }


def holding(name: str) -> JSON:
    """The status of a member that holds the card and serves."""
    return {
        "phase": "Ready",
        "observedGeneration": 1,
        "lastActiveTime": format_rfc3339(T0 - timedelta(minutes=10)),
        "sharedGroup": {"groupName": "g", "state": "Active", "queuePosition": 0, "preemptedBy": ""},
    }


def asking(name: str, *, behind: str) -> JSON:
    """The status of a parked member a request just arrived for."""
    return {
        "phase": "Idle",
        "observedGeneration": 1,
        "lastActiveTime": format_rfc3339(T0 - timedelta(seconds=1)),
        "sharedGroup": {
            "groupName": "g",
            "state": "Queued",
            "queuePosition": 1,
            "preemptedBy": behind,
        },
    }


def owner(kind: str, name: str) -> JSON:
    """The controller reference rendering puts on a workload (whose replicas the
    reconcilers then scale, and no other Deployment's)."""
    return {
        "apiVersion": "ai.flexinfer/v1",
        "kind": kind,
        "name": name,
        "uid": f"uid-{name}",
        "controller": True,
    }


def deployment(name: str, replicas: int) -> JSON:
    labels = {MODEL_LABEL: name, KIND_LABEL: "Model"}
    return {
        "metadata": {"name": name, "namespace": NS, "ownerReferences": [owner("Model", name)]},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": {**labels, GROUP_LABEL: "g"}}},
        },
    }


def pod(name: str, *, node: str | None = None) -> JSON:
    return {
        "metadata": {
            "name": f"{name}-0",
            "namespace": NS,
            "labels": {MODEL_LABEL: name, KIND_LABEL: "Model", GROUP_LABEL: "g"},
        },
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def service(name: str) -> JSON:
    return {"metadata": {"name": name, "namespace": NS}}


class World:
    """The fake API server and a controller over it whose informers never start: the
    test puts objects in both, as a watch would, and runs keys one at a time."""

    def __init__(self, *, settings: RenderSettings | None = None) -> None:
        self.api = FakeApi()
        self.clock = ManualClock(T0)
        self.metrics = ControllerMetrics(CollectorRegistry())
        self.controller = Controller(
            self.api,  # type: ignore[arg-type]
            metrics=self.metrics,
            namespaces=[NS],
            clock=self.clock,
            resync_seconds=0,
            render_settings=settings,
        )
        for informer in self.controller.cache.informers:
            informer.healthy = True  # listed: nothing fails open unless a test says so

    def put(self, resource: Resource, obj: JSON) -> None:
        self.controller.cache.store(resource).write_through(self.api.put(resource, obj))

    def delete(self, resource: Resource, name: str) -> None:
        self.api.remove(resource, NS, name)
        self.controller.cache.store(resource).forget(NS, name)

    def run(self, key: WorkKey = KEY) -> Outcome | None:
        """One worker pass over `key`, as the controller's workers do it."""
        self.controller.queue.add(key)
        picked = self.controller.queue.get(timeout=0)
        assert picked == key
        try:
            return self.controller.process(key)
        finally:
            self.controller.queue.done(key)

    def requeued(self, key: WorkKey = KEY) -> bool:
        return len(self.controller.queue) == 1

    def status(self, resource: Resource, name: str) -> JSON:
        return dict(self.api.objects[(resource.plural, NS, name)].get("status") or {})

    def replicas(self, name: str) -> int:
        return int(self.api.objects[("deployments", NS, name)]["spec"]["replicas"])


def a_holds_b_asks(world: World, *, a_priority: int = 100, b_priority: int = 200) -> None:
    """a serves with one pod; b, of higher priority, was just asked for."""
    world.put(MODELS, model("a", priority=a_priority, status=holding("a")))
    world.put(MODELS, model("b", priority=b_priority, status=asking("b", behind="a")))
    world.put(DEPLOYMENTS, deployment("a", 1))
    world.put(DEPLOYMENTS, deployment("b", 0))
    world.put(PODS, pod("a"))
    world.put(SERVICES, service("a"))
    world.put(SERVICES, service("b"))
    world.api.calls.clear()


# --- the write order and a deferred scale-up ------------------------------------------------


def test_a_swap_writes_the_evicted_status_then_scale_down_then_the_event() -> None:
    """The handover's record is a's status (Preempted, naming b), written before the
    scale-down; b's own status is held back (it would say Active, WaitingForGPU: its
    way to serving) and no Service is annotated: the proxy reads the holder from the
    Models' statuses."""
    world = World()
    a_holds_b_asks(world)

    outcome = world.run()

    assert world.api.verbs() == [
        ("PATCH", "models", "a", "status"),
        ("PATCH", "deployments", "a", "scale"),
        ("POST", "events", "Preempted", ""),  # one Event a handover, naming b
    ]
    a = world.status(MODELS, "a")
    assert (a["phase"], a["sharedGroup"]["preemptedBy"]) == ("Preempted", "b")
    assert world.status(MODELS, "b")["sharedGroup"]["state"] == "Queued"  # not written yet
    # b waits for a's pod (the decision knows it from the cache): its scale-up is not
    # even tried; a's pod going away is the watched change that reconciles again, and
    # the key looks again when b's held status falls due.
    assert world.replicas("b") == 0
    assert outcome is not None and outcome.wrote
    assert outcome.next_change_at is not None
    assert outcome.next_change_at <= T0 + DEFAULT_COALESCE


def deferred_until_the_pod_is_gone(world: World, key: WorkKey, *, old: str, new: str) -> None:
    """`old`'s pod leaves the cache but not the API server: `new`'s scale-up waits for
    the live list (the key rechecks within a second), and goes once the pod is gone."""
    world.controller.cache.store(PODS).forget(NS, f"{old}-0")  # the cache: gone
    world.api.calls.clear()

    deferred = world.run(key)

    assert ("LIST", "pods", "", "") in world.api.calls
    assert ("PATCH", "deployments", new, "scale") not in world.api.calls
    assert world.replicas(new) == 0
    assert deferred is not None and deferred.next_change_at is not None
    assert deferred.next_change_at <= T0 + timedelta(seconds=1)

    world.api.remove(PODS, NS, f"{old}-0")  # the API server: gone too
    world.clock.advance(timedelta(seconds=1))
    world.api.calls.clear()
    world.run(key)
    calls = world.api.verbs()
    assert calls.index(("LIST", "pods", "", "")) < calls.index(
        ("PATCH", "deployments", new, "scale")
    )
    assert world.replicas(new) == 1


def test_a_scale_up_the_live_pod_list_contradicts_is_deferred_then_done() -> None:
    """The cache says a's pod is gone; the live list (what a watch a little behind
    cannot see) still has it: b's scale-up waits, then goes once the pod is gone."""
    world = World()
    a_holds_b_asks(world)
    world.run()
    deferred_until_the_pod_is_gone(world, KEY, old="a", new="b")


def gpu_group_member(name: str, replicas: int) -> tuple[JSON, JSON]:
    """A ModelDeployment of GPUGroup gg and its Deployment."""
    labels = {MODEL_LABEL: name, KIND_LABEL: "ModelDeployment"}
    md = {
        "metadata": {"name": name, "namespace": NS, "generation": 1, "uid": f"uid-{name}"},
        "spec": {"backend": "vllm", "model": f"test/{name}", "idleTimeoutSeconds": 300,
                 "gpuGroupRef": "gg"},
    }
    workload = {
        "metadata": {
            "name": name,
            "namespace": NS,
            "ownerReferences": [owner("ModelDeployment", name)],
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": {**labels, GROUP_LABEL: "gg"}}},
        },
    }
    return md, workload


def test_a_gpugroup_scale_up_the_live_pod_list_contradicts_is_deferred_then_done() -> None:
    """The same interlock for a GPUGroup, through the same apply: m1 held the card and
    m2 is queued; once the cache says m1's pod is gone (Graceful drain over) but the
    live list still has it, m2's scale-up waits; it goes once the pod is gone."""
    world = World()
    key: WorkKey = ("gpugroup", NS, "gg")
    world.put(GPU_GROUPS, {
        "metadata": {"name": "gg", "namespace": NS, "generation": 1, "annotations": {
            "demand.ai.flexinfer/m2": json.dumps({
                "queued": 1,
                "oldestWaiting": format_rfc3339(T0 - timedelta(seconds=30)),
                "reportedAt": format_rfc3339(T0),
            }),
        }},
        "spec": {
            "models": [{"name": "m1", "priority": 100}, {"name": "m2", "priority": 100}],
            "scalingPolicy": {"preemptionPolicy": "Graceful", "drainTimeoutSeconds": 60},
            "antiThrashing": {"enabled": False},
        },
        "status": {"phase": "Active", "activeModel": "m1",
                   "lastSwapTime": format_rfc3339(T0 - timedelta(hours=1)), "swapCount": 1},
    })
    for name, replicas in (("m1", 1), ("m2", 0)):
        md, workload = gpu_group_member(name, replicas)
        world.put(MODEL_DEPLOYMENTS, md)
        world.put(DEPLOYMENTS, workload)
    m1_pod = pod("m1")
    m1_pod["metadata"]["labels"] = {MODEL_LABEL: "m1", KIND_LABEL: "ModelDeployment",
                                    GROUP_LABEL: "gg"}
    world.put(PODS, m1_pod)
    world.run(key)  # the swap: m1 scaled down, m2 waits for its pod (Draining)
    assert world.replicas("m1") == 0 and world.replicas("m2") == 0
    assert world.status(GPU_GROUPS, "gg")["activeModel"] == "m2"
    deferred_until_the_pod_is_gone(world, key, old="m1", new="m2")


# --- a packed GPUGroup (docs/election.md 3, "Packing") ---------------------------------------

GIB = 2**30
PACKED = {"chat": 8, "embed": 8, "big": 16}  # GiB, on a 24 GiB card


def demand_report(seconds_ago: float = 5) -> str:
    return json.dumps({
        "queued": 1,
        "oldestWaiting": format_rfc3339(T0 - timedelta(seconds=seconds_ago)),
        "reportedAt": format_rfc3339(T0),
    })


def packed_world(*, device_class: str = "gpu.example.com") -> tuple[World, WorkKey]:
    """GPUGroup gg (a 24 GiB budget): chat (8 GiB) serves, embed (8 GiB) was just asked
    for, big (16 GiB, more important) is parked; the controller has a device class
    (or, with "", none)."""
    world = World(settings=RenderSettings(gpu_device_class=device_class))
    world.put(GPU_GROUPS, {
        "metadata": {"name": "gg", "namespace": NS, "generation": 1, "uid": "uid-gg",
                     "annotations": {"demand.ai.flexinfer/embed": demand_report()}},
        "spec": {
            "vramBudget": "24Gi",
            "models": [{"name": n, "priority": 300 if n == "big" else 100,
                        "vramEstimate": f"{size}Gi"} for n, size in PACKED.items()],
            "scalingPolicy": {"preemptionPolicy": "Graceful", "drainTimeoutSeconds": 60},
            # One queued request never takes the lead from chat: the others join it.
            "antiThrashing": {"enabled": True, "requestQueueThreshold": 5,
                              "hysteresisWindowSeconds": 0},
        },
        "status": {"phase": "Active", "activeModel": "chat",
                   "lastSwapTime": format_rfc3339(T0 - timedelta(hours=1)), "swapCount": 1,
                   "modelStatuses": [{"name": "chat", "state": "Active"}]},
    })  # fmt: skip
    for name in PACKED:
        md, workload = gpu_group_member(name, 1 if name == "chat" else 0)
        if name == "chat":
            md["status"] = {"lastAccessTime": format_rfc3339(T0 - timedelta(seconds=5))}
        world.put(MODEL_DEPLOYMENTS, md)
        world.put(DEPLOYMENTS, workload)
    world.put(PODS, member_pod("chat"))
    world.api.calls.clear()
    return world, ("gpugroup", NS, "gg")


def member_pod(name: str) -> JSON:
    found = pod(name)
    found["metadata"]["labels"] = {MODEL_LABEL: name, KIND_LABEL: "ModelDeployment",
                                   GROUP_LABEL: "gg"}  # fmt: skip
    return found


def member_states(world: World) -> dict[str, str]:
    return {r["name"]: r["state"] for r in world.status(GPU_GROUPS, "gg")["modelStatuses"]}


def test_a_packed_gpugroup_starts_a_member_that_fits_beside_the_holder() -> None:
    """chat holds the card; embed fits beside it (16 of 24 GiB): it is scaled up with
    chat left as it is, both are Active, the group's Packed condition says what they
    take; once embed serves, neither member is told it drains (the proxy would hold
    its requests), and a reconcile with no news writes nothing."""
    world, key = packed_world()
    world.run(key)
    assert (world.replicas("chat"), world.replicas("embed"), world.replicas("big")) == (1, 1, 0)
    assert ("PATCH", "deployments", "chat", "scale") not in world.api.calls
    assert member_states(world) == {"chat": "Active", "embed": "Active", "big": "Idle"}
    status = world.status(GPU_GROUPS, "gg")
    assert status["activeModel"] == "chat"
    assert status["vram"] == {"budget": "24Gi", "used": "16Gi"}
    packed = next(c for c in status["conditions"] if c["type"] == "Packed")
    assert (packed["status"], packed["reason"], packed["message"]) == (
        "True", "CoResident", "chat, embed hold the card together: fits: 16 of 24 GiB used"
    )  # fmt: skip

    world.put(PODS, member_pod("embed"))
    world.run(key)
    for name in ("chat", "embed"):
        assert world.status(MODEL_DEPLOYMENTS, name)["phase"] == "Running", name
    world.api.calls.clear()
    world.run(key)
    assert world.api.verbs(skip=("GET", "LIST")) == []


def test_without_a_device_class_a_budgeted_gpugroup_takes_turns_and_says_why() -> None:
    """The same group on a controller without --gpu-device-class: embed is not started
    beside chat, and the group's Packed condition gives the shared groups' reason."""
    world, key = packed_world(device_class="")
    world.run(key)
    assert (world.replicas("chat"), world.replicas("embed")) == (1, 0)
    assert member_states(world)["embed"] != "Active"
    packed = next(c for c in world.status(GPU_GROUPS, "gg")["conditions"]
                  if c["type"] == "Packed")  # fmt: skip
    assert (packed["status"], packed["reason"]) == ("False", "NoSharedCard")


def test_a_larger_member_evicts_just_enough_and_starts_only_once_the_memory_is_free() -> None:
    """chat and embed hold the card (16 of 24 GiB); big (16 GiB, more important) is asked
    for: embed alone is evicted (8 + 16 fit), scaled to 0 at once and told why; big
    waits while embed's pod holds its 8 GiB, on the live pod list too (the cache
    already says it is gone), and starts beside chat once it is gone."""
    world, key = packed_world()
    world.run(key)
    world.put(PODS, member_pod("embed"))
    world.run(key)
    group = world.controller.cache.get(GPU_GROUPS, NS, "gg")
    assert group is not None
    group = json.loads(json.dumps(group))
    # embed was served a moment ago (its queue is empty: still in use); big is asked for.
    group["metadata"]["annotations"] = {"demand.ai.flexinfer/big": demand_report()}
    embed = world.controller.cache.get(MODEL_DEPLOYMENTS, NS, "embed")
    assert embed is not None
    embed = json.loads(json.dumps(embed))
    embed["status"]["lastAccessTime"] = format_rfc3339(T0 - timedelta(seconds=2))
    world.put(MODEL_DEPLOYMENTS, embed)
    world.put(GPU_GROUPS, group)
    world.api.calls.clear()

    world.run(key)
    assert (world.replicas("chat"), world.replicas("embed"), world.replicas("big")) == (1, 0, 0)
    assert member_states(world) == {"chat": "Active", "embed": "Preempted", "big": "Active"}
    events = [obj for (verb, plural, obj, _) in world.api.calls if verb == "POST"]
    assert "Preempted" in events
    # The cache says embed's pod is gone; the API server still has it.
    world.controller.cache.store(PODS).forget(NS, "embed-0")
    world.api.calls.clear()
    world.clock.advance(timedelta(seconds=1))
    deferred = world.run(key)
    assert ("LIST", "pods", "", "") in world.api.calls
    assert world.replicas("big") == 0
    assert deferred is not None and deferred.next_change_at is not None

    world.api.remove(PODS, NS, "embed-0")
    world.clock.advance(timedelta(seconds=1))
    world.run(key)
    assert (world.replicas("chat"), world.replicas("embed"), world.replicas("big")) == (1, 0, 1)
    assert world.status(GPU_GROUPS, "gg")["vram"]["used"] == "24Gi"


# --- a status write that fails --------------------------------------------------------------


def test_a_conflict_decides_again_at_once_a_few_times_then_parks_anyway_and_backs_off() -> None:
    """Someone keeps changing a (the proxy writing lastActiveTime): each attempt re-reads
    and decides again without scaling; after MAX_IMMEDIATE_RETRIES the scale-down that
    parks a goes out even though a's status conflicts again, and the key backs off."""
    world = World()
    a_holds_b_asks(world)
    world.api.fail_next(MODELS, "a", Conflict(409, "modified"), subresource="status", times=99)

    for attempt in range(MAX_IMMEDIATE_RETRIES):
        assert world.run() is None
        assert world.requeued(), f"attempt {attempt + 1} is retried at once"
        assert world.controller.queue.timer(KEY) is None
        assert ("GET", "models", "a", "") in world.api.calls  # re-read for the next decision
        assert not [c for c in world.api.verbs() if c[1] != "models"], "nothing but statuses"
        world.controller.queue.get(timeout=0)
        world.controller.queue.done(KEY)
        world.api.calls.clear()

    assert world.run() is None
    assert ("PATCH", "deployments", "a", "scale") in world.api.calls
    assert world.replicas("a") == 0
    assert world.api.events == []  # no status was written, so no Event either
    assert ("PATCH", "deployments", "b", "scale") not in world.api.calls
    assert not world.requeued()
    timer = world.controller.queue.timer(KEY)
    assert timer is not None and T0 < timer <= T0 + timedelta(seconds=1)


def test_a_refused_status_write_never_holds_back_the_scale_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 422 (a stored value the real CRD no longer accepts refuses every status write)
    is said once, with the Events no status will hold; everything else is written and
    the key's timer armed as usual."""
    world = World()
    a_holds_b_asks(world)
    world.api.fail_next(MODELS, "a", Rejected(422, "refused"), subresource="status", times=9)
    caplog.set_level(logging.INFO, logger="flexinfer")

    first = world.run()
    world.run()

    assert first is not None and first.wrote
    assert world.replicas("a") == 0
    # b's status was held back as the step after a's eviction, which a's refused status
    # does not record: the next pass, seeing a scaled down, tells b it holds the card,
    # with its own Event.
    assert world.status(MODELS, "b")["sharedGroup"]["state"] == "Active"
    assert [e["reason"] for e in world.api.events] == ["Preempted", "Promoted"]
    errors = metric_value(
        _scrape(world), "flexinfer_reconcile_errors_total", kind="shared", error="Rejected"
    )
    assert errors == 2  # counted every time, said once
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1


def test_a_legacy_lease_whose_owner_is_longer_than_preempted_by_still_parks_the_group() -> None:
    world = World()
    world.api.max_length[("models", "status.sharedGroup.preemptedBy")] = 512
    a_holds_b_asks(world)
    owner = "trainer-" + "x" * 600
    world.put(
        CONFIG_MAPS,
        {
            "metadata": {"name": "gpu-lease-g", "namespace": NS, "labels": {GPU_LEASE_LABEL: "g"}},
            "data": {"group": "g", "owner": owner},
        },
    )

    world.run()

    assert world.replicas("a") == 0
    preempted_by = world.status(MODELS, "a")["sharedGroup"]["preemptedBy"]
    assert preempted_by.startswith("gpu-lease/trainer-x") and len(preempted_by) == 512
    assert "GPULeaseHeld" in [e["reason"] for e in world.api.events]


# --- a member whose spec cannot be read -----------------------------------------------------


def test_a_member_whose_spec_cannot_be_read_is_left_out_told_once_and_scaled_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """swapCooldown "99999999999h" (stored before the CRD's bound): the group goes on
    without a, a's pods still hold the card, a is scaled to 0 and told why, once."""
    world = World()
    world.put(MODELS, model("a", status=holding("a"), swap_cooldown="99999999999h"))
    world.put(MODELS, model("b", status=asking("b", behind="a")))
    world.put(DEPLOYMENTS, deployment("a", 1))
    world.put(DEPLOYMENTS, deployment("b", 0))
    world.put(PODS, pod("a"))
    world.put(SERVICES, service("a"))
    world.put(SERVICES, service("b"))
    world.api.calls.clear()
    caplog.set_level(logging.DEBUG, logger="flexinfer")

    for _ in range(3):
        world.run()
        world.clock.advance(timedelta(milliseconds=100))

    a = world.status(MODELS, "a")
    ready = {c["type"]: c for c in a["conditions"]}["Ready"]
    assert (a["phase"], ready["status"], ready["reason"]) == ("Failed", "False", "InvalidSpec")
    assert ready["message"].startswith(
        "spec.gpu.swapCooldown: '99999999999h' is longer than the longest duration Go can hold"
    )
    assert sorted((e["reason"], e["involvedObject"]["name"]) for e in world.api.events) == [
        ("InvalidSpec", "a"),
        ("Promoted", "b"),
    ]
    assert world.replicas("a") == 0
    # b leads, and waits for a's pod: the unreadable member still holds the card.
    b = world.status(MODELS, "b")
    assert b["sharedGroup"]["state"] == "Active"
    assert {c["type"]: c for c in b["conditions"]}["Active"]["reason"] == "WaitingForGPU"
    assert world.replicas("b") == 0
    unreadable = [r for r in caplog.records if "spec cannot be read" in r.getMessage()]
    assert len(unreadable) == 1
    assert not [r for r in caplog.records if r.exc_info]  # no traceback, ever

    world.delete(PODS, "a-0")
    world.api.remove(PODS, NS, "a-0")
    world.api.calls.clear()
    world.run()
    assert world.replicas("b") == 1


def test_a_standalone_model_deployment_whose_replicas_overflow_is_held_at_zero() -> None:
    """replicas 3e9 (stored before the CRD's bound): scaled to 0, Ready=False naming
    spec.replicas, one Event; the next passes write nothing."""
    world = World()
    world.put(
        MODEL_DEPLOYMENTS,
        {
            "metadata": {"name": "d", "namespace": NS, "generation": 1},
            "spec": {"replicas": 3_000_000_000},
            "status": {"lastAccessTime": format_rfc3339(T0)},
        },
    )
    world.put(
        DEPLOYMENTS,
        {
            "metadata": {
                "name": "d",
                "namespace": NS,
                "ownerReferences": [owner("ModelDeployment", "d")],
            },
            "spec": {"replicas": 2, "selector": {"matchLabels": {"x": "d"}}},
        },
    )
    world.api.calls.clear()
    key: WorkKey = ("modeldeployment", NS, "d")

    world.run(key)
    first = world.api.verbs()
    world.run(key)

    assert first == [
        ("PATCH", "deployments", "d", "scale"),
        ("PATCH", "modeldeployments", "d", "status"),
        ("POST", "events", "InvalidSpec", ""),
    ]
    assert world.api.verbs() == first  # nothing more the second time
    ready = world.status(MODEL_DEPLOYMENTS, "d")["conditions"][0]
    assert (ready["reason"], ready["status"]) == ("InvalidSpec", "False")
    assert ready["message"].startswith("spec.replicas: 3000000000 must be between 0 and")
    assert world.replicas("d") == 0


# --- metrics ----------------------------------------------------------------------------------


def a_holds(world: World) -> None:
    """a serves with one pod and was just used; b, of equal priority, asks for nothing."""
    a_holds_b_asks(world, b_priority=100)
    busy = holding("a") | {"lastActiveTime": format_rfc3339(T0 - timedelta(seconds=1))}
    world.put(MODELS, model("a", status=busy))
    world.put(MODELS, model("b", status={}))


def test_a_deleted_member_s_series_goes_so_a_group_never_reads_two_holders() -> None:
    world = World()
    a_holds(world)
    world.run()
    assert metric_value(_scrape(world), "flexinfer_shared_group_member_active", model="a") == 1

    world.delete(MODELS, "a")  # a's pod still holds the card until it is gone
    world.run()
    text = _scrape(world)
    assert metric_value(text, "flexinfer_shared_group_member_active", model="a") is None
    assert metric_value(text, "flexinfer_shared_group_member_active", model="b") == 1


def test_lease_series_follow_the_holder_and_an_owner_changed_in_place_is_an_acquisition() -> None:
    world = World()
    a_holds(world)

    def lease(owner: str) -> JSON:
        return {
            "metadata": {"name": "gpu-lease-g", "namespace": NS, "labels": {GPU_LEASE_LABEL: "g"}},
            "data": {"group": "g", "owner": owner},
        }

    def series(name: str, owner: str) -> float | None:
        return metric_value(_scrape(world), name, group="g", namespace=NS, owner=owner)

    world.put(CONFIG_MAPS, lease("first"))
    world.run()
    world.run()
    assert series("flexinfer_gpu_lease_active", "first") == 1
    assert series("flexinfer_gpu_lease_acquired_total", "first") == 1

    world.put(CONFIG_MAPS, lease("second"))  # the same ConfigMap, a new owner
    world.run()
    assert series("flexinfer_gpu_lease_active", "first") is None
    assert series("flexinfer_gpu_lease_acquired_total", "first") is None
    assert series("flexinfer_gpu_lease_active", "second") == 1
    assert series("flexinfer_gpu_lease_acquired_total", "second") == 1

    world.delete(CONFIG_MAPS, "gpu-lease-g")
    world.run()
    assert series("flexinfer_gpu_lease_active", "second") is None
    assert series("flexinfer_gpu_lease_acquired_total", "second") is None


def test_a_lease_whose_expiry_does_not_parse_fails_open_warns_once_and_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = World()
    a_holds(world)
    world.put(
        CONFIG_MAPS,
        {
            "metadata": {"name": "gpu-lease-g", "namespace": NS, "labels": {GPU_LEASE_LABEL: "g"}},
            "data": {"group": "g", "owner": "trainer", "expiresAt": "tomorrow"},
        },
    )
    caplog.set_level(logging.INFO, logger="flexinfer")

    for _ in range(3):
        world.run()
        world.clock.advance(timedelta(seconds=1))

    assert world.replicas("a") == 1  # not parked: the lease cannot be read
    active = {c["type"]: c for c in world.status(MODELS, "a")["conditions"]}["Active"]
    assert active["message"].startswith(
        "GPU lease ConfigMap gpu-lease-g cannot be read (data.expiresAt: 'tomorrow' is not an "
        "RFC 3339 time); proceeding as unleased (fail open)"
    )
    warned = [e for e in world.api.events if e["reason"] == "GPULeaseUnreadable"]
    assert [e["involvedObject"]["name"] for e in warned] == ["gpu-lease-g"]
    assert "data.expiresAt: 'tomorrow'" in warned[0]["message"]
    logged = [r for r in caplog.records if "failing open" in r.getMessage()]
    assert len(logged) == 1
    errors = metric_value(
        _scrape(world), "flexinfer_gpu_lease_read_errors_total", namespace=NS, source="configmaps"
    )
    assert errors == 3


# --- back-off ---------------------------------------------------------------------------------


@pytest.mark.parametrize("failures", [1, 2, 5, 9, 12, 40])
def test_back_off_doubles_with_twenty_percent_jitter_up_to_thirty_seconds(failures: int) -> None:
    base = min(0.1 * 2 ** (failures - 1), MAX_BACKOFF)
    low, high = backoff_delay(failures, jitter=-0.2), backoff_delay(failures, jitter=0.2)
    assert low == pytest.approx(base * 0.8)
    assert high == pytest.approx(min(base * 1.2, MAX_BACKOFF))
    assert high <= MAX_BACKOFF


def _scrape(world: World) -> str:
    from prometheus_client import generate_latest

    return generate_latest(world.metrics.registry).decode()


# --- a new holder's way to serving ----------------------------------------------------------


def starting_pod(name: str) -> JSON:
    """A pod whose server is still loading."""
    loading = pod(name)
    loading["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}
    return loading


def status_writes(world: World, name: str) -> int:
    return world.api.verbs().count(("PATCH", "models", name, "status"))


def test_a_new_holder_that_serves_within_the_window_is_written_once_ready() -> None:
    """b took the card from a and waits for a's pod: once it is gone b is scaled up.
    Its taking the card and its steps toward serving (scaled up, pod made, loading)
    are held back while they come quickly; Ready is written at once, with everything
    before it, and its Active condition says when it was handed the card. Meanwhile b
    is decided as the holder it is: no second Event (Promoted) for it."""
    world = World()
    a_holds_b_asks(world)
    world.run()  # the decision: a Preempted and scaled down; b's Active held back
    world.api.calls.clear()

    world.clock.advance(timedelta(seconds=1))
    world.delete(PODS, "a-0")
    scaled = world.run()
    assert ("PATCH", "deployments", "b", "scale") in world.api.verbs()
    assert world.replicas("b") == 1
    assert status_writes(world, "b") == 0
    # The held write is never lost: the key looks again when it falls due.
    assert scaled is not None and scaled.next_change_at is not None
    assert scaled.next_change_at <= T0 + DEFAULT_COALESCE

    world.clock.advance(timedelta(seconds=1))
    world.put(PODS, starting_pod("b"))
    world.run()
    assert status_writes(world, "b") == 0

    world.clock.advance(timedelta(seconds=1))
    world.put(PODS, pod("b"))
    world.api.calls.clear()
    world.run()
    assert world.api.verbs() == [("PATCH", "models", "b", "status")]
    b = world.status(MODELS, "b")
    assert (b["phase"], b["sharedGroup"]["state"]) == ("Ready", "Active")
    active = {c["type"]: c for c in b["conditions"]}["Active"]
    assert active["lastTransitionTime"] == format_rfc3339(T0)  # the handover, not now
    assert [e["reason"] for e in world.api.events] == ["Preempted"]
    world.api.calls.clear()
    world.run()
    assert world.api.verbs() == []


def test_a_new_holder_waiting_past_the_window_is_written_then() -> None:
    """a's pod takes longer to go than the coalescing window: b's status (Active,
    WaitingForGPU) is written when the window ends, stamped with the handover."""
    world = World()
    a_holds_b_asks(world)
    world.run()
    world.clock.advance(DEFAULT_COALESCE - timedelta(milliseconds=1))
    world.api.calls.clear()
    world.run()
    assert status_writes(world, "b") == 0

    world.clock.advance(timedelta(milliseconds=1))
    world.run()
    assert status_writes(world, "b") == 1
    b = world.status(MODELS, "b")
    active = {c["type"]: c for c in b["conditions"]}["Active"]
    assert (b["sharedGroup"]["state"], active["reason"]) == ("Active", "WaitingForGPU")
    assert active["lastTransitionTime"] == format_rfc3339(T0)
    assert world.replicas("b") == 0
    assert [e["reason"] for e in world.api.events] == ["Preempted"]


def test_a_slow_start_is_written_once_it_has_waited_the_coalescing_window() -> None:
    world = World()
    a_holds_b_asks(world)
    world.run()
    world.delete(PODS, "a-0")
    world.run()  # b scaled up: its progress is held back
    world.put(PODS, starting_pod("b"))
    world.clock.advance(DEFAULT_COALESCE - timedelta(milliseconds=1))
    world.api.calls.clear()
    world.run()
    assert status_writes(world, "b") == 0

    world.clock.advance(timedelta(milliseconds=1))
    world.run()
    assert status_writes(world, "b") == 1
    b = world.status(MODELS, "b")
    assert b["phase"] == "Loading"
    assert {c["type"]: c for c in b["conditions"]}["Ready"]["reason"] == "Loading"


# --- status.nodeName: where a model serves (the proxy keys its swap times by it) -----------


def test_a_member_turning_ready_names_its_node_in_the_same_status_write() -> None:
    world = World()
    a_holds_b_asks(world)
    world.run()
    world.delete(PODS, "a-0")
    world.run()  # b scaled up
    world.put(PODS, pod("b", node="gpu-node-7"))
    world.api.calls.clear()
    world.run()
    assert world.api.verbs() == [("PATCH", "models", "b", "status")]  # no write of its own
    b = world.status(MODELS, "b")
    assert (b["phase"], b["nodeName"]) == ("Ready", "gpu-node-7")
    world.api.calls.clear()
    world.run()
    assert world.api.verbs() == []

    # Preempted in turn (a asks, of higher priority): scaled to 0, b keeps naming the
    # node it last served on (where its next swap most likely goes).
    world.put(MODELS, model("a", priority=300, status=asking("a", behind="b")))
    world.run()
    assert world.replicas("b") == 0
    b = world.status(MODELS, "b")
    assert (b["phase"], b["nodeName"]) == ("Preempted", "gpu-node-7")


def test_a_serving_member_whose_status_names_no_node_or_another_gets_one_write() -> None:
    world = World()
    # Asked for a second ago (not idle), written by a controller that wrote no node.
    serving = {**holding("a"), "lastActiveTime": format_rfc3339(T0 - timedelta(seconds=1))}
    world.put(MODELS, model("a", status=serving))
    world.put(DEPLOYMENTS, deployment("a", 1))
    world.put(PODS, pod("a", node="gpu-node-1"))
    world.put(SERVICES, service("a"))
    world.api.calls.clear()
    world.run()
    assert world.api.verbs() == [("PATCH", "models", "a", "status")]
    assert world.status(MODELS, "a")["nodeName"] == "gpu-node-1"
    world.api.calls.clear()
    world.run()
    assert world.api.verbs() == []

    world.put(MODELS, model("a", status={**serving, "nodeName": "gpu-node-2"}))
    world.api.calls.clear()
    world.run()
    assert world.api.verbs() == [("PATCH", "models", "a", "status")]
    assert world.status(MODELS, "a")["nodeName"] == "gpu-node-1"
