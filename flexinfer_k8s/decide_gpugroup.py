"""A GPUGroup decided as the controller decides it, for the controller and the command.

`decide_gpu_group_snapshot` is the one place the controller's reconcile
(`reconcile_gpugroup`) and `flexinfer explain`, `status` and `doctor` decide a
GPUGroup: with the controller's DRA device class (`--gpu-device-class`) and a group
that sets `spec.vramBudget`, packed (`decide_gpu_group_on_card`, docs/election.md 3,
"Packing"), a member whose pods cannot reference the group's claim
(`shared_card.deployment_cannot_share`: not on one AMD GPU) read as unknown footprint,
the whole card; otherwise one member at a time (`decide_gpu_group`). Pure: objects in,
values out.
"""

from __future__ import annotations

from datetime import datetime

import attrs

from flexinfer_core import GpuGroupState
from flexinfer_core.gpugroup_packing import GpuGroupOutcome, decide_gpu_group_on_card
from flexinfer_k8s.observe import GpuGroupSnapshot
from flexinfer_k8s.shared_card import deployment_cannot_share


def packs(snapshot: GpuGroupSnapshot, device_class: str) -> bool:
    """Whether the group is decided packed: a device class, and a budget."""
    return bool(device_class) and snapshot.state.vram_budget is not None


def sharing_state(snapshot: GpuGroupSnapshot, device_class: str) -> GpuGroupState:
    """The group as decided on: with `device_class` and a budget, the footprint of a
    member whose pods cannot share its claim unknown; otherwise as observed."""
    state = snapshot.state
    if not packs(snapshot, device_class):
        return state
    alone = {
        member
        for member, md in snapshot.model_deployments.items()
        if deployment_cannot_share(md, device_class, group=state.name)
    }
    if not alone & {m.name for m in state.members if m.vram_estimate is not None}:
        return state
    return attrs.evolve(
        state,
        members=tuple(
            attrs.evolve(m, vram_estimate=None) if m.name in alone else m for m in state.members
        ),
    )


def decide_gpu_group_snapshot(
    snapshot: GpuGroupSnapshot, *, device_class: str, now: datetime
) -> tuple[GpuGroupState, GpuGroupOutcome]:
    """The group as decided on (`sharing_state`) and the controller's decision on it."""
    state = sharing_state(snapshot, device_class)
    outcome = decide_gpu_group_on_card(state, now=now, shared_card=packs(snapshot, device_class))
    return state, outcome
