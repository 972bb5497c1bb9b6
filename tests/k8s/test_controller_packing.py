"""A group with a VRAM budget on a cluster whose pods cannot share a card (docs/election.md
1.7): the controller runs it one member at a time, exactly as without a budget, and
tells every member why in its `Packed` condition and `status.vram`.

The local cluster's controller here has no DRA device class (`shared_card` False, the
default of a controller started without `--gpu-device-class`).
"""

# The fixtures come from .harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import time

import pytest

from flexinfer_kube.resources import MODELS
from tests.polling import hold_while, wait_until

from .harness import (  # noqa: F401  (fixtures)
    Cluster,
    PodTimeline,
    cluster,
    controller,
    crds,
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
