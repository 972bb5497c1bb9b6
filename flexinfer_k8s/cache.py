"""The controller's view of the cluster: one `Store` per watched resource, and lookups.

Reconcilers read only from here, plus one live, label-selected Pod list before a
scale-up (`live_occupants`: the cache may not have seen a pod yet, and
break-before-make must not trust it). A Model's or ModelDeployment's Deployment and
Service share its name; a Deployment's pods are those its selector matches; a
group's pods carry its label. A ModelDeployment's GPUGroup is the core's to decide
(`membership`). Reads only; no writes, no decisions of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flexinfer_core import GpuLease, Membership, MembershipKind, membership_of
from flexinfer_k8s.convert_leases import gpu_lease_from_config_map, gpu_lease_from_k8s
from flexinfer_k8s.convert_models import model_cache_is_ready
from flexinfer_k8s.pods import live_pods, pods_of, selector_matches
from flexinfer_k8s.render.workloads import GROUP_LABEL, KIND_LABEL, MODEL_LABEL
from flexinfer_kube.informers import Informer, Store
from flexinfer_kube.kubeapi import JSON, KubeApi
from flexinfer_kube.objects import gpu_group_listings, gpu_group_ref, name_of, namespace_of
from flexinfer_kube.resources import (
    CONFIG_MAPS,
    DEPLOYMENTS,
    GPU_GROUPS,
    GPU_LEASES,
    JOBS,
    MODEL_CACHES,
    MODEL_DEPLOYMENTS,
    MODELS,
    PERSISTENT_VOLUME_CLAIMS,
    PODS,
    SERVICES,
    Resource,
)

WATCHED: tuple[Resource, ...] = (
    MODELS,
    GPU_LEASES,
    CONFIG_MAPS,
    GPU_GROUPS,
    MODEL_DEPLOYMENTS,
    MODEL_CACHES,
    DEPLOYMENTS,
    PODS,
    SERVICES,
    JOBS,
    PERSISTENT_VOLUME_CLAIMS,
)
LEASE_SOURCES: tuple[Resource, ...] = (GPU_LEASES, CONFIG_MAPS)


class ClusterCache:
    def __init__(self) -> None:
        self.stores: dict[Resource, Store] = {r: Store(r) for r in WATCHED}
        self.informers: list[Informer] = []

    def store(self, resource: Resource) -> Store:
        return self.stores[resource]

    def get(self, resource: Resource, namespace: str, name: str) -> JSON | None:
        return self.stores[resource].get(namespace, name)

    def objects(self, resource: Resource, namespace: str | None = None) -> list[JSON]:
        return self.stores[resource].objects(namespace)

    # -- shared groups ------------------------------------------------------------

    def shared_group_models(self, namespace: str, group: str) -> list[JSON]:
        return sorted(
            (
                m
                for m in self.objects(MODELS, namespace)
                if str(((m.get("spec") or {}).get("gpu") or {}).get("shared") or "") == group
            ),
            key=name_of,
        )

    def pods_of(self, deployment: Mapping[str, Any] | None) -> list[JSON]:
        if deployment is None:
            return []
        return pods_of(deployment, self.objects(PODS, namespace_of(deployment)))

    def deployments_selecting(self, pod: Mapping[str, Any]) -> list[JSON]:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return [
            d
            for d in self.objects(DEPLOYMENTS, namespace_of(pod))
            if selector_matches((d.get("spec") or {}).get("selector"), labels)
        ]

    def workload_of(self, owner: Resource, namespace: str, name: str) -> JSON | None:
        """The Deployment rendered for the `owner` kind named `name` (its controller
        reference says so), never another resource's of the same name: a Model and a
        ModelDeployment called alike must not scale each other's pods."""
        deployment = self.get(DEPLOYMENTS, namespace, name)
        for ref in ((deployment or {}).get("metadata") or {}).get("ownerReferences") or []:
            if ref.get("controller") and ref.get("kind") == owner.kind and ref.get("name") == name:
                return deployment
        return None

    def model_deployment_cache_ready(self, md: Mapping[str, Any] | None) -> bool:
        ref = str(((md or {}).get("spec") or {}).get("modelCacheRef") or "")
        return self.model_cache_ready(namespace_of(md or {}), ref)

    def group_occupants(self, namespace: str, *, group: str, kind: str) -> set[str]:
        """`occupants` from the cache (what the decision is made on)."""
        return occupants(self.objects(PODS, namespace), group=group, kind=kind)

    def group_deployments(self, namespace: str, *, group: str, kind: str) -> list[JSON]:
        """Deployments whose pods carry `group`'s label, members or not (a deleted
        member's Deployment that was orphaned still runs pods)."""
        return [
            d
            for d in self.objects(DEPLOYMENTS, namespace)
            if (
                labels := ((d.get("spec") or {}).get("template") or {})
                .get("metadata", {})
                .get("labels")
                or {}
            )
            and labels.get(GROUP_LABEL) == group
            and labels.get(KIND_LABEL) == kind
        ]

    def leases(self, namespace: str) -> list[GpuLease]:
        out: list[GpuLease] = []
        for obj in self.objects(GPU_LEASES, namespace):
            lease = gpu_lease_from_k8s(obj)
            if lease is not None:
                out.append(lease)
        for obj in self.objects(CONFIG_MAPS, namespace):
            lease = gpu_lease_from_config_map(obj)
            if lease is not None:
                out.append(lease)
        return out

    def unreadable_lease_sources(self, namespace: str) -> list[str]:
        """Lease carriers whose informer for `namespace` is refused a list (RBAC, a
        missing CRD). An outage is not that: the cache keeps the leases last listed, and
        nothing can be written until the API server answers again anyway."""
        return sorted(
            {
                informer.resource.plural
                for informer in self.informers
                if informer.resource in LEASE_SOURCES
                and informer.namespace in (None, namespace)
                and not informer.healthy
                and not informer.last_error_transient
            }
        )

    # -- GPUGroups ------------------------------------------------------------------

    def gpu_groups_with_member(self, namespace: str, member: str) -> list[str]:
        """The GPUGroups whose `spec.models` name `member`."""
        return [
            group
            for group, members in gpu_group_listings(self.objects(GPU_GROUPS, namespace)).items()
            if member in members
        ]

    def membership(self, md: Mapping[str, Any]) -> Membership:
        """Where a ModelDeployment belongs, by the core's one rule (flexinfer_core.membership)."""
        return membership_of(
            name_of(md),
            group_ref=gpu_group_ref(md),
            groups=gpu_group_listings(self.objects(GPU_GROUPS, namespace_of(md))),
        )

    def model_deployment_on_its_own(
        self, namespace: str, name: str
    ) -> tuple[JSON, Membership] | None:
        """The ModelDeployment `name` when no GPUGroup governs it (standalone, or in a
        membership conflict that holds it at zero), with its membership."""
        md = self.get(MODEL_DEPLOYMENTS, namespace, name)
        if md is None:
            return None
        membership = self.membership(md)
        if membership.kind is MembershipKind.MEMBER:
            return None
        return md, membership

    def model_cache_ready(self, namespace: str, name: str) -> bool:
        if not name:
            return True
        return model_cache_is_ready(self.get(MODEL_CACHES, namespace, name))

    def job(self, namespace: str, name: str) -> JSON | None:
        return self.get(JOBS, namespace, name)

    def services(self) -> Store:
        return self.stores[SERVICES]


def group_selector(group: str, kind: str) -> str:
    """The label selector of every pod rendered for a member of `group` (of `kind`)."""
    return f"{GROUP_LABEL}={group},{KIND_LABEL}={kind}"


def occupants(pods: Iterable[JSON], *, group: str, kind: str) -> set[str]:
    """The members (by their model label) that have live pods among `pods` of `group`,
    whether or not they are still members: a deleted member's pods hold the card until
    they are gone."""
    found = set()
    for pod in live_pods(list(pods)):
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(GROUP_LABEL) == group and labels.get(KIND_LABEL) == kind:
            found.add(str(labels.get(MODEL_LABEL) or ""))
    found.discard("")
    return found


def live_occupants(api: KubeApi, namespace: str, *, group: str, kind: str) -> set[str]:
    """`occupants` from a fresh, label-selected Pod list (not the cache): what
    break-before-make checks right before a scale-up."""
    listing = api.list(PODS, namespace, label_selector=group_selector(group, kind))
    return occupants(listing.get("items") or [], group=group, kind=kind)
