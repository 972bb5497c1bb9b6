"""The controller's RBAC grants exactly the requests its code makes.

The code's requests are read from the source (every call of the `Writer` and of
`KubeApi` in `flexinfer_k8s`, with the resource it names), plus the informers (list and
watch of every watched resource), leader election and the owner references it
renders. Each is mapped to the verbs the API server checks. The test fails on a verb
`deploy/controller-rbac.yaml` grants that nothing uses, and on a request it lacks.
A call whose resource is a variable must be listed in `DYNAMIC`, so a new one cannot
slip by unseen.
"""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

from flexinfer_k8s.cache import WATCHED
from flexinfer_k8s.render.cache import CacheImages, cache_from_k8s, download_job
from flexinfer_k8s.render.workload import workload_from_model, workload_from_model_deployment
from flexinfer_k8s.render.workloads import RenderSettings, render_workload
from flexinfer_kube import resources
from flexinfer_kube.resources import (
    EVENTS,
    GPU_GROUPS,
    MODEL_DEPLOYMENTS,
    MODELS,
    Resource,
)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RESOURCES = {name: value for name, value in vars(resources).items() if isinstance(value, Resource)}
BY_KIND = {r.kind: r for r in RESOURCES.values()}

Grant = tuple[str, str, str]  # (API group, resource[/subresource], verb)

# What each Writer method sends (flexinfer_k8s/apply.py): (subresource, verb) pairs on
# the resource it is given. A conflict or a missing object is re-read with a get.
WRITER = {
    # Server-side apply is a patch; one that creates is authorized as a create too.
    "apply": [("", "patch"), ("", "create")],
    "annotate": [("", "patch")],
    "patch": [("", "patch"), ("", "get")],
    "patch_status": [("status", "patch"), ("", "get")],
    "create": [("", "create"), ("", "get")],
    "delete": [("", "delete")],
}
API = {"get": "get", "list": "list", "watch": "watch", "patch": "patch", "create": "create",
       "delete": "delete", "apply": "patch"}
# Calls whose resource is a variable: (module, method) -> the resources it can be.
DYNAMIC: dict[tuple[str, str], tuple[Resource, ...]] = {
    # The one ordered apply: members' statuses (Models, ModelDeployments) and a
    # GPUGroup's own.
    ("write_plan.py", "patch_status"): (MODELS, MODEL_DEPLOYMENTS, GPU_GROUPS),
    ("reconcile_workload.py", "patch_status"): (MODELS, MODEL_DEPLOYMENTS),
}


def grant(resource: Resource, verb: str, subresource: str = "") -> Grant:
    return (resource.group, resource.plural + (f"/{subresource}" if subresource else ""), verb)


def code_requests() -> set[Grant]:
    needed: set[Grant] = set()
    unlisted: list[str] = []
    used: set[tuple[str, str]] = set()
    for path in sorted((ROOT / "flexinfer_k8s").glob("*.py")):
        if path.name == "apply.py":  # the Writer itself: mapped by WRITER
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            method, receiver = node.func.attr, ast.unparse(node.func.value)
            if receiver.endswith("writer") and method == "scale":
                needed.add(grant(RESOURCES["DEPLOYMENTS"], "patch", "scale"))
                continue
            if receiver.endswith("writer") and method == "event":
                needed.add(grant(EVENTS, "create"))
                continue
            if receiver.endswith("api") and method == "request":
                # api.request("GET", RESOURCE.path(namespace[, name]), ...)
                verb, path_call = node.args[0], node.args[1]
                assert isinstance(verb, ast.Constant) and verb.value == "GET", ast.unparse(node)
                assert isinstance(path_call, ast.Call), ast.unparse(node)
                owner = ast.unparse(path_call.func).removesuffix(".path")
                assert owner in RESOURCES, ast.unparse(node)
                needed.add(grant(RESOURCES[owner], "get" if len(path_call.args) > 1 else "list"))
                continue
            if receiver.endswith("writer") and method in WRITER:
                pairs = WRITER[method]
            elif receiver.endswith("api") and method in API:
                pairs = [("", API[method])]
            else:
                continue
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Name) and first.id in RESOURCES:
                targets: tuple[Resource, ...] = (RESOURCES[first.id],)
            elif (path.name, method) in DYNAMIC:
                targets = DYNAMIC[(path.name, method)]
                used.add((path.name, method))
            else:
                unlisted.append(f"{path.name}:{node.lineno} {ast.unparse(node)[:80]}")
                continue
            for target in targets:
                for subresource, verb in pairs:
                    needed.add(grant(target, verb, subresource))
    assert not unlisted, f"calls on a variable resource missing from DYNAMIC: {unlisted}"
    # An entry no call uses any more would grant rights to nothing that asks for them.
    assert set(DYNAMIC) <= used, f"DYNAMIC entries no call uses: {sorted(set(DYNAMIC) - used)}"
    return needed


def owners_with_block_owner_deletion() -> set[str]:
    """The kinds that own what the controller renders, read from what it renders."""
    model = {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model",
             "metadata": {"name": "m", "namespace": "n", "uid": "u"},
             "spec": {"backend": "vllm", "source": "HF://o/r"}}
    md = {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
          "metadata": {"name": "d", "namespace": "n", "uid": "u"},
          "spec": {"backend": "vllm", "model": "o/r"}}
    cache = {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
             "metadata": {"name": "c", "namespace": "n", "uid": "u"},
             "spec": {"source": "HF://o/r", "storageStrategy": "SharedPVC"}}
    rendered = [render_workload(workload_from_model(model), cache=None,
                                settings=RenderSettings()),
                render_workload(workload_from_model_deployment(md), cache=None,
                                settings=RenderSettings())]
    objects = [o for r in rendered for o in (r.deployment, r.service, r.network_policy)]
    objects.append(download_job(cache_from_k8s(cache), CacheImages()))
    return {
        ref["kind"]
        for obj in objects
        for ref in obj["metadata"]["ownerReferences"]
        if ref.get("blockOwnerDeletion")
    }


def needed_cluster_wide() -> set[Grant]:
    needed = code_requests()
    for resource in WATCHED:  # the informers
        needed |= {grant(resource, "list"), grant(resource, "watch")}
    for kind in owners_with_block_owner_deletion():
        needed.add(grant(BY_KIND[kind], "update", "finalizers"))
    return needed


def granted(path: Path, kind: str, name: str | None = None) -> set[Grant]:
    rules = [
        rule
        for doc in yaml.safe_load_all(path.read_text())
        if doc and doc["kind"] == kind and name in (None, doc["metadata"]["name"])
        for rule in doc["rules"]
    ]
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_cluster_role_grants_exactly_what_the_code_requests() -> None:
    rbac = granted(DEPLOY / "controller-rbac.yaml", "ClusterRole")
    needed = needed_cluster_wide()
    assert sorted(needed - rbac) == [], "requests the ClusterRole lacks"
    assert sorted(rbac - needed) == [], "verbs nobody uses"


def test_leader_election_gets_creates_and_updates_its_lease_only() -> None:
    # kubernetes.leaderelection's LeaseLock: read, create, replace (flexinfer_k8s/leader.py).
    source = (ROOT / "flexinfer_k8s" / "leader.py").read_text()
    for call in ("read_namespaced_lease", "create_namespaced_lease", "replace_namespaced_lease"):
        assert call in source
    assert granted(
        DEPLOY / "controller-rbac.yaml", "Role", "flexinfer-controller-leader-election"
    ) == {("coordination.k8s.io", "leases", verb) for verb in ("get", "create", "update")}


def test_in_its_own_namespace_it_only_creates_and_reads_the_directory_jobs() -> None:
    assert granted(
        DEPLOY / "controller-rbac.yaml", "Role", "flexinfer-controller-host-directories"
    ) == {("batch", "jobs", verb) for verb in ("get", "list", "watch", "create")}


def test_persistent_volumes_are_created_and_rebound_never_deleted() -> None:
    rbac = granted(DEPLOY / "controller-rbac.yaml", "ClusterRole")
    assert {v for _, r, v in rbac if r == "persistentvolumes"} == {"get", "create", "patch"}


def test_config_maps_are_read_only_and_secrets_and_nodes_out_of_reach() -> None:
    rbac = granted(DEPLOY / "controller-rbac.yaml", "ClusterRole")
    assert {verb for group, resource, verb in rbac if resource == "configmaps"} == {
        "list", "watch"}
    assert not {r for _, r, _ in rbac} & {"secrets", "nodes", "pods/exec", "serviceaccounts"}
    assert not {v for _, _, v in rbac} & {"*", "escalate", "bind", "impersonate"}


def test_the_namespaced_overlay_binds_the_same_rules_only_in_its_namespaces() -> None:
    bindings = [d for d in yaml.safe_load_all((ROOT / "deploy-namespaced" / "rolebindings.yaml")
                                                  .read_text()) if d]
    assert {(b["kind"], b["roleRef"]["kind"], b["roleRef"]["name"]) for b in bindings} == {
        ("RoleBinding", "ClusterRole", "flexinfer-controller"),
        ("RoleBinding", "ClusterRole", "flexinfer-proxy"),
    }
    assert all(b["metadata"]["namespace"] == "team-a" for b in bindings)
