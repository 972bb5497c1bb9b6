"""GPUGroup membership of a ModelDeployment: the rule, and what a conflict does."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flexinfer_core import (
    GpuGroupAction,
    GpuGroupMember,
    GpuGroupPhase,
    GpuGroupState,
    Membership,
    MembershipKind,
    StandaloneDeployment,
    decide_gpu_group,
    decide_standalone,
    member_ready_condition,
    membership_of,
    reasons,
)

from .builders import T0, ago

GROUPS = {"gg": ("chat", "coder"), "other": ("vision",), "empty": ()}


def test_listed_without_a_ref_is_a_member() -> None:
    # The case the proxy used to miss: it only looked at gpuGroupRef.
    chat = membership_of("chat", group_ref="", groups=GROUPS)
    assert (chat.kind, chat.group, chat.listed_by) == (MembershipKind.MEMBER, "gg", ("gg",))
    assert chat.reason == reasons.GPU_GROUP_MEMBER
    assert not chat.in_conflict


def test_listed_with_the_matching_ref_is_a_member() -> None:
    coder = membership_of("coder", group_ref="gg", groups=GROUPS)
    assert (coder.kind, coder.group) == (MembershipKind.MEMBER, "gg")


def test_neither_listed_nor_named_is_standalone() -> None:
    solo = membership_of("solo", group_ref="", groups=GROUPS)
    assert (solo.kind, solo.group, solo.listed_by, solo.reason) == (
        MembershipKind.STANDALONE,
        None,
        (),
        "",
    )


@pytest.mark.parametrize(
    ("name", "ref", "listed_by", "says"),
    [
        ("solo", "empty", (), "GPUGroup empty does not list it in spec.models"),
        ("solo", "ghost", (), "GPUGroup ghost does not exist"),
        ("chat", "other", ("gg",), "it is listed by GPUGroup gg instead"),
    ],
)
def test_a_ref_to_a_group_that_does_not_list_it_is_a_conflict(
    name: str, ref: str, listed_by: tuple[str, ...], says: str
) -> None:
    membership = membership_of(name, group_ref=ref, groups=GROUPS)
    assert (membership.kind, membership.group, membership.listed_by) == (
        MembershipKind.CONFLICT,
        None,
        listed_by,
    )
    assert membership.reason == reasons.GPU_GROUP_REF_NOT_LISTED
    assert f"spec.gpuGroupRef names GPUGroup {ref}" in membership.message
    assert says in membership.message


@pytest.mark.parametrize("ref", ["", "gg", "other"])
def test_listed_by_two_groups_is_a_conflict_whatever_the_ref(ref: str) -> None:
    groups = {**GROUPS, "other": ("vision", "chat")}
    membership = membership_of("chat", group_ref=ref, groups=groups)
    assert (membership.kind, membership.group, membership.listed_by) == (
        MembershipKind.CONFLICT,
        None,
        ("gg", "other"),
    )
    assert membership.reason == reasons.LISTED_BY_MULTIPLE_GPU_GROUPS
    assert "listed by GPUGroups gg, other" in membership.message


def _conflicts() -> list[Membership]:
    return [
        membership_of("solo", group_ref="ghost", groups=GROUPS),
        membership_of("chat", group_ref="", groups={**GROUPS, "other": ("chat",)}),
    ]


@pytest.mark.parametrize("conflict", _conflicts())
def test_a_conflict_holds_the_model_deployment_at_zero(conflict: Membership) -> None:
    state = StandaloneDeployment(
        name="m",
        replicas=2,
        min_replicas=1,
        last_access_time=T0,  # demanded right now
        current_replicas=1,
        ready_replicas=1,
        conflict=conflict,
    )
    decision = decide_standalone(state, now=T0)
    assert (decision.desired_replicas, decision.scale_to, decision.may_serve) == (0, 0, False)
    assert (decision.reason, decision.message) == (conflict.reason, conflict.message)
    assert decision.event is not None and decision.event.type == "Warning"
    assert decision.next_change_at is None
    at_zero = decide_standalone(
        StandaloneDeployment(name="m", current_replicas=0, conflict=conflict),
        now=T0,
    )
    assert (at_zero.scale_to, at_zero.event) == (None, None)


def test_a_member_in_conflict_is_left_out_but_its_pods_still_hold_the_card() -> None:
    held = GpuGroupMember(
        "chat",
        queued=5,
        oldest_waiting=ago(30),
        conflict=reasons.LISTED_BY_MULTIPLE_GPU_GROUPS,
        has_pods=True,
        ready=True,
    )
    coder = GpuGroupMember("coder", queued=1, oldest_waiting=ago(1))
    state = GpuGroupState(
        "gg", members=(held, coder), current_model="chat", last_swap_time=ago(minutes=10)
    )
    decision = decide_gpu_group(state, now=T0)
    # chat had the card and the bigger queue; in conflict it is skipped and let go.
    assert (decision.action, decision.active_model) == (GpuGroupAction.SWAP, "coder")
    assert decision.replicas_for("chat") == 0
    # Break-before-make: coder waits (Graceful) for chat's pods to be gone.
    assert decision.replicas_for("coder") == 0
    later = decide_gpu_group(
        GpuGroupState(
            "gg",
            members=(held, coder),
            current_model="coder",
            last_swap_time=T0,
            swap_count=decision.swap_count,
        ),
        now=T0 + timedelta(seconds=5),
    )
    assert (later.phase, later.replicas_for("coder")) == (GpuGroupPhase.DRAINING, 0)


def test_a_group_whose_members_all_conflict_says_why() -> None:
    state = GpuGroupState(
        "gg",
        members=(
            GpuGroupMember("chat", queued=1, conflict=reasons.GPU_GROUP_REF_NOT_LISTED),
            GpuGroupMember("ghost", exists=False),
        ),
    )
    decision = decide_gpu_group(state, now=T0)
    assert decision.phase is GpuGroupPhase.FAILED
    assert decision.active_model is None
    assert decision.message == (
        "no member ModelDeployment can run (chat: GPUGroupRefNotListed, ghost: missing)"
    )


def test_a_members_ready_condition_names_its_group() -> None:
    chat = membership_of("chat", group_ref="", groups=GROUPS)
    serving = member_ready_condition(chat, serving=True)
    assert (serving.type, serving.status, serving.reason) == ("Ready", True, "GPUGroupMember")
    assert "member of GPUGroup gg" in serving.message
    assert not member_ready_condition(chat, serving=False).status
    conflict = membership_of("solo", group_ref="ghost", groups=GROUPS)
    assert not member_ready_condition(conflict, serving=True).status
