"""Hostile values on a real control plane: each leaves the rest of its group serving and
tells the user, in a condition and an Event, which field holds what.

The CRDs now refuse several of these values at admission, but objects stored before
those bounds still exist. To store one, a test installs a copy of the CRD without its
`maximum`s and CEL rules (`crd_without_bounds`), creates the object, and reinstalls the
real CRD before the controller starts (and checks that the real one refuses the value
again). The API server keeps the stored object, and lets the controller write its
status (validation ratcheting: an unchanged field is not re-validated). Values the
schema allows anyway (a status time in the year 9999, a ConfigMap's data) are written
the ordinary way.
"""

# The fixtures come from .harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flexinfer_devcluster.localcluster import COMPLETE_DELAY_ANNOTATION, LocalCluster
from flexinfer_kube.kubeapi import NotFound, Rejected
from flexinfer_kube.resources import (
    CONFIG_MAPS,
    EVENTS,
    GPU_GROUPS,
    GPU_LEASES,
    MODEL_CACHES,
    MODEL_DEPLOYMENTS,
    MODELS,
)
from tests.polling import wait_until

from .harness import (  # noqa: F401  (fixtures)
    Cluster,
    PodTimeline,
    RunningController,
    cluster,
    controller,
    crds,
    kubectl,
    metric_value,
    model_body,
    now_text,
    on_kwok,
)
from .kubectl import CRD_DIR, install_crds

pytestmark = pytest.mark.k8s

JSON = dict[str, Any]


# --- storing a value from before the CRDs' bounds --------------------------------------------


def _without_bounds(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: _without_bounds(value)
            for key, value in node.items()
            if key not in ("maximum", "x-kubernetes-validations")
        }
    if isinstance(node, list):
        return [_without_bounds(item) for item in node]
    return node


@contextlib.contextmanager
def crd_without_bounds(local: LocalCluster, file: str, directory: Path) -> Iterator[None]:
    """`crds/<file>` installed without its maxima and CEL rules (the CRD as it was before
    the bounds) for the block's duration; the real CRDs again afterwards."""
    crd = _without_bounds(yaml.safe_load((CRD_DIR / file).read_text()))
    # As JSON (which is YAML): PyYAML would write the string "2e-4" bare, a number to Go.
    (directory / file).write_text(json.dumps(crd))
    (directory / "kustomization.yaml").write_text(yaml.safe_dump({"resources": [file]}))
    local.install_crds(directory)
    try:
        yield
    finally:
        install_crds(local)


def stored(create: Callable[[], object], what: str) -> None:
    """Create through a CRD just loosened (its new schema takes a moment to apply)."""

    def attempt() -> bool:
        try:
            create()
        except Rejected:
            return False
        return True

    wait_until(attempt, what=f"{what} to be accepted without the bound", timeout=30)


def refused(create: Callable[[], object], what: str) -> str:
    """The real CRD (reinstalled) refuses the value again: it was stored from before."""

    def attempt() -> str | None:
        try:
            create()
        except Rejected as error:
            return str(error)
        return None

    return wait_until(attempt, what=f"{what} to be refused by the real CRD", timeout=30)


# --- what the user sees ---------------------------------------------------------------------


def condition(obj: JSON, kind: str = "Ready") -> JSON:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}.get(
        kind, {}
    )


def invalid_spec(c: Cluster, resource: Any, name: str, field: str) -> JSON:
    """Wait for `name`'s Ready=False/InvalidSpec naming `field`; return the condition."""

    def said() -> JSON | None:
        ready = condition(c.api.get(resource, c.namespace, name))
        ok = ready.get("reason") == "InvalidSpec" and ready.get("status") == "False"
        return ready if ok and field in str(ready.get("message")) else None

    return wait_until(said, what=f"{name}: Ready=False, InvalidSpec, naming {field}")


def events(c: Cluster, name: str, reason: str) -> list[JSON]:
    items = c.api.list(EVENTS, c.namespace).get("items") or []
    return [
        e for e in items if e["involvedObject"]["name"] == name and e.get("reason") == reason
    ]


def reconciles(ctl: RunningController, kind: str) -> float:
    text = ctl.scrape()
    return metric_value(text, "flexinfer_reconcile_duration_seconds_count", kind=kind) or 0.0


def keep_reconciling(ctl: RunningController, kind: str, poke: Callable[[], object],
                     *, times: int = 4) -> None:
    """Make the key of `kind` reconcile at least `times` more times."""
    for _ in range(times):
        before = reconciles(ctl, kind)
        poke()
        wait_until(lambda b=before: reconciles(ctl, kind) > b, what=f"another {kind} reconcile")


def hostile_lines(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    crashed = [r.getMessage() for r in caplog.records if r.exc_info]
    assert crashed == [], f"tracebacks logged: {crashed}"


# --- Models in a shared group -----------------------------------------------------------------


def test_a_swap_cooldown_beyond_go_is_invalid_spec_and_the_group_serves_on(
    local_cluster: LocalCluster, cluster: Cluster, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """swapCooldown "99999999999h" passed the CRD's pattern before the 720h bound and
    made the duration parser overflow: the whole group failed at every retry.

    The real CRD refuses it on create; stored under an older CRD it still takes status
    writes (its CEL rule checks the digits before converting, so the value makes the
    rule false, which is ratcheted, not an error, which would refuse every write): the
    user reads which field both in the Ready condition and in one Warning Event."""
    c = cluster
    with crd_without_bounds(local_cluster, "ai.flexinfer_models.yaml", tmp_path):
        stored(lambda: c.add_model("bad", swap_cooldown="99999999999h", priority=500),
               "swapCooldown 99999999999h")
        c.demand("bad")  # asked for, and of higher priority: it would win if it could run
    message = refused(
        lambda: c.api.create(MODELS, c.namespace,
                             model_body("again", swap_cooldown="99999999999h")),
        "swapCooldown 99999999999h",
    )
    assert "swapCooldown" in message
    c.add_model("good")
    c.demand("good")
    caplog.set_level(logging.INFO, logger="flexinfer")
    timeline = PodTimeline(c)
    with controller(local_cluster, c.namespace) as ctl:
        c.wait_serving("good")
        warned = wait_until(lambda: events(c, "bad", "InvalidSpec"),
                            what="a Warning naming swapCooldown")
        assert warned[0]["type"] == "Warning"
        assert warned[0]["message"].startswith(
            "spec.gpu.swapCooldown: '99999999999h' is longer than the longest duration Go can "
            "hold (2562047h47m16s); it is left out of its group and runs nothing"
        )
        invalid_spec(c, MODELS, "bad", "spec.gpu.swapCooldown")
        keep_reconciling(ctl, "shared", lambda: c.demand("good"))
        assert len(events(c, "bad", "InvalidSpec")) == 1
        assert c.replicas("bad") == 0 and not c.pods("bad")
        assert c.status("good")["phase"] == "Ready"
    timeline.stop()
    assert timeline.violations == []
    assert "bad" not in timeline.created_apps()
    assert len(hostile_lines(caplog, "spec cannot be read")) == 1
    no_tracebacks(caplog)


def test_a_last_active_time_in_the_year_9999_is_read_as_now_said_and_ages(
    local_cluster: LocalCluster, cluster: Cluster
) -> None:
    """Read as recorded, it kept "a" busy, so an equal-priority member asking for the card
    would wait until the year 9999."""
    c = cluster
    c.add_model("a")
    c.add_model("b")
    c.demand("a")
    with controller(local_cluster, c.namespace):
        c.wait_serving("a")
        c.demand("a", "9999-12-31T23:59:59Z")
        warned = wait_until(lambda: events(c, "a", "TimestampInFuture"),
                            what="a Warning naming lastActiveTime")
        assert "status.lastActiveTime 9999-12-31T23:59:59+00:00 is in the future" in (
            warned[0]["message"]
        )
        # Rewritten: it ages from now, so once a is idle b takes the card.
        wait_until(lambda: not c.status("a")["lastActiveTime"].startswith("9999"),
                   what="lastActiveTime rewritten")

        def b_serving() -> bool:
            c.demand("b")
            return c.status("b").get("phase") == "Ready"

        wait_until(b_serving, what="b to take the card once a is idle", interval=1.0)
        assert len(events(c, "a", "TimestampInFuture")) == 1


def test_a_preempted_at_in_the_year_9999_starts_the_cooldown_now(
    local_cluster: LocalCluster, cluster: Cluster
) -> None:
    """Read as recorded, it held the group in its swap cooldown until the year 9999: a
    member of higher priority, asking, never got the card."""
    c = cluster
    c.add_model("a")
    c.add_model("vip", priority=500)
    c.demand("a")
    with controller(local_cluster, c.namespace):
        c.wait_serving("a")
        c.api.patch(MODELS, c.namespace, "vip", {"status": {"sharedGroup": {
            "preemptedAt": "9999-12-31T23:59:59Z"}}}, subresource="status")
        warned = wait_until(lambda: events(c, "vip", "TimestampInFuture"),
                            what="a Warning naming preemptedAt")
        assert "status.sharedGroup.preemptedAt 9999-12-31T23:59:59+00:00" in (
            warned[0]["message"]
        )

        def vip_serving() -> bool:
            c.demand("vip")
            return c.status("vip").get("phase") == "Ready"

        wait_until(vip_serving, what="vip to take the card after a cooldown from now",
                   interval=1.0)
        assert not c.status("vip")["sharedGroup"].get("preemptedAt")  # cleared once Ready


# --- leases ------------------------------------------------------------------------------------


def lease_config_map(*, owner: str, expires: str | None = None) -> JSON:
    data = {"group": "g", "owner": owner, "node": "kwok-gpu-0"}
    if expires is not None:
        data["expiresAt"] = expires
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "gpu-lease-g", "labels": {"ai.flexinfer/gpu-lease": "g"}},
            "data": data}


def test_a_lease_whose_expiry_does_not_parse_fails_open_and_says_why(
    local_cluster: LocalCluster, cluster: Cluster
) -> None:
    """Read as "no expiry", it parked the group forever: the opposite of fail open."""
    c = cluster
    c.add_model("a")
    c.demand("a")
    with controller(local_cluster, c.namespace) as ctl:
        c.wait_serving("a")
        c.api.create(CONFIG_MAPS, c.namespace,
                     lease_config_map(owner="trainer", expires="next tuesday"))
        warned = wait_until(lambda: events(c, "gpu-lease-g", "GPULeaseUnreadable"),
                            what="a Warning on the lease ConfigMap")
        assert warned[0]["message"].startswith(
            "data.expiresAt: 'next tuesday' is not an RFC 3339 time"
        )

        def says_why() -> bool:
            active = condition(c.model("a"), "Active")
            return str(active.get("message")).startswith(
                "GPU lease ConfigMap gpu-lease-g cannot be read (data.expiresAt: 'next tuesday' "
                "is not an RFC 3339 time); proceeding as unleased (fail open)"
            )

        wait_until(says_why, what="a's Active condition to say why it was not parked")
        keep_reconciling(ctl, "shared", lambda: c.demand("a"))
        assert c.replicas("a") == 1 and c.status("a")["phase"] == "Ready"
        assert len(events(c, "gpu-lease-g", "GPULeaseUnreadable")) == 1
        errors = metric_value(ctl.scrape(), "flexinfer_gpu_lease_read_errors_total",
                              namespace=c.namespace, source="configmaps")
        assert errors is not None and errors >= 1
        # Fixed, it parks the group as a lease should.
        c.api.patch(CONFIG_MAPS, c.namespace, "gpu-lease-g", {"data": {"expiresAt": None}})
        c.wait_parked("a")


def test_a_legacy_lease_owner_longer_than_preempted_by_still_parks_the_group(
    local_cluster: LocalCluster, cluster: Cluster
) -> None:
    """The 600-byte owner made preemptedBy 422; the status came before the scale-down, so
    the serving pod kept the card next to the lease holder."""
    c = cluster
    c.add_model("a")
    c.demand("a")
    owner = "trainer-" + "x" * 600
    with controller(local_cluster, c.namespace):
        c.wait_serving("a")
        c.api.create(CONFIG_MAPS, c.namespace, lease_config_map(owner=owner))
        parked = c.wait_parked("a")
        preempted_by = parked["sharedGroup"]["preemptedBy"]
        assert preempted_by.startswith("gpu-lease/trainer-xxx") and preempted_by.endswith("...")
        assert len(preempted_by.encode()) == 512
        assert condition(c.model("a"))["reason"] == "GPULeaseHeld"


def test_a_finetune_lease_ttl_near_two_to_the_62_takes_no_lease(
    local_cluster: LocalCluster, cluster: Cluster, tmp_path: Path
) -> None:
    """ttlSeconds near 2**62 (no maximum then) overflowed `now + ttl` at every retry; now
    the cache says which field, no lease parks the group, and its model serves on."""
    c = cluster
    body = {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
        "metadata": {"name": "tuned", "annotations": {COMPLETE_DELAY_ANNOTATION: "1s"}},
        "spec": {
            "source": "HF://test/base",
            # ReadWriteOnce: what the local-path class can bind (as on k3s and kind).
            "accessModes": ["ReadWriteOnce"],
            "finetune": {"gpuLease": {"group": "g", "ttlSeconds": 2**62 - 1},
                         "timeoutSeconds": 600, "image": "trainer.local/qlora:test"},
        },
    }
    with crd_without_bounds(local_cluster, "ai.flexinfer_modelcaches.yaml", tmp_path):
        stored(lambda: c.api.create(MODEL_CACHES, c.namespace, body), "ttlSeconds 2**62-1")
    again = json.loads(json.dumps(body))
    again["metadata"]["name"] = "again"
    assert "ttlSeconds" in refused(
        lambda: c.api.create(MODEL_CACHES, c.namespace, again), "ttlSeconds 2**62-1"
    )
    c.add_model("a")
    c.demand("a")
    with controller(local_cluster, c.namespace):
        c.wait_serving("a")
        ready = invalid_spec(c, MODEL_CACHES, "tuned", "spec.finetune.gpuLease.ttlSeconds")
        assert ready["message"].startswith(
            f"spec.finetune.gpuLease.ttlSeconds: {2**62 - 1} must be between 60 and 2592000"
        )
        assert len(wait_until(lambda: events(c, "tuned", "InvalidSpec"),
                              what="a Warning on the cache")) == 1
        with pytest.raises(NotFound):
            c.api.get(GPU_LEASES, c.namespace, "tuned-gpu-lease")
        assert c.status("a")["phase"] == "Ready" and c.replicas("a") == 1


# --- ModelDeployments ----------------------------------------------------------------------------


def model_deployment(name: str, **spec: Any) -> JSON:
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": name},
            "spec": {"backend": "vllm", "model": f"test/{name}", **on_kwok(), **spec}}


def gpu_group(*members: str) -> JSON:
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "GPUGroup",
            "metadata": {"name": "gg"},
            "spec": {"models": [{"name": m, "priority": 100} for m in members],
                     "antiThrashing": {"enabled": False}}}


def queue(c: Cluster, member: str, queued: int) -> None:
    """What the proxy writes for queued requests (docs/resources.md)."""
    now = now_text()
    value = json.dumps({"queued": queued, "oldestWaiting": now, "reportedAt": now})
    c.api.patch(GPU_GROUPS, c.namespace, "gg",
                {"metadata": {"annotations": {f"demand.ai.flexinfer/{member}": value}}})


def test_a_gpu_group_member_idle_timeout_of_ten_to_the_12_is_left_out(
    local_cluster: LocalCluster, cluster: Cluster, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """idleTimeoutSeconds 10**12 (no maximum then) overflowed the GPUGroup's decision for
    every member; now only that member is left out, and says why."""
    c = cluster
    bad = model_deployment("m1", idleTimeoutSeconds=10**12, gpuGroupRef="gg")
    with crd_without_bounds(local_cluster, "ai.flexinfer_modeldeployments.yaml", tmp_path):
        stored(lambda: c.api.create(MODEL_DEPLOYMENTS, c.namespace, bad), "idleTimeoutSeconds")
    again = model_deployment("again", idleTimeoutSeconds=10**12)
    assert "idleTimeoutSeconds" in refused(
        lambda: c.api.create(MODEL_DEPLOYMENTS, c.namespace, again), "idleTimeoutSeconds 10**12"
    )
    c.api.create(MODEL_DEPLOYMENTS, c.namespace,
                 model_deployment("m2", idleTimeoutSeconds=300, gpuGroupRef="gg"))
    c.api.create(GPU_GROUPS, c.namespace, gpu_group("m1", "m2"))
    caplog.set_level(logging.INFO, logger="flexinfer")
    timeline = PodTimeline(c)
    with controller(local_cluster, c.namespace) as ctl:
        queue(c, "m1", 5)  # m1 asks first, and more: it would win if it could run
        queue(c, "m2", 1)
        wait_until(lambda: c.ready_pods("m2"), what="m2 serving")
        ready = invalid_spec(c, MODEL_DEPLOYMENTS, "m1", "spec.idleTimeoutSeconds")
        assert ready["message"].startswith(
            "spec.idleTimeoutSeconds: 1000000000000 is too long: at most 315360000 seconds"
        )
        keep_reconciling(ctl, "gpugroup", lambda: queue(c, "m1", 6))
        assert c.api.get(GPU_GROUPS, c.namespace, "gg")["status"]["activeModel"] == "m2"
        assert len(events(c, "m1", "InvalidSpec")) == 1
        assert c.replicas("m1") == 0
    timeline.stop()
    assert timeline.violations == []
    assert "m1" not in timeline.created_apps()
    assert len(hostile_lines(caplog, "spec cannot be read")) == 1
    no_tracebacks(caplog)


def test_a_standalone_model_deployment_with_three_billion_replicas_is_held_at_zero(
    local_cluster: LocalCluster, cluster: Cluster, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """replicas 3e9 (no maximum then) failed every scale call, forever; now it is held at
    zero and says which field, while a neighbour scales on demand as usual."""
    c = cluster
    bad = model_deployment("huge", replicas=3_000_000_000, idleTimeoutSeconds=300)
    with crd_without_bounds(local_cluster, "ai.flexinfer_modeldeployments.yaml", tmp_path):
        stored(lambda: c.api.create(MODEL_DEPLOYMENTS, c.namespace, bad), "replicas 3e9")
    again = model_deployment("again", replicas=3_000_000_000)
    assert "replicas" in refused(
        lambda: c.api.create(MODEL_DEPLOYMENTS, c.namespace, again), "replicas 3e9"
    )
    c.api.create(MODEL_DEPLOYMENTS, c.namespace,
                 model_deployment("fine", replicas=1, idleTimeoutSeconds=300))
    caplog.set_level(logging.INFO, logger="flexinfer")
    with controller(local_cluster, c.namespace) as ctl:
        for name in ("huge", "fine"):  # what the proxy records for a request
            c.api.patch(MODEL_DEPLOYMENTS, c.namespace, name,
                        {"status": {"lastAccessTime": now_text()}}, subresource="status")
        wait_until(lambda: c.ready_pods("fine"), what="fine serving")
        ready = invalid_spec(c, MODEL_DEPLOYMENTS, "huge", "spec.replicas")
        assert ready["message"].startswith("spec.replicas: 3000000000 must be between 0 and")
        keep_reconciling(ctl, "modeldeployment", lambda: c.api.patch(
            MODEL_DEPLOYMENTS, c.namespace, "huge",
            {"status": {"lastAccessTime": now_text()}}, subresource="status"))
        assert len(events(c, "huge", "InvalidSpec")) == 1
        assert c.replicas("huge") == 0 and not c.pods("huge")
        status = c.api.get(MODEL_DEPLOYMENTS, c.namespace, "huge")["status"]
        assert status["phase"] == "Failed"
    assert len(hostile_lines(caplog, "spec cannot be read")) == 1
    no_tracebacks(caplog)
