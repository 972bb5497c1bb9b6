"""Which GPUGroup governs a ModelDeployment: the one rule the controller and the proxy share.

docs/resources.md (GPUGroup): a ModelDeployment is a member of the GPUGroup that
lists it in `spec.models`, in its own namespace. `spec.gpuGroupRef` may be left out;
when it is set it must name that same group. What the rule refuses to guess:

- `gpuGroupRef` names a group that does not list it (`GPUGroupRefNotListed`);
- two or more groups list it (`ListedByMultipleGPUGroups`).

A ModelDeployment in conflict is run by nobody: it stays at 0 replicas (never as a
standalone beside a group's holder), the groups that list it leave it out of their
decisions (its pods still count as holding their card), and its Ready condition
says why, naming the groups. One that no group lists and that names none is
standalone (docs/election.md section 4). No I/O: the adapters read `spec.models`
and `gpuGroupRef` and pass them in.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping

import attrs

from flexinfer_core import reasons
from flexinfer_core.snapshot import Condition


class MembershipKind(enum.StrEnum):
    STANDALONE = "Standalone"
    MEMBER = "Member"
    CONFLICT = "Conflict"


@attrs.frozen
class Membership:
    """Where one ModelDeployment belongs, and for a conflict, why it runs nowhere."""

    name: str
    kind: MembershipKind
    # The governing GPUGroup (MEMBER only).
    group: str | None = None
    # Every GPUGroup that lists it, sorted; they all reconcile when it changes.
    listed_by: tuple[str, ...] = ()
    reason: str = ""
    message: str = ""

    @property
    def in_conflict(self) -> bool:
        return self.kind is MembershipKind.CONFLICT


def membership_of(
    name: str, *, group_ref: str, groups: Mapping[str, Collection[str]]
) -> Membership:
    """The membership of ModelDeployment `name`.

    `group_ref` is its `spec.gpuGroupRef` ("" for none); `groups` maps every GPUGroup
    of its namespace to the names it lists in `spec.models`.
    """
    listed_by = tuple(sorted(group for group, members in groups.items() if name in members))
    if len(listed_by) > 1:
        return Membership(
            name=name,
            kind=MembershipKind.CONFLICT,
            listed_by=listed_by,
            reason=reasons.LISTED_BY_MULTIPLE_GPU_GROUPS,
            message=f"{name} is listed by GPUGroups {', '.join(listed_by)}; a ModelDeployment "
            "belongs to one group, so it is not run until all but one drop it",
        )
    if listed_by and group_ref in ("", listed_by[0]):
        return Membership(
            name=name,
            kind=MembershipKind.MEMBER,
            group=listed_by[0],
            listed_by=listed_by,
            reason=reasons.GPU_GROUP_MEMBER,
            message=f"{name} is a member of GPUGroup {listed_by[0]}, which decides its replicas",
        )
    if group_ref:
        if listed_by:
            where = f"it is listed by GPUGroup {listed_by[0]} instead"
        elif group_ref in groups:
            where = f"GPUGroup {group_ref} does not list it in spec.models"
        else:
            where = f"GPUGroup {group_ref} does not exist"
        return Membership(
            name=name,
            kind=MembershipKind.CONFLICT,
            listed_by=listed_by,
            reason=reasons.GPU_GROUP_REF_NOT_LISTED,
            message=f"{name}'s spec.gpuGroupRef names GPUGroup {group_ref}, but {where}; "
            "it is not run until the two agree",
        )
    return Membership(name=name, kind=MembershipKind.STANDALONE)


def member_ready_condition(membership: Membership, *, serving: bool) -> Condition:
    """The Ready condition of a GPUGroup member's ModelDeployment (`serving`: a pod is
    ready). It replaces whatever an earlier standalone or conflicting life wrote; a
    ModelDeployment in conflict is never Ready."""
    return Condition(
        "Ready", serving and not membership.in_conflict, membership.reason, membership.message
    )
