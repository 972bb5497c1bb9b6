"""Draining before preemption on a real control plane (docs/election.md 1.6).

The test writes `status.inFlight` itself, as the proxy would. A busy holder that loses
the card to a more important model keeps its pod while its count is above 0; the new
holder waits (break-before-make: never two members' pods at once) and starts once the
count drops to 0, or once the drain timeout has passed with the count stuck. Windows are
the harness's short ones (demand 4 s); every wait polls with a generous deadline.
"""

# The fixtures come from .harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from flexinfer_core.timestamps import parse_rfc3339
from tests.polling import hold_while, wait_until

from .harness import (  # noqa: F401  (fixtures)
    Cluster,
    PodTimeline,
    cluster,
    controller,
    crds,
    drains_observed,
    kubectl,
)

pytestmark = pytest.mark.k8s


def _draining(c: Cluster, name: str, *, asker: str) -> Callable[[], dict[str, object] | None]:
    def probe() -> dict[str, object] | None:
        c.demand(asker)  # the held requests keep the asker demanded, as the proxy does
        status = c.status(name)
        return status if status.get("phase") == "Draining" else None

    return probe


def test_preemption_waits_for_the_requests_in_flight_then_proceeds_at_zero(
    local_cluster: object, cluster: Cluster
) -> None:
    c = cluster
    timeline = PodTimeline(c)
    c.add_model("low", priority=100, drain_timeout="10m")
    c.add_model("high", priority=300)
    c.demand("low")
    with controller(local_cluster, c.namespace) as ctl:  # type: ignore[arg-type]
        c.wait_serving("low")
        c.in_flight("low", 2)
        c.demand("high")
        low = wait_until(_draining(c, "low", asker="high"), what="low to drain")
        assert (low.get("sharedGroup") or {}).get("drainingSince")  # type: ignore[union-attr]

        def waiting() -> bool:
            c.demand("high")
            high = c.status("high")
            ready = {x["type"]: x for x in high.get("conditions") or []}.get("Ready") or {}
            return (
                (high.get("sharedGroup") or {}).get("state") == "Active"
                and ready.get("reason") == "WaitingForGPU"
                and "waiting for low to drain (2 in flight" in str(high.get("message"))
                and c.replicas("high") == 0
                and not c.pods("high")
                and c.replicas("low") == 1
                and len(c.ready_pods("low")) == 1
                and c.status("low").get("phase") == "Draining"
                # the controller's status writes keep what the proxy wrote
                and (c.status("low").get("inFlight") or {}).get("count") == 2
            )

        # high's own status (holding the card, waiting) is a step on its way to serving:
        # written once it has waited the coalescing window (5 s), low's eviction first.
        wait_until(waiting, what="high to say it waits for low's drain", interval=0.5)
        # While the count stays above 0 nothing moves (sampled for a few seconds, well
        # past the 2 s swap cooldown and a kwok pod's 1 s start).
        deadline = time.monotonic() + 4
        hold_while(lambda: time.monotonic() < deadline, waiting, what="the drain", interval=0.5)

        c.in_flight("low", 0)  # the last answer ended

        def high_serving() -> bool:
            c.demand("high")
            return c.status("high").get("phase") == "Ready"

        wait_until(high_serving, what="high to serve once low drained", interval=0.5)
        low_status = c.status("low")
        assert low_status["phase"] == "Preempted"
        assert low_status["sharedGroup"]["preemptedBy"] == "high"
        assert not low_status["sharedGroup"].get("drainingSince")
        assert c.replicas("low") == 0
        # One drain, from drainingSince to the scale-down, ended by the count.
        drains = drains_observed(ctl.scrape(), c.namespace, "low")
        assert list(drains) == ["drained"]
        count, seconds = drains["drained"]
        assert count == 1 and 4 <= seconds < 600
    timeline.stop()
    assert timeline.violations == []
    assert timeline.created_apps() == ["low", "high"]


def test_a_controller_restarted_mid_drain_keeps_the_same_deadline(
    local_cluster: object, cluster: Cluster
) -> None:
    c = cluster
    timeline = PodTimeline(c)
    c.add_model("low", priority=100, drain_timeout="20s")
    c.add_model("high", priority=300)
    c.demand("low")
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        c.wait_serving("low")
        c.in_flight("low", 1)
        c.demand("high")
        low = wait_until(_draining(c, "low", asker="high"), what="low to drain")
    since = (low["sharedGroup"] or {})["drainingSince"]  # type: ignore[index]
    # A new controller (nothing in memory) reads the drain from the cluster.
    with controller(local_cluster, c.namespace) as ctl:  # type: ignore[arg-type]
        c.demand("high")
        ctl.settle(c)
        still = c.status("low")
        assert still.get("phase") == "Draining"
        assert still["sharedGroup"]["drainingSince"] == since

        def high_serving() -> bool:
            c.demand("high")
            return c.status("high").get("phase") == "Ready"

        wait_until(high_serving, what="high to serve after low's drain timeout", interval=0.5)
        shared = c.status("low")["sharedGroup"]
        started, ended = parse_rfc3339(since), parse_rfc3339(shared["preemptedAt"])
        assert started is not None and ended is not None
        # Not before the deadline drainingSince + 20s.
        assert (ended - started).total_seconds() >= 20
    timeline.stop()
    assert timeline.violations == []


def test_a_stuck_count_is_scaled_down_at_the_drain_timeout(
    local_cluster: object, cluster: Cluster
) -> None:
    c = cluster
    timeline = PodTimeline(c)
    c.add_model("low", priority=100, drain_timeout="3s")
    c.add_model("high", priority=300)
    c.demand("low")
    with controller(local_cluster, c.namespace) as ctl:  # type: ignore[arg-type]
        c.wait_serving("low")
        c.in_flight("low", 5)  # and never again: a proxy whose answers hang
        c.demand("high")
        low = wait_until(_draining(c, "low", asker="high"), what="low to drain")
        since = parse_rfc3339((low["sharedGroup"] or {})["drainingSince"])  # type: ignore[index]

        def high_serving() -> bool:
            c.demand("high")
            return c.status("high").get("phase") == "Ready"

        wait_until(high_serving, what="high to serve after low's drain timeout", interval=0.5)
        shared = c.status("low")["sharedGroup"]
        preempted_at = parse_rfc3339(shared["preemptedAt"])
        assert since is not None and preempted_at is not None
        # Evicted by the deadline, not before it: the count never dropped.
        assert (preempted_at - since).total_seconds() >= 3
        assert c.status("low")["inFlight"]["count"] == 5
        # One drain, ended by its deadline.
        drains = drains_observed(ctl.scrape(), c.namespace, "low")
        assert list(drains) == ["deadline"]
        count, seconds = drains["deadline"]
        assert count == 1 and seconds >= 3
    timeline.stop()
    assert timeline.violations == []
    assert timeline.created_apps() == ["low", "high"]
