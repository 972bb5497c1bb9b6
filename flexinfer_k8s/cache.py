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
from flexinfer_k8s.convert_leases import (
    GPU_LEASE_LABEL,
    gpu_lease_from_config_map,
    gpu_lease_from_k8s,
)
from flexinfer_k8s.convert_models import model_cache_is_ready
from flexinfer_k8s.pods import live_pods, pods_of, selector_matches
from flexinfer_k8s.render.model_files import CACHE_STRATEGIES, implied_cache_name
from flexinfer_k8s.render.workloads import GROUP_LABEL, KIND_LABEL, MODEL_LABEL
from flexinfer_kube.informers import Informer, Store
from flexinfer_kube.kubeapi import JSON, KubeApi
from flexinfer_kube.objects import (
    gpu_group_listings,
    gpu_group_member_names,
    gpu_group_ref,
    name_of,
    namespace_of,
)
from flexinfer_kube.resources import (
    CONFIG_MAPS,
    DEPLOYMENTS,
    GPU_GROUPS,
    GPU_LEASES,
    JOBS,
    MODEL_CACHES,
    MODEL_DEPLOYMENTS,
    MODELS,
    NETWORK_POLICIES,
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
    NETWORK_POLICIES,
)
MANAGED_SELECTOR = "app.kubernetes.io/managed-by=flexinfer"
INFORMER_SELECTORS: dict[Resource, str] = {
    CONFIG_MAPS: GPU_LEASE_LABEL,
    PODS: MANAGED_SELECTOR,
    JOBS: MANAGED_SELECTOR,
    PERSISTENT_VOLUME_CLAIMS: MANAGED_SELECTOR,
}
"""Label selectors of the informers that need only what flexinfer made (every pod,
Job and claim it renders carries the managed-by label) or the lease ConfigMaps: the
rest of a busy cluster's pods never reach the controller's memory. Deployments,
Services and NetworkPolicies are watched whole: one a user made under a model's
name is a name clash to report, not an object to take over."""
LEASE_SOURCES: tuple[Resource, ...] = (GPU_LEASES, CONFIG_MAPS)


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _template_labels(deployment: Mapping[str, Any]) -> Mapping[str, Any]:
    template = ((deployment.get("spec") or {}).get("template") or {}).get("metadata") or {}
    return template.get("labels") or {}


def _group_key(namespace: str, group: str, kind: str) -> str:
    return f"{namespace}/{kind}/{group}"


def _by_group(labels_of: Any) -> Any:
    """Index an object by the group its (pod) labels name, with the member kind."""

    def values(obj: JSON) -> list[str]:
        labels = labels_of(obj)
        group, kind = labels.get(GROUP_LABEL), labels.get(KIND_LABEL)
        return [_group_key(namespace_of(obj), str(group), str(kind))] if group and kind else []

    return values


def _by_model(pod: JSON) -> list[str]:
    labels = _labels(pod)
    model, kind = labels.get(MODEL_LABEL), labels.get(KIND_LABEL)
    return [f"{namespace_of(pod)}/{kind}/{model}"] if model and kind else []


def _by_shared_group(model: JSON) -> list[str]:
    group = ((model.get("spec") or {}).get("gpu") or {}).get("shared")
    return [f"{namespace_of(model)}/{group}"] if group else []


def _by_listed_member(group: JSON) -> list[str]:
    return [f"{namespace_of(group)}/{m}" for m in gpu_group_member_names(group)]


def _by_model_path(cache: JSON) -> list[str]:
    """A ModelCache by the directory of its copy (`modelPath`, else its name): what a
    ModelDeployment's plain `model` is matched against (`render.model_files`)."""
    spec = cache.get("spec") or {}
    directory = str(spec.get("modelPath") or "").strip("/") or name_of(cache)
    return [f"{namespace_of(cache)}/{directory}"]


INDEXERS: dict[Resource, dict[str, Any]] = {
    MODELS: {"shared-group": _by_shared_group},
    PODS: {"group": _by_group(_labels), "model": _by_model},
    DEPLOYMENTS: {"group": _by_group(_template_labels)},
    GPU_GROUPS: {"member": _by_listed_member},
    MODEL_CACHES: {"model-path": _by_model_path},
}


class ClusterCache:
    def __init__(self) -> None:
        self.stores: dict[Resource, Store] = {
            r: Store(r, indexers=INDEXERS.get(r)) for r in WATCHED
        }
        self.informers: list[Informer] = []

    def store(self, resource: Resource) -> Store:
        return self.stores[resource]

    def get(self, resource: Resource, namespace: str, name: str) -> JSON | None:
        return self.stores[resource].get(namespace, name)

    def objects(self, resource: Resource, namespace: str | None = None) -> list[JSON]:
        return self.stores[resource].objects(namespace)

    # -- shared groups ------------------------------------------------------------

    def shared_group_models(self, namespace: str, group: str) -> list[JSON]:
        models = self.stores[MODELS].by_index("shared-group", f"{namespace}/{group}")
        return sorted(models, key=name_of)

    def pods_of(self, deployment: Mapping[str, Any] | None) -> list[JSON]:
        if deployment is None:
            return []
        namespace = namespace_of(deployment)
        match = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        if match.get(MODEL_LABEL) and match.get(KIND_LABEL):
            # A rendered Deployment: its pods are indexed by its selector's labels.
            key = f"{namespace}/{match[KIND_LABEL]}/{match[MODEL_LABEL]}"
            return pods_of(deployment, self.stores[PODS].by_index("model", key))
        return pods_of(deployment, self.objects(PODS, namespace))

    def deployments_selecting(self, pod: Mapping[str, Any]) -> list[JSON]:
        labels = _labels(pod)
        namespace = namespace_of(pod)
        model = labels.get(MODEL_LABEL)
        candidates = (
            [d for d in (self.get(DEPLOYMENTS, namespace, str(model)),) if d is not None]
            if model and labels.get(KIND_LABEL)
            else self.objects(DEPLOYMENTS, namespace)
        )
        return [
            d for d in candidates if selector_matches((d.get("spec") or {}).get("selector"), labels)
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
        return self.model_cache_ready(
            namespace_of(md or {}), self.model_deployment_cache_name(md or {})
        )

    # -- which ModelCache a Model or ModelDeployment serves from ------------------------

    def caches_holding(self, namespace: str, model: str) -> list[JSON]:
        """ModelCaches whose copy's directory (`modelPath`, else name) is `model`."""
        found = self.stores[MODEL_CACHES].by_index("model-path", f"{namespace}/{model.strip('/')}")
        return sorted(found, key=name_of)

    def model_deployment_cache_name(self, md: Mapping[str, Any]) -> str:
        """`spec.modelCacheRef`, else for a plain `model` (no `://`) the one ModelCache
        of the namespace that holds it (none, or more than one: "")."""
        spec = md.get("spec") or {}
        ref = str(spec.get("modelCacheRef") or "")
        model = str(spec.get("model") or "")
        if ref or not model or "://" in model:
            return ref
        holding = self.caches_holding(namespace_of(md), model)
        return name_of(holding[0]) if len(holding) == 1 else ""

    @staticmethod
    def model_cache_name(model: Mapping[str, Any]) -> str:
        """`spec.cache.modelCacheRef`, else the ModelCache `spec.cache.strategy` implies."""
        cache = (model.get("spec") or {}).get("cache") or {}
        ref = str(cache.get("modelCacheRef") or "")
        if not ref and cache.get("strategy") in CACHE_STRATEGIES:
            return implied_cache_name(name_of(model))
        return ref

    def group_occupants(self, namespace: str, *, group: str, kind: str) -> set[str]:
        """`occupants` from the cache (what the decision is made on)."""
        pods = self.stores[PODS].by_index("group", _group_key(namespace, group, kind))
        return occupants(pods, group=group, kind=kind)

    def group_deployments(self, namespace: str, *, group: str, kind: str) -> list[JSON]:
        """Deployments whose pods carry `group`'s label, members or not (a deleted
        member's Deployment that was orphaned still runs pods)."""
        return self.stores[DEPLOYMENTS].by_index("group", _group_key(namespace, group, kind))

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
        listing = self.stores[GPU_GROUPS].by_index("member", f"{namespace}/{member}")
        return sorted(name_of(g) for g in listing)

    def membership(self, md: Mapping[str, Any]) -> Membership:
        """Where a ModelDeployment belongs, by the core's one rule (flexinfer_core.membership).

        The rule reads the groups that list it and the one its `gpuGroupRef` names; only
        those are looked up (by index), not every GPUGroup of the namespace."""
        namespace, name, ref = namespace_of(md), name_of(md), gpu_group_ref(md)
        relevant = self.stores[GPU_GROUPS].by_index("member", f"{namespace}/{name}")
        named = self.get(GPU_GROUPS, namespace, ref) if ref else None
        if named is not None:
            relevant = [*relevant, named]
        return membership_of(name, group_ref=ref, groups=gpu_group_listings(relevant))

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
