"""A group with a VRAM budget (docs/election.md 1.7).

On a cluster whose pods cannot share a card (a controller started without
`--gpu-device-class`, `shared_card` False) the controller runs it one member at a time,
exactly as without a budget, and tells every member why in its `Packed` condition and
`status.vram`. With the local cluster's fake DRA driver's class (`gpu.amd.com`) it
renders the group's one ResourceClaim, which the members' pods reference, and never
takes over a claim of that name it did not create.
"""

# The fixtures come from .harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import time

import pytest

from flexinfer_devcluster import gpudriver
from flexinfer_devcluster.policy import dev_policy
from flexinfer_k8s.render.workloads import RenderSettings
from flexinfer_kube.kubeapi import JSON, NotFound
from flexinfer_kube.objects import get_path
from flexinfer_kube.resources import DEPLOYMENTS, MODELS, RESOURCE_CLAIMS
from tests.polling import hold_while, wait_until

from .harness import (  # noqa: F401  (fixtures)
    Cluster,
    PodTimeline,
    cluster,
    controller,
    crds,
    foreign_claim,
    kubectl,
)

pytestmark = pytest.mark.k8s


def packed(c: Cluster, name: str) -> dict[str, str]:
    conditions = c.status(name).get("conditions") or []
    return next((x for x in conditions if x["type"] == "Packed"), {})


def test_a_budgeted_group_without_a_shared_card_runs_one_member_at_a_time(
    local_cluster: object, cluster: Cluster
) -> None:
    c = cluster
    timeline = PodTimeline(c)
    # Both fit the budget together (8 of 24 GiB): with a shared card they would pack.
    c.add_model("chat", priority=200, vram=("24Gi", "4Gi"))
    c.add_model("embed", priority=100, vram=("24Gi", "4Gi"))
    c.demand("chat")
    c.demand("embed")
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        c.wait_serving("chat")
        wait_until(lambda: packed(c, "embed").get("reason") == "NoSharedCard",
                   what="embed told it runs one at a time")
        deadline = time.monotonic() + 3
        hold_while(
            lambda: time.monotonic() < deadline,
            lambda: c.replicas("embed") == 0 and c.replicas("chat") == 1,
            what="embed must not start beside chat",
            interval=0.25,
        )
        for name in ("chat", "embed"):
            condition = packed(c, name)
            assert (condition["status"], condition["reason"]) == ("False", "NoSharedCard")
            assert "--gpu-device-class" in condition["message"]
            assert c.status(name)["vram"] == {"footprint": "4Gi", "budget": "24Gi"}
        assert c.status("embed")["sharedGroup"]["state"] == "Queued"
        # The members disagree: that is said instead, and still one at a time.
        c.api.patch(
            MODELS, c.namespace, "embed", {"spec": {"gpu": {"vramBudget": "16Gi"}}}
        )
        wait_until(lambda: packed(c, "chat").get("reason") == "VramBudgetConflict",
                   what="chat told the members disagree")
        assert "embed: 16 GiB" in packed(c, "chat")["message"]
        assert c.replicas("embed") == 0
    timeline.stop()
    assert timeline.violations == []


SHARED_CARD = RenderSettings(policy=dev_policy(), gpu_device_class=gpudriver.DEVICE_CLASS)
"""A controller started with `--gpu-device-class gpu.amd.com`."""
CLAIM = "flexinfer-gpu-shared-g"


def claim_of(c: Cluster) -> JSON | None:
    try:
        return c.api.get(RESOURCE_CLAIMS, c.namespace, CLAIM)
    except NotFound:
        return None


def rendered(c: Cluster, name: str) -> dict[str, str]:
    conditions = c.status(name).get("conditions") or []
    return next((x for x in conditions if x["type"] == "Rendered"), {})


def test_with_a_device_class_the_members_pods_share_the_groups_one_claim(
    local_cluster: object, cluster: Cluster
) -> None:
    c = cluster
    c.add_model("chat", priority=200, vram=("24Gi", "8Gi"))
    c.add_model("embed", priority=100, vram=("24Gi", "8Gi"))
    c.demand("chat")
    c.demand("embed")
    with controller(local_cluster, c.namespace, settings=SHARED_CARD):  # type: ignore[arg-type]
        c.wait_serving("chat")
        c.wait_serving("embed")  # packed beside chat: both hold the card
        claim = wait_until(lambda: claim_of(c), what="the group's claim")
        owners = claim["metadata"]["ownerReferences"]
        assert sorted(o["name"] for o in owners) == ["chat", "embed"]
        assert not any(o.get("controller") for o in owners)
        [request] = claim["spec"]["devices"]["requests"]
        assert request["exactly"]["deviceClassName"] == "gpu.amd.com"
        nodes = set()
        for name in ("chat", "embed"):
            [pod] = c.ready_pods(name)
            assert pod["spec"]["resourceClaims"] == [
                {"name": "gpu", "resourceClaimName": CLAIM}
            ]
            server = pod["spec"]["containers"][0]
            assert "amd.com/gpu" not in (get_path(server, "resources", "limits") or {})
            nodes.add(pod["spec"]["nodeName"])
            assert packed(c, name)["status"] == "True"
        assert len(nodes) == 1  # the claim's one device
        allocated = c.api.get(RESOURCE_CLAIMS, c.namespace, CLAIM)["status"]
        assert sorted(r["name"] for r in allocated["reservedFor"]) == sorted(
            p["metadata"]["name"] for p in c.pods()
        )

        # A member that joins becomes an owner too; one that leaves is no owner any more.
        c.add_model("coder", priority=50, vram=("24Gi", "4Gi"))
        wait_until(
            lambda: sorted(o["name"] for o in claim_of(c)["metadata"]["ownerReferences"])  # type: ignore[index]
            == ["chat", "coder", "embed"],
            what="coder an owner of the claim",
        )
        c.api.patch(MODELS, c.namespace, "coder", {"spec": {"gpu": {"shared": "other"}}})
        wait_until(
            lambda: sorted(o["name"] for o in claim_of(c)["metadata"]["ownerReferences"])  # type: ignore[index]
            == ["chat", "embed"],
            what="coder no owner of the claim once it left the group",
        )


def test_a_claim_of_the_groups_name_that_flexinfer_did_not_create_is_never_used(
    local_cluster: object, cluster: Cluster
) -> None:
    c = cluster
    foreign = foreign_claim(CLAIM, gpudriver.DEVICE_CLASS)
    c.api.create(RESOURCE_CLAIMS, c.namespace, foreign)
    c.add_model("chat", vram=("24Gi", "8Gi"))
    c.demand("chat")
    with controller(local_cluster, c.namespace, settings=SHARED_CARD):  # type: ignore[arg-type]
        wait_until(lambda: rendered(c, "chat").get("reason") == "NameClash",
                   what="chat told the claim is not flexinfer's")
        assert f"ResourceClaim {c.namespace}/{CLAIM}" in rendered(c, "chat")["message"]
        # Nothing of chat's is applied: its pod would use someone else's device.
        with pytest.raises(NotFound):
            c.api.get(DEPLOYMENTS, c.namespace, "chat")
        untouched = claim_of(c)
        assert untouched is not None
        assert untouched["metadata"]["labels"] == {"team": "ml"}
        assert not untouched["metadata"].get("ownerReferences")
        warnings = [e for e in c.events("chat") if e["reason"] == "NameClash"]
        assert warnings and CLAIM in warnings[0]["message"]

        # Its owner deletes it: the controller makes the group's own and chat runs.
        c.api.delete(RESOURCE_CLAIMS, c.namespace, CLAIM)
        c.wait_serving("chat", timeout=90)
        ours = claim_of(c)
        assert ours is not None
        assert ours["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "flexinfer"


def test_a_changed_device_class_makes_the_claim_again_only_once_no_pod_holds_it(
    local_cluster: object, cluster: Cluster
) -> None:
    c = cluster
    other = "gpu-other.flexinfer.test"
    api = c.api
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": other},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.amd.com'"}}]}}
    api.apply(gpudriver.DEVICE_CLASSES, "", other, body, field_manager="flexinfer-test")
    # chat idles out 2 s after its demand window: its pod goes, and the claim is free.
    c.add_model("chat", vram=("24Gi", "8Gi"), idle_timeout="2s")
    c.demand("chat")
    with controller(local_cluster, c.namespace, settings=SHARED_CARD):  # type: ignore[arg-type]
        c.wait_serving("chat")
        assert device_class(claim_of(c)) == gpudriver.DEVICE_CLASS
    moved = RenderSettings(policy=dev_policy(), gpu_device_class=other)
    seen: list[tuple[str | None, bool, bool]] = []  # (class, held by a pod, being deleted)

    def made_again() -> bool:
        claim = claim_of(c)
        seen.append((
            device_class(claim),
            bool(get_path(claim, "status", "reservedFor")),
            bool(get_path(claim, "metadata", "deletionTimestamp")),
        ))
        return seen[-1][0] == other

    c.demand("chat")
    with controller(local_cluster, c.namespace, settings=moved):  # type: ignore[arg-type]
        wait_until(made_again, what="the claim made again with the new class", timeout=90,
                   interval=0.1)
    # A claim's spec cannot change: while chat's pod held it, it kept its class and was
    # not deleted.
    assert (gpudriver.DEVICE_CLASS, True, False) in seen, seen
    assert not [x for x in seen if x[1] and x[2]], seen


def device_class(claim: JSON | None) -> str | None:
    if claim is None:
        return None
    return str(claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"])


def test_a_member_whose_pods_cannot_share_the_claim_takes_the_whole_card(
    local_cluster: object, cluster: Cluster
) -> None:
    """Two GPUs cannot be one claim's one device: such a member counts as of unknown
    footprint (docs/election.md 1.7), so it is packed with nobody, whatever it declares."""
    c = cluster
    timeline = PodTimeline(c)
    c.add_model("chat", priority=200, vram=("24Gi", "8Gi"))
    c.add_model("vision", priority=100, vram=("24Gi", "8Gi"))
    c.api.patch(MODELS, c.namespace, "vision", {"spec": {"gpu": {"count": 2}}})
    c.demand("chat")
    c.demand("vision")
    with controller(local_cluster, c.namespace, settings=SHARED_CARD):  # type: ignore[arg-type]
        c.wait_serving("chat")
        wait_until(lambda: packed(c, "vision").get("reason") == "WaitingForVram",
                   what="vision told it waits for the whole card")
        assert "footprint is unknown" in packed(c, "vision")["message"]
        deadline = time.monotonic() + 3
        hold_while(
            lambda: time.monotonic() < deadline,
            lambda: c.replicas("vision") == 0,
            what="vision must not start beside chat",
            interval=0.25,
        )
        # Its pods would not reference the claim anyway: they ask for two GPUs.
        template = c.api.get(DEPLOYMENTS, c.namespace, "vision")["spec"]["template"]["spec"]
        assert "resourceClaims" not in template
    timeline.stop()
    assert timeline.violations == []
