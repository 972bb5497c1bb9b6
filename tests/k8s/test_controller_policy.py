"""The controller's election policy flags on a real control plane.

`--default-swap-cooldown` is the cooldown of every Model that sets no
`spec.gpu.swapCooldown`: the CRD does not default the field, so the flag governs
Models stored in the cluster. A Model stored with a value (as the CRD once wrote
`5m` into every Model) keeps its own. The cooldown in force is read from the new
holder's message, which names it ("inside the 2m swap cooldown"): nothing here
depends on how long anything takes.
"""

# The fixtures come from .harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

from pathlib import Path

import pytest

from flexinfer_devcluster.localcluster import LocalCluster
from flexinfer_kube.resources import MODELS
from tests.polling import wait_until

from .harness import (  # noqa: F401  (fixtures)
    Cluster,
    ControllerProcess,
    PodTimeline,
    cluster,
    crds,
    kubectl,
    model_body,
)

pytestmark = pytest.mark.k8s


def active_message(c: Cluster, name: str) -> str:
    conditions = {x["type"]: x for x in c.status(name).get("conditions") or []}
    active = conditions.get("Active") or {}
    return str(active.get("message") or "") if active.get("status") == "True" else ""


def test_the_controllers_default_swap_cooldown_governs_a_model_without_one(
    local_cluster: LocalCluster, cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    # Two groups, two cards: break-before-make holds within each.
    timelines = [PodTimeline(c, exclusive={"x", "y"}), PodTimeline(c, exclusive={"p", "q"})]
    for name in ("x", "y"):
        body = model_body(name, group="fresh")
        del body["spec"]["gpu"]["swapCooldown"]
        c.api.create(MODELS, c.namespace, body)
    # Stored as the CRD used to store every Model: with the old default written in.
    c.add_model("p", group="stored", swap_cooldown="5m")
    c.add_model("q", group="stored", swap_cooldown="5m")
    # The API server leaves the field out: "the controller's default".
    assert "swapCooldown" not in c.model("x")["spec"]["gpu"]
    assert c.model("p")["spec"]["gpu"]["swapCooldown"] == "5m"

    c.demand("x")
    c.demand("p")
    controller = ControllerProcess(
        local_cluster,
        c.namespace,
        log=tmp_path / "controller.log",
        extra=("--default-swap-cooldown", "2m"),  # after the harness's 3s: the last one wins
    )
    try:
        c.wait_serving("x")
        c.wait_serving("p")

        # x and p go idle (the demand window is 4 s) while y and q keep asking: equal
        # priority takes the card from an idle leader, and the eviction starts the
        # group's cooldown, which then holds the card for the new holder.
        def swapped() -> bool:
            c.demand("y")
            c.demand("q")
            return "swap cooldown" in active_message(c, "y") and "swap cooldown" in (
                active_message(c, "q")
            )

        wait_until(swapped, what="y and q to take the cards", interval=1.0, timeout=90)
        assert "inside the 2m swap cooldown" in active_message(c, "y")
        assert "inside the 5m swap cooldown" in active_message(c, "q")
        assert c.status("x")["sharedGroup"]["preemptedBy"] == "y"
        assert c.status("p")["sharedGroup"]["preemptedBy"] == "q"
    finally:
        controller.terminate()
    for timeline in timelines:
        timeline.stop()
        assert timeline.violations == []
