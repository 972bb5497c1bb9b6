"""Kubernetes JSON <-> core snapshots, without a cluster."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flexinfer_core import (
    Condition,
    GpuGroupPhase,
    InvalidFieldError,
    LeaseSource,
    Phase,
    SharedState,
    decide_gpu_group,
    decide_group,
    decide_standalone,
    membership_of,
    reasons,
)
from flexinfer_core.gpugroup_packing import decide_packed_gpu_group, settled_packing
from flexinfer_core.timestamps import format_rfc3339, parse_rfc3339
from flexinfer_k8s.convert_gpugroups import (
    gpu_group_state_from_k8s,
    gpu_group_status,
    unreadable_members,
)
from flexinfer_k8s.convert_leases import (
    GPU_LEASE_LABEL,
    gpu_lease_from_config_map,
    gpu_lease_from_k8s,
)
from flexinfer_k8s.convert_model_deployments import (
    member_status,
    standalone_from_k8s,
    standalone_status,
)
from flexinfer_k8s.convert_models import model_state_from_k8s, model_status
from flexinfer_k8s.pods import selector_matches
from flexinfer_k8s.status_diff import merge_conditions, status_differs
from flexinfer_kube.objects import name_of

NOW = datetime(2026, 11, 29, 17, 0, 0, 123456, tzinfo=UTC)


def model(
    name: str, *, priority: int = 100, status: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": name, "namespace": "ns", "generation": 1, "resourceVersion": "1"},
        "spec": {
            "backend": "vllm",
            "source": "HF://org/m",
            "gpu": {"shared": "g", "priority": priority, "swapCooldown": "10s"},
            "serverless": {"idleTimeout": "1m", "coldStartTimeout": "30s"},
            "serviceLabels": [f"{name}-chat"],
        },
        "status": status or {},
    }


def deployment(name: str, replicas: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "5"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}},
    }


def pod(app: str, *, ready: bool, terminating: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"{app}-x", "namespace": "ns", "labels": {"app": app}}
    if terminating:
        meta["deletionTimestamp"] = "2026-11-29T17:00:00Z"
    return {
        "metadata": meta,
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def test_times_round_trip_with_microseconds() -> None:
    assert parse_rfc3339(format_rfc3339(NOW)) == NOW
    assert format_rfc3339(NOW.replace(microsecond=0)) == "2026-11-29T17:00:00Z"
    assert parse_rfc3339("2026-11-29T17:00:00Z") == NOW.replace(microsecond=0)
    assert parse_rfc3339("garbage") is None
    assert parse_rfc3339(None) is None


def test_selector_matching() -> None:
    labels = {"app": "a", "tier": "gpu"}
    assert selector_matches({"matchLabels": {"app": "a"}}, labels)
    assert not selector_matches({"matchLabels": {"app": "b"}}, labels)
    assert selector_matches(
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]}, labels
    )
    assert not selector_matches(
        {"matchExpressions": [{"key": "x", "operator": "Exists"}]}, labels
    )
    assert not selector_matches({}, labels)


def test_model_state_reads_spec_status_and_workload() -> None:
    obj = model(
        "a",
        priority=200,
        status={
            "phase": "Loading",
            "lastActiveTime": "2026-11-29T16:59:00Z",
            "sharedGroup": {
                "groupName": "g",
                "state": "Active",
                "queuePosition": 0,
                "preemptedBy": "",
            },
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Ready",
                    "message": "m",
                    "lastTransitionTime": "2026-11-29T16:00:00Z",
                },
                {
                    "type": "Other",
                    "status": "True",
                    "reason": "X",
                    "message": "",
                    "lastTransitionTime": "2026-11-29T16:00:00Z",
                },
            ],
        },
    )
    state = model_state_from_k8s(obj, deployment=deployment("a", 1), pods=[pod("a", ready=True)])
    assert state.group == "g"
    assert state.priority == 200
    assert state.phase is Phase.READY  # from the ready pod, not the recorded Loading
    assert state.last_active == datetime(2026, 11, 29, 16, 59, tzinfo=UTC)
    assert state.shared_state is SharedState.ACTIVE
    assert state.swap_cooldown == timedelta(seconds=10)
    assert state.serverless.idle_timeout == timedelta(minutes=1)
    assert state.replicas == 1
    assert state.active_services == "a-chat"  # its labels: its status says it holds the card
    assert [c.type for c in state.conditions] == ["Ready"]  # only the conditions we own


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [
        ({"default": True}, True),
        ({"default": False}, False),
        ({}, False),
        ({"default": "true"}, False),
    ],
)
def test_the_default_member_flag_is_read(gpu: dict[str, Any], expected: bool) -> None:
    """`spec.gpu.default` (docs/election.md 1.5); anything but a stored `true` (the CRD
    refuses a non-boolean) is not a default."""
    obj = model("a")
    obj["spec"]["gpu"].update(gpu)
    state = model_state_from_k8s(obj, deployment=None, pods=[])
    assert state.default_member is expected


def test_a_draining_member_is_read_and_written_from_its_status() -> None:
    """docs/election.md 1.6: the drain's facts come from the cluster (a restarted
    controller reads the same deadline); the controller never writes `inFlight`."""
    obj = model("a", status={
        "phase": "Draining",
        "inFlight": {"count": 2, "reportedAt": "2026-11-29T16:59:58Z"},
        "sharedGroup": {"state": "Queued", "drainingSince": "2026-11-29T16:59:30Z"},
    })  # fmt: skip
    obj["spec"]["gpu"]["drainTimeout"] = "45s"
    state = model_state_from_k8s(
        obj, deployment=deployment("a", 1), pods=[pod("a", ready=True)]
    )
    assert state.phase is Phase.DRAINING
    assert (state.in_flight, state.in_flight_at) == (2, parse_rfc3339("2026-11-29T16:59:58Z"))
    assert state.draining_since == parse_rfc3339("2026-11-29T16:59:30Z")
    assert state.drain_timeout == timedelta(seconds=45)
    written = model_status(obj, decide_group([state], now=NOW).members[0], group="g", now=NOW)
    assert "inFlight" not in written
    assert "drainingSince" in written["sharedGroup"]  # None (removed) or kept
    # Unreadable reports are no requests in flight.
    obj["status"]["inFlight"] = {"count": "many"}
    unread = model_state_from_k8s(obj, deployment=None, pods=[])
    assert (unread.in_flight, unread.in_flight_at) == (0, None)


def test_a_preempted_member_with_a_terminating_ready_pod_stays_preempted() -> None:
    obj = model("a", status={"phase": "Preempted"})
    state = model_state_from_k8s(
        obj,
        deployment=deployment("a", 0),
        pods=[pod("a", ready=True, terminating=True)],
    )
    assert state.phase is Phase.PREEMPTED
    assert state.active_services is None


def test_no_deployment_means_no_replicas_and_idle() -> None:
    state = model_state_from_k8s(model("a"), deployment=None, pods=[])
    assert state.replicas is None
    assert state.phase is Phase.IDLE


def store_status(obj: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """What the API server keeps after a merge patch of `status` (nulls delete)."""
    out = copy.deepcopy(obj)

    def merge(target: dict[str, Any], source: dict[str, Any]) -> None:
        for key, value in source.items():
            if value is None:
                target.pop(key, None)
            elif isinstance(value, dict):
                merge(target.setdefault(key, {}), value)
            else:
                target[key] = value

    merge(out.setdefault("status", {}), patch)
    return out


def test_writing_the_status_then_deciding_again_writes_nothing() -> None:
    objs = [
        model("a", priority=100, status={"phase": "Ready"}),
        model("b", priority=200, status={"lastActiveTime": format_rfc3339(NOW)}),
    ]
    deployments = {"a": deployment("a", 1), "b": deployment("b", 0)}
    pods = {"a": [pod("a", ready=True)], "b": []}

    def states(objs: list[dict[str, Any]]) -> list[Any]:
        return [
            model_state_from_k8s(
                o,
                deployment=deployments[name_of(o)],
                pods=pods[name_of(o)],
            )
            for o in objs
        ]

    first = decide_group(states(objs), now=NOW, running={"a"})
    assert first.leader == "b"
    a = first.member("a")
    assert a.phase is Phase.PREEMPTED and a.events
    written = [
        store_status(
            o, model_status(o, first.member(name_of(o)), group="g", now=NOW)
        )
        for o in objs
    ]
    assert written[0]["status"]["sharedGroup"]["preemptedAt"] == format_rfc3339(NOW)
    deployments["a"] = deployment("a", 0)
    again = decide_group(states(written), now=NOW, running={"a"})
    changes = {c.name: c for c in again.changes(states(written))}
    assert all(not c.status for c in changes.values())
    assert not any(c.events for c in changes.values())
    for o in written:
        member = again.member(name_of(o))
        status = model_status(o, member, group="g", now=NOW + timedelta(seconds=5))
        # Transition times are kept when a condition's status does not change.
        assert status["conditions"] == o["status"]["conditions"]
    # The recorded phase, message, group and generation are part of the one diff.
    for tamper in (
        lambda o: o["metadata"].update(generation=2),
        lambda o: o["status"].update(message="written by an older controller"),
        lambda o: o["status"].update(phase="Loading"),
        lambda o: o["status"]["sharedGroup"].update(groupName="elsewhere"),
    ):
        stale = copy.deepcopy(written)
        tamper(stale[0])
        changed = [c.name for c in again.changes(states(stale)) if c.status]
        assert changed == ["a"]


def test_gpu_lease_and_config_map() -> None:
    lease = gpu_lease_from_k8s(
        {
            "metadata": {"name": "l", "namespace": "ns"},
            "spec": {"group": "g", "owner": "train", "expiresAt": "2026-11-29T18:00:00Z"},
        }
    )
    assert lease is not None
    assert (lease.group, lease.owner, lease.source) == ("g", "train", LeaseSource.GPU_LEASE)
    assert lease.expires_at == datetime(2026, 11, 29, 18, tzinfo=UTC)
    legacy = gpu_lease_from_config_map(
        {
            "metadata": {
                "name": "gpu-lease-g",
                "namespace": "ns",
                "labels": {GPU_LEASE_LABEL: "g"},
            },
            "data": {"owner": "job"},
        }
    )
    assert legacy is not None
    assert (legacy.group, legacy.source, legacy.expires_at) == ("g", LeaseSource.CONFIG_MAP, None)
    assert gpu_lease_from_k8s({"metadata": {"name": "x"}, "spec": {}}) is None
    assert legacy.problem == ""


@pytest.mark.parametrize("expiry", ["tomorrow", "2026-13-01T00:00:00Z", "10000-01-01T00:00:00Z"])
def test_a_lease_expiry_that_does_not_parse_is_the_lease_s_problem(expiry: str) -> None:
    """Not "no expiry" (which parks the group forever): the core fails open on it."""
    legacy = gpu_lease_from_config_map(
        {
            "metadata": {"name": "gpu-lease-g", "namespace": "ns"},
            "data": {"group": "g", "owner": "job", "expiresAt": expiry},
        }
    )
    assert legacy is not None
    assert legacy.expires_at is None
    assert legacy.problem == f"data.expiresAt: {expiry!r} is not an RFC 3339 time"


def test_gpu_group_state_and_status_round_trip() -> None:
    group = {
        "metadata": {
            "name": "gg",
            "namespace": "ns",
            "generation": 2,
            "annotations": {
                "demand.ai.flexinfer/b": json.dumps(
                    {
                        "queued": 5,
                        "oldestWaiting": "2026-11-29T16:59:00Z",
                        "reportedAt": "2026-11-29T16:59:59Z",
                    }
                ),
                "demand.ai.flexinfer/stranger": json.dumps({"queued": 9}),
            },
        },
        "spec": {
            "models": [{"name": "a", "priority": 100}, {"name": "b", "priority": 200}],
            "scalingPolicy": {"preemptionPolicy": "Immediate", "drainTimeoutSeconds": 5},
            "antiThrashing": {"requestQueueThreshold": 2, "hysteresisWindowSeconds": 0},
        },
        "status": {},
    }
    mds = {
        "a": {
            "metadata": {"name": "a"},
            "spec": {"idleTimeoutSeconds": 60},
            "status": {"lastAccessTime": "2026-11-29T16:59:30Z"},
        },
        "b": {"metadata": {"name": "b"}, "spec": {}},
    }
    state = gpu_group_state_from_k8s(
        group, model_deployments=mds, member_pods={"a": [pod("a", ready=True)]}
    )
    assert [m.name for m in state.members] == ["a", "b"]
    a, b = state.members
    assert a.has_pods and a.ready and a.idle_timeout == timedelta(seconds=60)
    assert b.queued == 5 and b.priority == 200 and not b.has_pods
    assert b.reported_at == datetime(2026, 11, 29, 16, 59, 59, tzinfo=UTC)
    assert (a.in_flight, b.in_flight) == (0, 0)
    answering = json.dumps({"queued": 0, "inFlight": 3, "reportedAt": "2026-11-29T16:59:59Z"})
    with_count = {
        **group,
        "metadata": {**group["metadata"], "annotations": {"demand.ai.flexinfer/a": answering}},
    }
    counted = gpu_group_state_from_k8s(
        with_count, model_deployments=mds, member_pods={"a": [pod("a", ready=True)]}
    )
    assert counted.members[0].in_flight == 3  # docs/election.md 1.6
    assert state.anti_thrashing.request_queue_threshold == 2
    decision = decide_gpu_group(state, now=NOW)
    assert decision.active_model == "b"
    status = gpu_group_status(group, decision, now=NOW)
    assert status["swapCount"] == 1
    assert status["observedGeneration"] == 2
    stored = store_status(group, status)
    assert not status_differs(stored["status"], status)
    again = gpu_group_state_from_k8s(
        stored, model_deployments=mds, member_pods={"a": [pod("a", ready=True)]}
    )
    assert again.current_model == "b" and again.swap_count == 1
    second = decide_gpu_group(again, now=NOW)
    assert second.phase is GpuGroupPhase.SWAPPING
    assert second.swap_count == 1


def test_standalone_model_deployment_round_trip_writes_nothing_twice() -> None:
    md: dict[str, Any] = {
        "metadata": {"name": "solo", "namespace": "ns", "generation": 2},
        "spec": {"replicas": 2, "minReplicas": 0, "idleTimeoutSeconds": 30},
        "status": {"lastAccessTime": format_rfc3339(NOW - timedelta(seconds=40))},
    }
    deployment = {"metadata": {"name": "solo", "namespace": "ns"}, "spec": {"replicas": 2}}
    state = standalone_from_k8s(md, deployment=deployment, pods=[])
    assert (state.replicas, state.current_replicas, state.ready_replicas) == (2, 2, 0)
    assert state.idle_timeout == timedelta(seconds=30)
    assert state.cold_start_timeout == timedelta(seconds=60)  # the CRD default
    decision = decide_standalone(state, now=NOW)
    assert decision.reason == reasons.COLD_START  # woken, no pod ready yet
    status = standalone_status(md, decision, replicas=2, pods=[], now=NOW)
    assert (status["phase"], status["readyReplicas"], status["observedGeneration"]) == (
        "Pending",
        0,
        2,
    )
    ready = status["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "ColdStart")
    md["status"].update(status)
    later = standalone_status(
        md, decision, replicas=2, pods=[], now=NOW + timedelta(seconds=5)
    )
    assert not status_differs(md["status"], later)
    assert standalone_from_k8s(md, deployment=None, pods=[]).current_replicas is None


def test_merging_conditions_keeps_their_order_so_two_writers_agree() -> None:
    """The election writes Ready, the workload reconciler Rendered: each merge keeps the
    other's entry where it is, so neither sees a change to undo (no write ping-pong)."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    existing = [
        {"type": "Rendered", "status": "True", "reason": "Rendered", "message": "",
         "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"type": "Ready", "status": "False", "reason": "Queued", "message": "",
         "lastTransitionTime": "2026-01-01T00:00:00Z"},
    ]
    ready = merge_conditions(
        existing, [Condition("Ready", False, "Queued", "")], now=now, generation=None
    )
    assert [c["type"] for c in ready] == ["Rendered", "Ready"]
    assert ready == existing
    rendered = merge_conditions(
        ready, [Condition("Rendered", True, "Rendered", "")], now=now, generation=None
    )
    assert rendered == existing
    added = merge_conditions(
        existing, [Condition("VRAMFits", True, "KVCacheFits", "")], now=now, generation=None
    )
    assert [c["type"] for c in added] == ["Rendered", "Ready", "VRAMFits"]


def test_a_model_deployment_in_conflict_is_never_ready_and_says_why() -> None:
    md: dict[str, Any] = {
        "metadata": {"name": "chat", "namespace": "ns", "generation": 1},
        "spec": {"gpuGroupRef": "other"},
        "status": {"lastAccessTime": format_rfc3339(NOW)},
    }
    conflict = membership_of("chat", group_ref="other", groups={"gg": ("chat",)})
    deployment = {"metadata": {"name": "chat", "namespace": "ns"}, "spec": {"replicas": 1}}
    ready_pod = pod("chat", ready=True)
    state = standalone_from_k8s(md, deployment=deployment, pods=[ready_pod], conflict=conflict)
    decision = decide_standalone(state, now=NOW)
    assert (decision.scale_to, decision.reason) == (0, reasons.GPU_GROUP_REF_NOT_LISTED)
    # Its pod is still ready while it goes: Running, but not Ready.
    status = standalone_status(md, decision, replicas=0, pods=[ready_pod], now=NOW)
    ready = status["conditions"][0]
    assert status["phase"] == "Running"
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "GPUGroupRefNotListed",
        conflict.message,
    )


def test_a_members_status_names_its_group_and_replaces_a_conflict() -> None:
    md: dict[str, Any] = {
        "metadata": {"name": "chat", "namespace": "ns", "generation": 3},
        "spec": {},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "ListedByMultipleGPUGroups",
                    "message": "listed twice",
                    "lastTransitionTime": "2026-11-29T16:00:00Z",
                }
            ]
        },
    }
    member = membership_of("chat", group_ref="", groups={"gg": ("chat",)})
    status = member_status(md, member, replicas=1, pods=[pod("chat", ready=True)], now=NOW)
    assert (status["phase"], status["readyReplicas"], status["observedGeneration"]) == (
        "Running",
        1,
        3,
    )
    [ready] = status["conditions"]
    assert (ready["status"], ready["reason"]) == ("True", "GPUGroupMember")
    assert "member of GPUGroup gg" in ready["message"]
    assert "lastAccessTime" not in status  # the proxy's to write...
    rewritten = member_status(md, member, replicas=1, pods=[], now=NOW,
                              rewrite_last_access_time=True)
    assert rewritten["lastAccessTime"] == format_rfc3339(NOW)  # ...unless it lay in 9999
    # Kept up by its group's decision after a swap (docs/election.md 1.6): Draining, so
    # the proxy sends it nothing new; one that is not serving has nothing to drain.
    draining = member_status(md, member, replicas=1, pods=[pod("chat", ready=True)], now=NOW,
                             draining=True)
    assert draining["phase"] == "Draining"
    assert draining["conditions"][0]["status"] == "False"
    starting = member_status(md, member, replicas=1, pods=[pod("chat", ready=False)], now=NOW,
                             draining=True)
    assert starting["phase"] == "Pending"


# --- values no decision can use: the error names the object's field and its value ------


@pytest.mark.parametrize(
    ("spec", "status", "message"),
    [
        ({"gpu": {"shared": "g", "swapCooldown": "99999999999h"}}, {},
         "spec.gpu.swapCooldown: '99999999999h' is longer than the longest duration Go can"),
        ({"gpu": {"shared": "g", "swapCooldown": "90000h"}}, {},
         "spec.gpu.swapCooldown: '90000h' is too long: at most 3650 days"),
        ({"gpu": {"shared": "g", "priority": 5000}}, {},
         "spec.gpu.priority: 5000 must be between 0 and 1000"),
        ({"serverless": {"idleTimeout": "-5m"}}, {},
         "spec.serverless.idleTimeout: '-5m' is negative"),
        ({"serverless": {"minReplicas": 11}}, {},
         "spec.serverless.minReplicas: 11 must be between 0 and 10"),
    ],
)
def test_a_model_value_no_decision_can_use_names_its_field(
    spec: dict[str, Any], status: dict[str, Any], message: str
) -> None:
    obj = model("a")
    obj["spec"].update(spec)
    obj["status"] = status
    with pytest.raises(InvalidFieldError) as caught:
        model_state_from_k8s(obj, deployment=None, pods=[])
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"replicas": 3_000_000_000}, "spec.replicas: 3000000000 must be between 0 and"),
        ({"idleTimeoutSeconds": 10**12},
         "spec.idleTimeoutSeconds: 1000000000000 is too long: at most 315360000 seconds"),
        ({"coldStartTimeoutSeconds": 2**62},
         "spec.coldStartTimeoutSeconds: 4611686018427387904 is too long"),
        ({"replicas": 1, "minReplicas": 2}, "spec.minReplicas: 2 must not exceed replicas (1)"),
    ],
)
def test_a_model_deployment_value_no_decision_can_use_names_its_field(
    spec: dict[str, Any], message: str
) -> None:
    md = {"metadata": {"name": "d", "namespace": "ns"}, "spec": spec}
    with pytest.raises(InvalidFieldError) as caught:
        standalone_from_k8s(md, deployment=None, pods=[])
    assert str(caught.value).startswith(message)


def test_a_gpu_group_reads_around_a_member_whose_spec_it_cannot_read() -> None:
    group = {
        "metadata": {"name": "gg", "namespace": "ns"},
        "spec": {"models": [{"name": "a"}, {"name": "b"}]},
    }
    mds = {
        "a": {"metadata": {"name": "a"}, "spec": {"idleTimeoutSeconds": 10**12}},
        "b": {"metadata": {"name": "b"}, "spec": {"idleTimeoutSeconds": 60}},
    }
    problems = unreadable_members(mds)
    assert list(problems) == ["a"]
    assert str(problems["a"]).startswith("spec.idleTimeoutSeconds: 1000000000000 is too long")
    with pytest.raises(InvalidFieldError):
        gpu_group_state_from_k8s(group, model_deployments=mds, member_pods={})
    state = gpu_group_state_from_k8s(
        group, model_deployments=mds, member_pods={}, conflicts={"a": reasons.INVALID_SPEC}
    )
    assert [(m.name, m.eligible) for m in state.members] == [("a", False), ("b", True)]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"models": [{"name": "a"}, {"name": "b", "priority": 5000}]},
         "spec.models[1].priority: 5000 must be between 0 and 1000"),
        ({"models": [{"name": "a"}], "scalingPolicy": {"drainTimeoutSeconds": 2**62}},
         "spec.scalingPolicy.drainTimeoutSeconds: 4611686018427387904 is too long"),
        ({"models": [{"name": "a"}], "antiThrashing": {"requestQueueThreshold": 0}},
         "spec.antiThrashing.requestQueueThreshold: 0 must be between 1 and 100"),
    ],
)
def test_a_gpu_group_value_no_decision_can_use_names_its_field(
    spec: dict[str, Any], message: str
) -> None:
    group = {"metadata": {"name": "gg", "namespace": "ns"}, "spec": spec}
    with pytest.raises(InvalidFieldError) as caught:
        gpu_group_state_from_k8s(group, model_deployments={}, member_pods={})
    assert str(caught.value).startswith(message)


# --- a failing server ----------------------------------------------------------------

REJECTED = "error: invalid argument: --no-such-flag"


def crash_looping(app: str, *, created: str = "2026-11-29T16:00:00Z", init: bool = False,
                  ready: bool = False, restarts: int = 2,
                  waiting: str = "CrashLoopBackOff") -> dict[str, Any]:
    """A pod whose (init) container exited with a flag the server rejects and restarts."""
    body = pod(app, ready=ready)
    body["metadata"]["creationTimestamp"] = created
    container = {
        "name": "flash-loader" if init else "server",
        "ready": ready,
        "restartCount": restarts,
        "state": {"waiting": {"reason": waiting}} if waiting else {"running": {}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": REJECTED}},
    }
    body["status"]["initContainerStatuses" if init else "containerStatuses"] = [container]
    return body


def test_a_crash_looping_server_is_failed_with_its_termination_message() -> None:
    state = model_state_from_k8s(
        model("a", status={"phase": "Loading"}),
        deployment=deployment("a", 1),
        pods=[crash_looping("a")],
    )
    assert state.phase is Phase.FAILED
    assert state.failure is not None
    assert (state.failure.container, state.failure.exit_code) == ("server", 1)
    decision = decide_group([state], now=NOW)
    status = model_status(model("a"), decision.member("a"), group="g", now=NOW)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", reasons.CRASH_LOOP_BACK_OFF)
    assert REJECTED in ready["message"] and "exit code 1" in ready["message"]
    assert REJECTED in status["message"]
    assert status["phase"] == "Failed"


@pytest.mark.parametrize(
    ("pods", "phase"),
    [
        # Restarted and loading again (running, not ready): still failing.
        ([crash_looping("a", waiting="")], Phase.FAILED),
        # A flash loader that keeps failing (Init:CrashLoopBackOff) fails the server too.
        ([crash_looping("a", init=True)], Phase.FAILED),
        # Restarted once, then ready: it serves.
        ([crash_looping("a", waiting="", ready=True)], Phase.READY),
        # A ready pod beside a crash-looping one: it serves.
        ([crash_looping("a"), pod("a", ready=True)], Phase.READY),
        # Never restarted, still loading: Loading.
        ([pod("a", ready=False)], Phase.LOADING),
    ],
    ids=["restarted-loading", "init-crash-loop", "recovered", "one-ready", "loading"],
)
def test_which_pods_make_a_server_failing(pods: list[dict[str, Any]], phase: Phase) -> None:
    state = model_state_from_k8s(
        model("a"), deployment=deployment("a", 1), pods=pods
    )
    assert state.phase is phase
    assert (state.failure is not None) == (phase is Phase.FAILED)


def test_a_terminating_crash_looping_pod_says_nothing() -> None:
    terminating = crash_looping("a")
    terminating["metadata"]["deletionTimestamp"] = "2026-11-29T17:00:00Z"
    state = model_state_from_k8s(
        model("a"), deployment=deployment("a", 1), pods=[terminating]
    )
    assert state.phase is Phase.LOADING and state.failure is None


def test_a_failing_model_deployment_says_why_and_writes_nothing_twice() -> None:
    md: dict[str, Any] = {
        "metadata": {"name": "solo", "namespace": "ns", "generation": 1},
        "spec": {"replicas": 1, "minReplicas": 1},
        "status": {},
    }
    deployment_ = {"metadata": {"name": "solo", "namespace": "ns"}, "spec": {"replicas": 1}}
    pods = [crash_looping("solo")]
    decision = decide_standalone(standalone_from_k8s(md, deployment=deployment_, pods=pods),
                                 now=NOW)
    status = standalone_status(md, decision, replicas=1, pods=pods, now=NOW)
    assert status["phase"] == "Failed"
    ready = status["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("False", reasons.CRASH_LOOP_BACK_OFF)
    assert REJECTED in ready["message"] and REJECTED in status["message"]
    md["status"].update(status)
    # Another restart (the count grows) is no news: nothing to write.
    pods = [crash_looping("solo", restarts=5)]
    again = standalone_status(md, decision, replicas=1, pods=pods,
                              now=NOW + timedelta(seconds=30))
    assert not status_differs(md["status"], again)
    membership = membership_of("solo", group_ref="", groups={"gg": ("solo",)})
    member = member_status(md, membership, replicas=1, pods=pods, now=NOW)
    assert member["phase"] == "Failed"
    assert REJECTED in member["conditions"][0]["message"]


# --- VRAM co-residency (docs/election.md 1.7) ------------------------------------------

GIB = 2**30


def budgeted_model(name: str, budget: Any, estimate: Any, **status: Any) -> dict[str, Any]:
    obj = model(name, status={"lastActiveTime": format_rfc3339(NOW), **status})
    obj["spec"]["gpu"].update(vramBudget=budget, vramEstimate=estimate)
    return obj


@pytest.mark.parametrize(
    ("given", "size"),
    [
        ("24Gi", 24 * GIB),
        ("5632Mi", 5632 * 2**20),
        ("1.5Gi", 3 * GIB // 2),
        (24_000_000_000, 24 * 10**9),
        ("8G", 8 * 10**9),
    ],
)
def test_vram_quantities_are_read_as_bytes(given: Any, size: int) -> None:
    state = model_state_from_k8s(
        budgeted_model("a", given, given), deployment=None, pods=[]
    )
    assert (state.vram_budget, state.vram_estimate) == (size, size)


def test_no_vram_fields_read_as_none() -> None:
    state = model_state_from_k8s(model("a"), deployment=None, pods=[])
    assert (state.vram_budget, state.vram_estimate, state.recorded_vram) == (None, None, None)


@pytest.mark.parametrize(
    ("field", "value"),
    [("vramBudget", "24 GB"), ("vramEstimate", "-4Gi"), ("vramEstimate", "100m")],
)
def test_a_bad_vram_quantity_names_the_field_and_the_value(field: str, value: str) -> None:
    obj = budgeted_model("a", "24Gi", "4Gi")
    obj["spec"]["gpu"][field] = value
    with pytest.raises(InvalidFieldError) as raised:
        model_state_from_k8s(obj, deployment=None, pods=[])
    assert raised.value.field == f"spec.gpu.{field}"
    assert value in str(raised.value)


def _decide_and_write(objs: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    states = [model_state_from_k8s(o, deployment=None, pods=[]) for o in objs]
    decision = decide_group(states, now=NOW)
    written = [
        store_status(
            o,
            model_status(
                o,
                decision.member(name_of(o)),
                group="g",
                now=NOW,
                packed=decision.packed_status(name_of(o)),
            ),
        )
        for o in objs
    ]
    again = decide_group(
        [model_state_from_k8s(o, deployment=None, pods=[]) for o in written],
        now=NOW,
    )
    changes = again.changes(
        [model_state_from_k8s(o, deployment=None, pods=[]) for o in written]
    )
    assert [c.name for c in changes if c.status] == [], "a second reconcile rewrites the status"
    return decision, written


def packed_condition(obj: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == "Packed")


def test_a_packed_group_writes_each_footprint_and_the_budget_use_once() -> None:
    objs = [
        budgeted_model("chat", "24Gi", "5632Mi"),
        budgeted_model("embed", "24Gi", "4Gi"),
        budgeted_model("coder", "24Gi", "16Gi"),
    ]
    objs[0]["spec"]["gpu"]["priority"] = 200
    objs[1]["spec"]["gpu"]["priority"] = 150
    _, written = _decide_and_write(objs)
    by_name = {name_of(o): o for o in written}
    assert by_name["embed"]["status"]["vram"] == {
        "footprint": "4Gi",
        "budget": "24Gi",
        "used": "9728Mi",
    }
    assert by_name["chat"]["status"]["vram"]["footprint"] == "5632Mi"
    embed = packed_condition(by_name["embed"])
    assert (embed["status"], embed["reason"]) == ("True", reasons.CO_RESIDENT)
    assert embed["message"] == "fits: 9.5 of 24 GiB used"
    coder = packed_condition(by_name["coder"])
    assert (coder["status"], coder["reason"]) == ("False", reasons.WAITING_FOR_VRAM)
    assert coder["message"].startswith("coder needs 16 GiB, 14.5 free")


def test_members_that_disagree_on_the_budget_are_told_so_in_their_status() -> None:
    objs = [budgeted_model("a", "24Gi", "4Gi"), budgeted_model("b", "16Gi", "4Gi")]
    decision, written = _decide_and_write(objs)
    assert [m.name for m in decision.members if m.is_leader] == ["a"]
    for obj in written:
        condition = packed_condition(obj)
        assert (condition["status"], condition["reason"]) == ("False", "VramBudgetConflict")
        assert "members disagree on spec.gpu.vramBudget (a: 24 GiB, b: 16 GiB)" in (
            condition["message"]
        )
        assert obj["status"]["vram"] == {"footprint": "4Gi"}


def test_a_budget_taken_away_removes_status_vram_and_says_so() -> None:
    _, written = _decide_and_write([budgeted_model("a", "24Gi", "4Gi")])
    assert written[0]["status"]["vram"]["budget"] == "24Gi"
    for key in ("vramBudget", "vramEstimate"):
        del written[0]["spec"]["gpu"][key]
    _, again = _decide_and_write(written)
    assert "vram" not in again[0]["status"]
    assert packed_condition(again[0])["reason"] == "NoVramBudget"


def test_a_group_without_a_budget_writes_no_vram_status() -> None:
    obj = model("a", status={"lastActiveTime": format_rfc3339(NOW)})
    decision = decide_group(
        [model_state_from_k8s(obj, deployment=None, pods=[])], now=NOW
    )
    assert decision.packed == ()
    status = model_status(obj, decision.member("a"), group="g", now=NOW, packed=None)
    assert "vram" not in status
    assert all(c["type"] != "Packed" for c in status["conditions"])


def budgeted_group(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "gg", "namespace": "ns", "generation": 1},
        "spec": {
            "models": [
                {"name": "a", "priority": 200, "vramEstimate": "5632Mi"},
                {"name": "b", "priority": 100},
            ],
            **spec,
        },
        "status": {},
    }


def test_a_gpu_group_budget_without_a_shared_card_is_shown_and_its_members_take_turns() -> None:
    """No --gpu-device-class (no packing given): the shared groups' own words."""
    group = budgeted_group(vramBudget="24Gi")
    mds = {"a": {"metadata": {"name": "a"}, "spec": {}}, "b": {"metadata": {"name": "b"}}}
    pods = {"a": [pod("a", ready=True)]}
    state = gpu_group_state_from_k8s(group, model_deployments=mds, member_pods=pods)
    assert state.vram_budget == 24 * GIB
    assert [m.vram_estimate for m in state.members] == [5632 * 2**20, None]
    group["status"] = {"activeModel": "a", "lastSwapTime": format_rfc3339(NOW)}
    state = gpu_group_state_from_k8s(group, model_deployments=mds, member_pods=pods)
    decision = decide_gpu_group(state, now=NOW)
    assert decision.active_model == "a"
    status = gpu_group_status(group, decision, now=NOW, state=state)
    assert status["vram"] == {"budget": "24Gi", "used": "5632Mi"}
    assert [row["footprint"] for row in status["modelStatuses"]] == ["5632Mi", None]
    packed = next(c for c in status["conditions"] if c["type"] == "Packed")
    assert (packed["status"], packed["reason"]) == ("False", "NoSharedCard")
    assert "--gpu-device-class" in packed["message"]
    assert packed["message"].endswith("runs one member at a time")
    stored = store_status(group, status)
    assert not status_differs(stored["status"], status)
    # Taken away: the numbers go, and the condition says there is no budget.
    del stored["spec"]["vramBudget"]
    plain = gpu_group_state_from_k8s(stored, model_deployments=mds, member_pods=pods)
    later = gpu_group_status(stored, decide_gpu_group(plain, now=NOW), now=NOW, state=plain)
    assert later["vram"] is None
    assert next(c for c in later["conditions"] if c["type"] == "Packed")["reason"] == (
        "NoVramBudget"
    )


def test_a_gpu_group_without_a_budget_writes_no_vram_status() -> None:
    group = budgeted_group()
    mds = {"a": {"metadata": {"name": "a"}}, "b": {"metadata": {"name": "b"}}}
    state = gpu_group_state_from_k8s(group, model_deployments=mds, member_pods={})
    status = gpu_group_status(group, decide_gpu_group(state, now=NOW), now=NOW, state=state)
    assert "vram" not in status
    assert all("footprint" not in row for row in status["modelStatuses"])
    assert [c["type"] for c in status["conditions"]] == ["Ready"]


@pytest.mark.parametrize(
    ("where", "value", "field"),
    [
        ("group", "lots", "spec.vramBudget"),
        ("member", "4 GiB", "spec.models[1].vramEstimate"),
    ],
)
def test_a_bad_gpu_group_quantity_names_the_field(where: str, value: str, field: str) -> None:
    group = budgeted_group()
    if where == "group":
        group["spec"]["vramBudget"] = value
    else:
        group["spec"]["models"][1]["vramEstimate"] = value
    with pytest.raises(InvalidFieldError) as raised:
        gpu_group_state_from_k8s(group, model_deployments={}, member_pods={})
    assert raised.value.field == field and value in str(raised.value)


def packed_group(**recorded: Any) -> dict[str, Any]:
    """chat (5.5 GiB) holds a 24 GiB card; embed (4 GiB) and coder (16 GiB) were just
    asked for."""
    asked = json.dumps({"queued": 1, "oldestWaiting": format_rfc3339(NOW - timedelta(seconds=5)),
                        "reportedAt": format_rfc3339(NOW)})  # fmt: skip
    return {
        "metadata": {"name": "gg", "namespace": "ns", "generation": 1,
                     "annotations": {"demand.ai.flexinfer/embed": asked,
                                     "demand.ai.flexinfer/coder": asked}},
        "spec": {
            "vramBudget": "24Gi",
            "models": [
                {"name": "chat", "priority": 300, "vramEstimate": "5632Mi"},
                {"name": "embed", "priority": 200, "vramEstimate": "4Gi"},
                {"name": "coder", "priority": 100, "vramEstimate": "16Gi"},
            ],
        },
        "status": {"activeModel": "chat",
                   "lastSwapTime": format_rfc3339(NOW - timedelta(minutes=10)),
                   "modelStatuses": [{"name": "chat", "state": "Active"}], **recorded},
    }  # fmt: skip


PACKED_MDS = {n: {"metadata": {"name": n}, "spec": {}} for n in ("chat", "embed", "coder")}
# chat was asked for a moment ago: it keeps the card.
PACKED_MDS["chat"]["status"] = {"lastAccessTime": format_rfc3339(NOW - timedelta(seconds=5))}


def decide_packed(group: dict[str, Any], pods: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    state = gpu_group_state_from_k8s(group, model_deployments=PACKED_MDS, member_pods=pods)
    packed = decide_packed_gpu_group(state, now=NOW)
    status = gpu_group_status(
        group, packed.decision, now=NOW, state=state,
        packing=settled_packing(state, packed, now=NOW),
    )  # fmt: skip
    return state, status


def test_a_packed_gpu_group_says_every_holder_active_and_what_they_take() -> None:
    group = packed_group()
    pods = {"chat": [pod("chat", ready=True)]}
    state, status = decide_packed(group, pods)
    assert [m.seated for m in state.members] == [True, False, False]
    assert status["activeModel"] == "chat"  # the leader stays
    assert {r["name"]: r["state"] for r in status["modelStatuses"]} == {
        "chat": "Active", "embed": "Active", "coder": "Queued"
    }  # fmt: skip
    assert {r["name"]: r["footprint"] for r in status["modelStatuses"]} == {
        "chat": "5632Mi", "embed": "4Gi", "coder": "16Gi"
    }  # fmt: skip
    assert status["vram"] == {"budget": "24Gi", "used": "9728Mi"}  # 5.5 + 4, coder out
    packed = next(c for c in status["conditions"] if c["type"] == "Packed")
    assert (packed["status"], packed["reason"]) == ("True", "CoResident")
    assert packed["message"].startswith(
        "chat, embed hold the card together: fits: 9.5 of 24 GiB used; coder needs 16 GiB, "
        "14.5 free"
    )
    # Written, then read back: the recorded states are the seats, and deciding again
    # with no news writes nothing.
    stored = store_status(group, status)
    again, second = decide_packed(stored, pods)
    assert [m.seated for m in again.members] == [True, True, False]
    assert not status_differs(stored["status"], second)


def test_a_packed_gpu_group_whose_holder_is_alone_says_why() -> None:
    group = packed_group()
    group["spec"]["models"][0].pop("vramEstimate")  # chat's footprint is unknown
    _, status = decide_packed(group, {"chat": [pod("chat", ready=True)]})
    assert {r["name"]: r["state"] for r in status["modelStatuses"]}["embed"] != "Active"
    packed = next(c for c in status["conditions"] if c["type"] == "Packed")
    assert (packed["status"], packed["reason"]) == ("False", "Exclusive")
    assert packed["message"] == "holds the card alone: chat's footprint is unknown"
    assert status["vram"] == {"budget": "24Gi", "used": None}


def test_a_lone_holder_within_the_budget_fits_and_leaves_room() -> None:
    group = packed_group()
    group["metadata"]["annotations"] = {}
    _, status = decide_packed(group, {"chat": [pod("chat", ready=True)]})
    packed = next(c for c in status["conditions"] if c["type"] == "Packed")
    assert (packed["status"], packed["reason"], packed["message"]) == (
        "True", "Fits", "chat holds the card: fits: 5.5 of 24 GiB used"
    )  # fmt: skip
    assert status["vram"] == {"budget": "24Gi", "used": "5632Mi"}
