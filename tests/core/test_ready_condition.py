"""The Ready condition says why a member is not serving (kubectl's REASON column).

`kubectl get models` shows the Ready condition's reason; a member that is parked or
held back says why there, not just its phase.
"""

from __future__ import annotations

from flexinfer_core import GpuLease, Phase, SharedState, decide_group, reasons

from .builders import T0, ago, member


def ready(decision: object, name: str) -> tuple[bool, str, str]:
    condition = next(c for c in decision.member(name).conditions if c.type == "Ready")  # type: ignore[attr-defined]
    return condition.status, condition.reason, condition.message


def test_a_queued_member_says_its_place_in_the_queue() -> None:
    # Not the holder's name: that would rewrite every queued member at every handover.
    models = [
        member("chat", phase=Phase.READY, shared_state=SharedState.ACTIVE, last_active=ago(5)),
        member("coder", last_active=ago(3)),
    ]
    decision = decide_group(models, now=T0)
    assert ready(decision, "chat") == (True, "Ready", "chat is serving")
    assert ready(decision, "coder") == (
        False,
        reasons.QUEUED,
        "queued for the GPU (queue position 1)",
    )


def test_under_a_lease_every_parked_member_names_the_lease() -> None:
    lease = GpuLease(name="train", group="homelab-gpu", owner="ft")
    models = [member("chat", phase=Phase.READY), member("coder")]
    decision = decide_group(models, now=T0, leases=[lease])
    assert ready(decision, "chat")[:2] == (False, reasons.GPU_LEASE_HELD)  # evicted
    status, reason, message = ready(decision, "coder")  # was idle, parked all the same
    assert (status, reason) == (False, reasons.GPU_LEASE_HELD)
    assert "gpu-lease/ft" in message


def test_a_holder_waiting_for_the_card_says_so() -> None:
    models = [
        member("coder", phase=Phase.PREEMPTED, shared_state=SharedState.QUEUED),
        member("chat", priority=200, last_active=ago(1)),
    ]
    decision = decide_group(models, now=T0, running={"coder"})
    assert decision.leader == "chat"
    status, reason, message = ready(decision, "chat")
    assert (status, reason) == (False, reasons.WAITING_FOR_GPU)
    assert "coder" in message


def test_a_failed_member_keeps_its_failure() -> None:
    models = [
        member("chat", phase=Phase.READY, last_active=ago(1)),
        member("broken", phase=Phase.FAILED),
    ]
    assert ready(decide_group(models, now=T0), "broken")[:2] == (False, "Failed")
