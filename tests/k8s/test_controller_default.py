"""The controller on a real control plane: a shared group's default member comes back.

docs/election.md 1.5. Windows are the harness's short ones (demand 4 s, recent 6 s);
the other model's idle timeout is 5 s, so the scenario plays out in seconds. The
controller runs with no resync: only Events and its own timer (`next_change_at`) wake
it, so the default's return is due to the timer, not to polling. Every wait polls with
a generous deadline; no assertion is about how long something took.
"""

# The fixtures come from .harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import pytest

from flexinfer_core import reasons
from tests.polling import wait_until

from .harness import (  # noqa: F401  (fixtures)
    Cluster,
    PodTimeline,
    cluster,
    controller,
    crds,
    kubectl,
)

pytestmark = pytest.mark.k8s


def _active_reason(c: Cluster, name: str) -> str | None:
    conditions = {x["type"]: x for x in c.status(name).get("conditions") or []}
    active = conditions.get("Active") or {}
    return active.get("reason") if active.get("status") == "True" else None


def test_the_default_comes_back_after_the_other_model_goes_idle(
    local_cluster: object, cluster: Cluster
) -> None:
    c = cluster
    timeline = PodTimeline(c)
    c.add_model("chat", default=True, idle_timeout="1s")
    # Longer than the 4 s demand window: at its end coder is still Ready, so the return
    # has to wait for coder to scale itself to zero (and evict nothing).
    c.add_model("coder", idle_timeout="5s")
    with controller(local_cluster, c.namespace):  # type: ignore[arg-type]
        # Nobody holds the card and nobody is demanded: the default takes it at once,
        # and stays up although it was never asked for (idle past its own 1 s timeout).
        c.wait_serving("chat")
        assert _active_reason(c, "chat") == reasons.RETURN_TO_DEFAULT
        assert c.replicas("chat") == 1

        # coder is asked for: the idle default yields at once.
        def coder_serving() -> bool:
            c.demand("coder")
            return c.status("coder").get("phase") == "Ready"

        wait_until(coder_serving, what="coder to take the card from the idle default")
        assert c.status("chat")["sharedGroup"]["preemptedBy"] == "coder"

        # No more requests: once coder's demand has aged out and it is idle past its
        # idle timeout it scales itself to zero, and the card goes back to chat.
        c.wait_serving("chat", timeout=90.0)
        assert _active_reason(c, "chat") == reasons.RETURN_TO_DEFAULT
        # The Promoted Event keeps the words of the change itself (the status says why
        # chat holds the card now: it keeps it, nobody else is demanded).
        wait_until(
            lambda: [
                e
                for e in c.events("chat")
                if e["reason"] == reasons.PROMOTED
                and "takes the card back: nobody else is demanded and coder is idle past its "
                "5s idle timeout" in e["message"]
            ],
            what="the Promoted Event of chat's return",
        )
        coder = c.status("coder")
        # coder let go of the card by scaling to zero: no eviction, no cooldown stamp.
        assert coder["phase"] == "Idle", coder
        assert not coder["sharedGroup"].get("preemptedAt"), coder
        # Nor does it name a preemptor: only an evicted member says who took its card.
        assert not coder["sharedGroup"].get("preemptedBy"), coder
        wait_until(lambda: c.replicas("coder") == 0 and not c.pods("coder"), what="coder gone")
        assert c.replicas("chat") == 1
    timeline.stop()
    assert timeline.violations == []
