"""What each reconciler decides on, read from a `ClusterCache`.

The reconcilers and `flexinfer explain` take their snapshots from here, so the
command explains exactly the inputs the controller decides on: a shared group's
members as `ModelState`s (each with its Deployment, pods, Service and cache
readiness), the group's leases and the lease sources that could not be read, and
which members (present or departed) still have pods, the node each member serves
on (for `status.nodeName`), and the members whose spec cannot be read (left out of
the decision); a GPUGroup's `GpuGroupState` with its
members' memberships, replicas and pods (a member whose spec cannot be read left out
like a conflict); a standalone ModelDeployment's `StandaloneDeployment`. Reads only:
no writes, no decisions, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet

import attrs

from flexinfer_core import (
    GpuGroupState,
    GpuLease,
    InvalidFieldError,
    Membership,
    ModelState,
    StandaloneDeployment,
    reasons,
)
from flexinfer_k8s.cache import ClusterCache
from flexinfer_k8s.convert_gpugroups import gpu_group_state_from_k8s, unreadable_members
from flexinfer_k8s.convert_model_deployments import standalone_from_k8s
from flexinfer_k8s.convert_models import model_state_from_k8s
from flexinfer_k8s.pods import deployment_replicas, live_pods, serving_node
from flexinfer_kube.kubeapi import JSON
from flexinfer_kube.objects import gpu_group_member_names, name_of, namespace_of
from flexinfer_kube.resources import MODEL_DEPLOYMENTS, MODELS


@attrs.frozen
class UnreadableModel:
    """A member Model whose spec cannot be read (flexinfer_core.invalid): left out of the
    decision, with what the writes for it need."""

    obj: JSON
    error: InvalidFieldError
    deployment: JSON | None


@attrs.frozen
class SharedGroupSnapshot:
    """One shared group (or one standalone Model, `group == ""`) as the core sees it."""

    namespace: str
    group: str
    states: tuple[ModelState, ...]
    leases: tuple[GpuLease, ...]
    # Lease carriers that cannot be listed; the core fails open on them.
    unreadable_lease_sources: tuple[str, ...]
    # Members present or departed that still have pods (the unreadable ones included).
    running: frozenset[str]
    unreadable: tuple[UnreadableModel, ...] = ()
    # The node of each member's Ready pod, for members that have one (`pods.serving_node`).
    serving_nodes: Mapping[str, str] = attrs.field(factory=dict)


def shared_group_snapshot(
    cache: ClusterCache,
    namespace: str,
    group: str,
    models: Sequence[JSON],
    *,
    departed: AbstractSet[str] = frozenset(),
) -> SharedGroupSnapshot:
    """The members `models` of `group` with everything their decision reads.

    `departed` names former members whose pods still hold the card.
    """
    states: list[ModelState] = []
    unreadable: list[UnreadableModel] = []
    running: set[str] = set(departed)
    nodes: dict[str, str] = {}
    if group:
        running |= cache.group_occupants(namespace, group=group, kind=MODELS.kind)
    for obj in models:
        name = name_of(obj)
        deployment = cache.workload_of(MODELS, namespace, name)
        pods = cache.pods_of(deployment)
        if live_pods(pods):
            running.add(name)  # whether or not its spec can be read
        node = serving_node(pods)
        if node is not None:
            nodes[name] = node
        try:
            states.append(
                model_state_from_k8s(
                    obj,
                    deployment=deployment,
                    pods=pods,
                    cache_ready=cache.model_cache_ready(namespace, cache.model_cache_name(obj)),
                )
            )
        except InvalidFieldError as error:
            unreadable.append(UnreadableModel(obj, error, deployment))
    # A Model outside any shared group has no lease to read.
    return SharedGroupSnapshot(
        namespace=namespace,
        group=group,
        states=tuple(states),
        leases=tuple(cache.leases(namespace)) if group else (),
        unreadable_lease_sources=tuple(cache.unreadable_lease_sources(namespace)) if group else (),
        running=frozenset(running),
        unreadable=tuple(unreadable),
        serving_nodes=nodes,
    )


def departed_members(
    cache: ClusterCache, namespace: str, group: str, *, members: AbstractSet[str]
) -> set[str]:
    """Former members of `group` (deleted, or moved away) whose pods are still there."""
    return cache.group_occupants(namespace, group=group, kind=MODELS.kind) - members


@attrs.frozen
class GpuGroupSnapshot:
    """A GPUGroup as the core sees it, with its members' ModelDeployments and pods."""

    state: GpuGroupState
    members: tuple[str, ...]
    model_deployments: dict[str, JSON]
    memberships: dict[str, Membership]
    member_pods: dict[str, list[JSON]]
    replicas: dict[str, int | None]
    # Members whose own spec cannot be read, with why: left out like a conflict.
    unreadable: dict[str, InvalidFieldError] = attrs.field(factory=dict)


def gpu_group_snapshot(cache: ClusterCache, group: JSON) -> GpuGroupSnapshot:
    """The GPUGroup with its members; raises `InvalidFieldError` when the group's own
    spec or status cannot be read (a member's leaves just that member out)."""
    namespace = namespace_of(group)
    members = tuple(gpu_group_member_names(group))
    model_deployments: dict[str, JSON] = {}
    memberships: dict[str, Membership] = {}
    member_pods: dict[str, list[JSON]] = {}
    replicas: dict[str, int | None] = {}
    for member in members:
        md = cache.get(MODEL_DEPLOYMENTS, namespace, member)
        if md is not None:
            model_deployments[member] = md
            memberships[member] = cache.membership(md)
        deployment = cache.workload_of(MODEL_DEPLOYMENTS, namespace, member)
        member_pods[member] = cache.pods_of(deployment)
        replicas[member] = deployment_replicas(deployment)
    left_out = {m: ms.reason for m, ms in memberships.items() if ms.in_conflict}
    unreadable = unreadable_members(
        {m: md for m, md in model_deployments.items() if m not in left_out}
    )
    left_out |= {m: reasons.INVALID_SPEC for m in unreadable}
    state = gpu_group_state_from_k8s(
        group,
        model_deployments=model_deployments,
        member_pods=member_pods,
        conflicts=left_out,
        caches_not_ready={
            m for m, md in model_deployments.items() if not cache.model_deployment_cache_ready(md)
        },
    )
    return GpuGroupSnapshot(
        state=state,
        members=members,
        model_deployments=model_deployments,
        memberships=memberships,
        member_pods=member_pods,
        replicas=replicas,
        unreadable=unreadable,
    )


@attrs.frozen
class StandaloneSnapshot:
    """A ModelDeployment no GPUGroup governs, as the core sees it, with its pods."""

    state: StandaloneDeployment
    pods: list[JSON]


def standalone_snapshot(
    cache: ClusterCache, md: JSON, membership: Membership
) -> StandaloneSnapshot:
    """The ModelDeployment as the core sees it; raises `InvalidFieldError` naming the
    field when its spec cannot be read."""
    deployment = cache.workload_of(MODEL_DEPLOYMENTS, namespace_of(md), name_of(md))
    pods = cache.pods_of(deployment)
    state = standalone_from_k8s(
        md,
        deployment=deployment,
        pods=pods,
        conflict=membership if membership.in_conflict else None,
        cache_ready=cache.model_deployment_cache_ready(md),
    )
    return StandaloneSnapshot(state=state, pods=pods)
