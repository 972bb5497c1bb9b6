"""The operator creates what it governs, on the local control plane: Models,
ModelDeployments and ModelCaches become Deployments, Services, claims and Jobs that
the real scheduler places and kwok runs; the election owns only replicas."""

# The fixtures come from .harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flexinfer_devcluster.localcluster import (
    COMPLETE_DELAY_ANNOTATION,
    FAIL_ANNOTATION,
    GPU_RESOURCE,
    KwokNode,
)
from flexinfer_kube.kubeapi import NotFound
from flexinfer_kube.resources import (
    DEPLOYMENTS,
    GPU_GROUPS,
    JOBS,
    MODEL_CACHES,
    MODEL_DEPLOYMENTS,
    MODELS,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    SERVICES,
    Resource,
)
from tests.polling import hold_while, wait_until

from .harness import (  # noqa: F401  (fixtures)
    Cluster,
    PodTimeline,
    cluster,
    controller,
    crds,
    kubectl,
    kwok_nodes,
    model_body,
    now_text,
    on_kwok,
)
from .kubectl import Kubectl

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*.yaml") if "scenarios" not in p.parts)
EXAMPLE_NODES = ("gpu-workstation", "gpu-node-1", "5930k")
MANAGED = "app.kubernetes.io/managed-by=flexinfer"
HOST_MODELS = f"{tempfile.gettempdir()}/models"
"""A host directory the local cluster's policy allows (flexinfer_devcluster.policy)."""


def hold_while_seconds(seconds: float, check: Any, *, what: str) -> None:
    deadline = time.monotonic() + seconds
    hold_while(lambda: time.monotonic() < deadline, check, what=what, interval=0.25)


def get_or_none(c: Cluster, resource: Resource, name: str) -> dict[str, Any] | None:
    try:
        return c.api.get(resource, c.namespace, name)
    except NotFound:
        return None


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return {}


def cache_body(name: str, **spec: Any) -> dict[str, Any]:
    """A cache whose storage works on the local cluster as on a homelab: the node
    directory of one (tainted) GPU node; a test that wants a claim names one."""
    body: dict[str, Any] = {"source": f"HF://test/{name}", "storageStrategy": "NodeLocal",
                            "nodeSelector": {"kubernetes.io/hostname": "kwok-gpu-0"}}
    body.update(spec)
    body = {key: value for key, value in body.items() if value is not None}
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
            "metadata": {"name": name}, "spec": body}


def cache_of(doc: dict[str, Any]) -> str:
    spec = doc.get("spec") or {}
    return str(spec.get("modelCacheRef") or (spec.get("cache") or {}).get("modelCacheRef") or "")


def cache_outcome(c: Cluster, name: str) -> dict[str, Any] | None:
    """The cache once it is Ready, or once it waits for a claim that says why it waits."""
    cache = get_or_none(c, MODEL_CACHES, name) or {}
    status = cache.get("status") or {}
    if status.get("ready"):
        return cache
    if condition(cache, "Ready").get("reason") != "ClaimPending":
        return None
    claim = (get_or_none(c, PERSISTENT_VOLUME_CLAIMS, f"{name}-models")
             or get_or_none(c, PERSISTENT_VOLUME_CLAIMS,
                            str((cache.get("spec") or {}).get("existingClaimName"))))
    return cache if claim and (claim.get("status") or {}).get("phase") == "Pending" else None


def template(deployment: dict[str, Any]) -> dict[str, Any]:
    return dict(deployment["spec"]["template"]["spec"])


@pytest.fixture(scope="module")
def example_nodes(local_cluster: Any) -> Iterator[None]:
    """kwok GPU nodes named like the examples' nodeSelectors, for this module only."""
    with kwok_nodes(local_cluster, tuple(KwokNode(name=name, gpus=1) for name in EXAMPLE_NODES)):
        yield


# --- every example ------------------------------------------------------------------


def demand_everything(c: Cluster, documents: list[dict[str, Any]]) -> None:
    """What the proxy would do for one request to each model of the example."""
    for doc in documents:
        name = doc["metadata"]["name"]
        if doc["kind"] == "Model":
            c.api.patch(MODELS, c.namespace, name, {"status": {"lastActiveTime": now_text()}},
                        subresource="status")
        elif doc["kind"] == "ModelDeployment" and not doc["spec"].get("gpuGroupRef"):
            c.api.patch(MODEL_DEPLOYMENTS, c.namespace, name,
                        {"status": {"lastAccessTime": now_text()}}, subresource="status")
        elif doc["kind"] == "GPUGroup":
            first = doc["spec"]["models"][0]["name"]
            value = json.dumps({"queued": 1, "oldestWaiting": now_text(),
                                "reportedAt": now_text()})
            c.api.patch(GPU_GROUPS, c.namespace, name,
                        {"metadata": {"annotations": {f"demand.ai.flexinfer/{first}": value}}})


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(ROOT / "examples")))
def test_every_example_applies_and_yields_its_objects(
    local_cluster: Any, cluster: Cluster, kubectl: Kubectl, example_nodes: None, path: Path
) -> None:
    c = cluster
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for claim in sorted({str(d["spec"]["existingClaimName"]) for d in documents
                         if d["kind"] == "ModelCache" and d["spec"].get("existingClaimName")}):
        # A claim the example says you already have (the share holding compiled models).
        local_cluster.populate_claim(c.namespace, claim, files={})
    kubectl.ok("apply", "-n", c.namespace, "-f", str(path))
    with controller(local_cluster, c.namespace):
        caches = [d["metadata"]["name"] for d in documents if d["kind"] == "ModelCache"]
        # A cache is Ready, or says why its claim cannot bind (a ReadWriteMany claim on
        # the RWO-only local-path, as on k3s and kind): never silent.
        stuck = {
            name for name in caches
            if not wait_until(lambda name=name: cache_outcome(c, name),
                              what=f"ModelCache {name} Ready or ClaimPending", timeout=120)
            .get("status", {}).get("ready")
        }
        served = [d for d in documents if d["kind"] in ("Model", "ModelDeployment")]
        for doc in served:
            resource = MODELS if doc["kind"] == "Model" else MODEL_DEPLOYMENTS
            name = doc["metadata"]["name"]
            obj = wait_until(
                lambda resource=resource, name=name: (
                    obj if condition(obj := get_or_none(c, resource, name), "Rendered")
                    .get("status") == "True" else None
                ),
                what=f"{doc['kind']} {name} rendered", timeout=60,
            )
            deployment = c.api.get(DEPLOYMENTS, c.namespace, name)
            service = c.api.get(SERVICES, c.namespace, name)
            for rendered in (deployment, service):
                (owner,) = rendered["metadata"]["ownerReferences"]
                assert (owner["kind"], owner["name"], owner["uid"]) == (
                    doc["kind"], name, obj["metadata"]["uid"])
            selector = doc["spec"].get("nodeSelector") or {}
            assert selector.items() <= (template(deployment).get("nodeSelector") or {}).items()
        demand_everything(c, documents)
        shared = [d for d in served if d["kind"] == "Model" and d["spec"].get("gpu")]
        # In a shared group only the winner runs: the highest priority of those demanded.
        winner = max(shared, key=lambda d: d["spec"]["gpu"].get("priority", 100), default=None)
        for doc in served:
            if doc["kind"] == "ModelDeployment" and doc["spec"].get("gpuGroupRef"):
                continue
            if doc in shared and doc is not winner:
                continue
            name = doc["metadata"]["name"]
            if cache_of(doc) in stuck:
                resource = MODELS if doc["kind"] == "Model" else MODEL_DEPLOYMENTS
                waits = wait_until(
                    lambda resource=resource, name=name: (
                        obj if "CacheNotReady" in (
                            condition(obj := get_or_none(c, resource, name), "CacheReady")
                            .get("reason"),
                            condition(obj, "Ready").get("reason"),
                        ) else None
                    ),
                    what=f"{name} to say it waits for its cache",
                )
                assert condition(waits, "CacheReady").get("status") == "False"
                assert not c.pods(name)
                continue
            pod = wait_until(
                lambda name=name: next(iter(c.ready_pods(name)), None),
                what=f"a Ready pod of {name}", timeout=90,
            )
            # The real scheduler placed it by nodeSelector and GPU capacity.
            wanted = (doc["spec"].get("nodeSelector") or {}).get("kubernetes.io/hostname")
            if wanted:
                assert pod["spec"]["nodeName"] == wanted
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            assert limits[GPU_RESOURCE] == "1"
        for doc in shared:
            if doc is not winner:
                assert not c.pods(doc["metadata"]["name"])
                assert c.status(doc["metadata"]["name"])["sharedGroup"]["state"] == "Queued"
        if any(d["kind"] == "GPUGroup" for d in documents):
            group = next(d for d in documents if d["kind"] == "GPUGroup")
            first = group["spec"]["models"][0]["name"]
            wait_until(lambda: c.ready_pods(first), what=f"{first} swapped in", timeout=90)
        listing = kubectl.ok("get", "all,pvc,jobs,gpuleases", "-n", c.namespace, "-l", MANAGED)
        print(f"\n# {path.relative_to(ROOT)}\n{listing}")


# --- lifecycle of rendered objects ------------------------------------------------------


def test_deleting_a_model_collects_its_deployment_and_service(
    local_cluster: Any, cluster: Cluster
) -> None:
    c = cluster
    c.add_model("a")
    with controller(local_cluster, c.namespace):
        wait_until(lambda: get_or_none(c, SERVICES, "a"), what="a rendered")
        c.api.delete(MODELS, c.namespace, "a")
        wait_until(
            lambda: get_or_none(c, DEPLOYMENTS, "a") is None
            and get_or_none(c, SERVICES, "a") is None,
            what="the garbage collector to remove a's Deployment and Service",
        )


def test_a_users_label_survives_and_a_settings_edit_rolls_without_touching_replicas(
    local_cluster: Any, cluster: Cluster
) -> None:
    c = cluster
    timeline = PodTimeline(c)
    c.add_model("a")
    c.add_model("b")
    c.add_model("x")
    c.demand("a")
    with controller(local_cluster, c.namespace) as ctl:
        c.wait_serving("a")
        # A user adds a label and an env var with kubectl (their own field manager).
        c.api.patch(DEPLOYMENTS, c.namespace, "a",
                    {"metadata": {"labels": {"team": "research"}}})
        for name in ("a", "b"):
            c.api.patch(MODELS, c.namespace, name, {"spec": {
                "vllm": {"maxModelLen": 4096},
                "env": [{"name": "HSA_OVERRIDE_GFX_VERSION", "value": "11.0.0"}],
            }})

        def rolled(name: str) -> dict[str, Any] | None:
            deployment = c.api.get(DEPLOYMENTS, c.namespace, name)
            args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
            return deployment if "--max-model-len" in args else None

        a = wait_until(lambda: rolled("a"), what="a's Deployment to roll")
        b = wait_until(lambda: rolled("b"), what="b's Deployment to roll")
        assert a["metadata"]["labels"]["team"] == "research"
        env = {e["name"]: e["value"] for e in template(a)["containers"][0]["env"]}
        assert env["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0"
        # The applies left replicas alone: the leader kept its pod, nobody else got one.
        assert a["spec"]["replicas"] == 1 and b["spec"]["replicas"] == 0
        assert c.replicas("x") == 0

        def rolled_out() -> bool:
            """a's roll is over: its one pod is of the new template, Ready, staying."""
            pods = c.pods("a")
            return len(pods) == 1 and pods == c.ready_pods("a") and (
                "--max-model-len" in pods[0]["spec"]["containers"][0]["args"]
            )

        wait_until(rolled_out, what="a's roll to end with its new pod Ready")
        # The controller may still have to write what the roll changed (a's phase back
        # to Ready): those writes are the roll's, not the full pass's.
        ctl.settle(c)
        writes = ctl.writes()
        assert c.api.get(DEPLOYMENTS, c.namespace, "a")["metadata"]["labels"]["team"] == "research"
        ctl.controller.enqueue_all()  # a full pass over everything: nothing left to apply
        assert ctl.controller.wait_idle()
        assert ctl.writes() == writes
    timeline.stop()
    assert timeline.violations == []
    assert set(timeline.created_apps()) == {"a"}  # rendering never started b's or x's pod


def test_a_deployment_left_without_the_replicas_hand_over_gets_it_first(
    local_cluster: Any, cluster: Cluster
) -> None:
    """A controller killed between creating a Deployment and handing `spec.replicas` to
    the scale writes: the next reconcile finds the field owned only by the applier (in
    managedFields) and hands it over before any apply that would reset it to 1."""
    from flexinfer_devcluster.policy import dev_policy
    from flexinfer_k8s.render.workload import workload_from_model
    from flexinfer_k8s.render.workloads import RenderSettings, render_workload

    c = cluster
    timeline = PodTimeline(c)
    c.add_model("a")
    c.add_model("b")
    model = c.api.get(MODELS, c.namespace, "b")
    settings = RenderSettings(policy=dev_policy())
    rendered = render_workload(workload_from_model(model), cache=None, settings=settings)
    half = dict(rendered.deployment)
    half["spec"] = {**half["spec"], "replicas": 0}
    c.api.apply(DEPLOYMENTS, c.namespace, "b", half, field_manager="flexinfer-controller")
    c.demand("a")
    with controller(local_cluster, c.namespace):
        c.wait_serving("a")
        def handed_over() -> bool:
            fields = c.api.get(DEPLOYMENTS, c.namespace, "b")["metadata"]["managedFields"]
            return any(
                f["manager"] == "flexinfer-scale" and "f:replicas" in f["fieldsV1"]["f:spec"]
                for f in fields
            )
        wait_until(handed_over, what="b's replicas handed to the scale writes")
        assert c.replicas("b") == 0
    timeline.stop()
    assert timeline.violations == []
    assert "b" not in timeline.created_apps()


# --- caches -----------------------------------------------------------------------------


def test_a_cache_that_completes_lets_the_model_that_references_it_run(
    local_cluster: Any, cluster: Cluster
) -> None:
    c = cluster
    # A shared cache on the claim the user already has (RWO, pre-bound to its volume).
    local_cluster.populate_claim(c.namespace, "weights-models", files={})
    c.api.create(MODEL_CACHES, c.namespace, cache_body(
        "weights", storageStrategy="SharedPVC", nodeSelector=None,
        existingClaimName="weights-models", podAnnotations={COMPLETE_DELAY_ANNOTATION: "3s"}))
    body = model_body("a")
    body["spec"]["cache"] = {"modelCacheRef": "weights"}
    c.api.create(MODELS, c.namespace, body)
    c.demand("a")
    with controller(local_cluster, c.namespace):
        # The cache is Pending until its claim binds, then Downloading: the Model waits
        # through both and says which (it is not started before the copy is complete).
        wait_until(
            lambda: (m if condition(m := c.model("a"), "CacheReady").get("reason")
                     == "CacheNotReady"
                     and "Downloading" in condition(m, "CacheReady").get("message", "")
                     else None),
            what="a to wait for its downloading cache",
        )
        assert not c.pods("a")
        job = wait_until(lambda: get_or_none(c, JOBS, "weights-download"), what="the download")
        volumes = job["spec"]["template"]["spec"]["volumes"]
        assert volumes[0]["persistentVolumeClaim"]["claimName"] == "weights-models"
        cache = wait_until(
            lambda: (m if (m := c.api.get(MODEL_CACHES, c.namespace, "weights"))
                     .get("status", {}).get("ready") else None),
            what="the cache Ready",
        )
        assert cache["status"]["phase"] == "Ready"
        assert cache["status"]["path"] == "pvc://weights-models/weights"
        c.wait_serving("a")
        deployment = c.api.get(DEPLOYMENTS, c.namespace, "a")
        volume = next(v for v in template(deployment)["volumes"] if v["name"] == "model-cache")
        assert volume["persistentVolumeClaim"]["claimName"] == "weights-models"
        assert condition(c.model("a"), "CacheReady")["status"] == "True"


def test_a_failing_download_fails_the_cache_and_says_why_on_the_model(
    local_cluster: Any, cluster: Cluster
) -> None:
    c = cluster
    c.api.create(MODEL_CACHES, c.namespace, cache_body(
        "broken", podAnnotations={FAIL_ANNOTATION: "401 Unauthorized: the repo is gated"}))
    body = model_body("a")
    body["spec"]["cache"] = {"modelCacheRef": "broken"}
    c.api.create(MODELS, c.namespace, body)
    c.demand("a")
    with controller(local_cluster, c.namespace):
        cache = wait_until(
            lambda: (m if (m := c.api.get(MODEL_CACHES, c.namespace, "broken"))
                     .get("status", {}).get("phase") == "Failed" else None),
            what="the cache Failed", timeout=120,
        )
        assert "401 Unauthorized: the repo is gated" in cache["status"]["message"]
        assert condition(cache, "Ready")["reason"] == "DownloadFailed"
        cached = wait_until(
            lambda: (m if condition(m := c.model("a"), "CacheReady").get("reason")
                     == "CacheFailed" else None),
            what="a's CacheReady to say the cache failed",
        )
        assert "401 Unauthorized" in condition(cached, "CacheReady")["message"]
        assert not c.pods("a")  # not runnable: nothing was started
        warnings = [e for e in c.events("broken") if e["type"] == "Warning"]
        assert [e["reason"] for e in warnings] == ["DownloadFailed"]


def test_a_model_deployment_waits_for_its_cache_too(
    local_cluster: Any, cluster: Cluster
) -> None:
    """Standalone ModelDeployments (and GPUGroup members) follow the Models' rule: no
    pod while the cache is incomplete, even when asked for."""
    c = cluster
    c.api.create(MODEL_CACHES, c.namespace, cache_body(
        "slow", podAnnotations={COMPLETE_DELAY_ANNOTATION: "8s"}))
    c.api.create(MODEL_DEPLOYMENTS, c.namespace, {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "md"},
        "spec": {"backend": "vllm", "model": "test/md", "modelCacheRef": "slow", **on_kwok()},
    })
    with controller(local_cluster, c.namespace):
        wait_until(lambda: get_or_none(c, DEPLOYMENTS, "md"), what="md rendered")
        c.api.patch(MODEL_DEPLOYMENTS, c.namespace, "md",
                    {"status": {"lastAccessTime": now_text()}}, subresource="status")

        def downloading() -> bool:
            cache = c.api.get(MODEL_CACHES, c.namespace, "slow")
            return not (cache.get("status") or {}).get("ready")

        wait_until(
            lambda: condition(c.api.get(MODEL_DEPLOYMENTS, c.namespace, "md"), "Ready")
            .get("reason") == "CacheNotReady",
            what="md to say it waits for its cache",
        )
        hold_while(downloading, lambda: c.replicas("md") == 0 and not c.pods("md"),
                   what="md held at zero while its cache downloads")
        c.api.patch(MODEL_DEPLOYMENTS, c.namespace, "md",
                    {"status": {"lastAccessTime": now_text()}}, subresource="status")
        wait_until(lambda: c.ready_pods("md"), what="md running once the cache is ready")


def local_volume_of(c: Cluster, pod: dict[str, Any], volume: str) -> tuple[str, Any, str]:
    """(the `local` path, the node affinity, the phase) of the PersistentVolume a pod
    volume's claim is bound to, read from the cluster: the binder's work, not the
    render's."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "hostPath" not in volumes[volume], volumes[volume]
    name = volumes[volume]["persistentVolumeClaim"]["claimName"]
    claim = wait_until(
        lambda: (p if (p := c.api.get(PERSISTENT_VOLUME_CLAIMS, c.namespace, name))
                 .get("status", {}).get("phase") == "Bound" else None),
        what=f"claim {name} bound")
    pv = c.api.get(PERSISTENT_VOLUMES, "", claim["spec"]["volumeName"])
    assert pv["spec"]["claimRef"]["name"] == name
    assert pv["spec"]["claimRef"]["namespace"] == c.namespace
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    return pv["spec"]["local"]["path"], terms, pv["status"]["phase"]


def test_a_memory_cache_pod_fills_its_ram_copy_with_the_flash_loader(
    local_cluster: Any, cluster: Cluster
) -> None:
    """The namespace enforces Pod Security "baseline" (`cluster`): the pod mounts its RAM
    and node directories through claims bound to `local` volumes on its node."""
    c = cluster
    c.api.create(MODEL_CACHES, c.namespace, cache_body(
        "ram", storageStrategy="Memory", nodeSelector={"kubernetes.io/hostname": "kwok-gpu-1"}))
    body = model_body("a")
    body["spec"]["cache"] = {"modelCacheRef": "ram", "strategy": "Memory"}
    c.api.create(MODELS, c.namespace, body)
    with controller(local_cluster, c.namespace):
        deployment = wait_until(lambda: get_or_none(c, DEPLOYMENTS, "a"), what="a rendered")
        pod = template(deployment)
        # The RAM copy is filled first, then /models is laid out over it.
        assert [i["name"] for i in pod["initContainers"]] == ["flash-loader", "models-layout"]
        node = [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                       "values": ["kwok-gpu-1"]}]}]
        assert local_volume_of(c, pod, "model-cache") == (
            f"/dev/shm/flexinfer/{c.namespace}", node, "Bound")
        assert local_volume_of(c, pod, "cache-source") == (
            f"/var/lib/flexinfer/models/{c.namespace}", node, "Bound")
        assert pod["nodeSelector"]["kubernetes.io/hostname"] == "kwok-gpu-1"
        c.demand("a")
        ready = wait_until(lambda: next(iter(c.ready_pods("a")), None), what="a's pod",
                           timeout=90)
        assert ready["spec"]["nodeName"] == "kwok-gpu-1"
        # The directories are made by a Job in the controller's namespace, the only one
        # whose pods mount a host path.
        made = c.api.list(JOBS, "flexinfer-system", label_selector=(
            f"ai.flexinfer/namespace={c.namespace}")).get("items") or []
        assert {tuple(v["hostPath"]["path"] for v in j["spec"]["template"]["spec"]["volumes"])
                for j in made} == {("/var/lib/flexinfer/models",), ("/dev/shm/flexinfer",)}
    level = c.api.get(Resource("", "v1", "namespaces", "Namespace", namespaced=False), "",
                      c.namespace)["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"]
    assert level == "baseline"


def test_a_node_local_cache_is_served_through_a_bound_local_volume_on_its_node(
    local_cluster: Any, cluster: Cluster
) -> None:
    c = cluster
    c.api.create(MODEL_CACHES, c.namespace, cache_body("disk"))
    body = model_body("b")
    body["spec"]["cache"] = {"modelCacheRef": "disk"}
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "kwok-gpu-0"}
    c.api.create(MODELS, c.namespace, body)
    with controller(local_cluster, c.namespace):
        wait_until(lambda: c.api.get(MODEL_CACHES, c.namespace, "disk").get(
            "status", {}).get("ready"), what="the cache downloaded", timeout=90)
        deployment = wait_until(lambda: get_or_none(c, DEPLOYMENTS, "b"), what="b rendered")
        pod = template(deployment)
        path, terms, phase = local_volume_of(c, pod, "model-cache")
        assert (path, phase) == (f"/var/lib/flexinfer/models/{c.namespace}", "Bound")
        assert terms[0]["matchExpressions"][0]["values"] == ["kwok-gpu-0"]
        mount = next(m for m in pod["containers"][0]["volumeMounts"]
                     if m["name"] == "model-cache")
        assert mount["subPath"] == "disk"
        c.demand("b")
        ready = wait_until(lambda: next(iter(c.ready_pods("b")), None), what="b's pod",
                           timeout=90)
        assert ready["spec"]["nodeName"] == "kwok-gpu-0"
        assert all("hostPath" not in v for v in ready["spec"]["volumes"])


# --- bad input ---------------------------------------------------------------------------


def test_bad_input_is_a_condition_naming_it_and_touches_nothing_else(
    local_cluster: Any, cluster: Cluster
) -> None:
    c = cluster
    missing = model_body("missing-cache")
    missing["spec"]["cache"] = {"modelCacheRef": "nowhere"}
    gguf = model_body("no-gguf")
    gguf["spec"].update(backend="llama-cpp", source="pvc://models/qwen")
    vram = {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "too-big"},
        "spec": {"backend": "mlc-llm", "model": f"file://{HOST_MODELS}/qwen-mlc",
                 "image": "registry.local/mlc-llm:rocm",
                 "mlcllm": {"mode": "server", "gpuMemoryBytes": 8_000_000_000,
                            "overrides": {"maxNumSequence": 4, "maxTotalSeqLength": 65536}},
                 **on_kwok()},
    }
    nodeless = cache_body("nodeless", storageStrategy="NodeLocal", nodeSelector=None)
    for resource, body in ((MODELS, missing), (MODELS, gguf), (MODEL_DEPLOYMENTS, vram),
                           (MODEL_CACHES, nodeless)):
        c.api.create(resource, c.namespace, body)
    c.add_model("fine")
    with controller(local_cluster, c.namespace):
        def rendered(resource: Resource, name: str) -> dict[str, Any] | None:
            obj = get_or_none(c, resource, name)
            return obj if condition(obj, "Rendered") else None

        bad = wait_until(lambda: rendered(MODELS, "missing-cache"), what="missing-cache")
        assert condition(bad, "Rendered")["reason"] == "CacheNotFound"
        assert "ModelCache nowhere does not exist" in condition(bad, "Rendered")["message"]
        bad = wait_until(lambda: rendered(MODELS, "no-gguf"), what="no-gguf")
        assert condition(bad, "Rendered")["reason"] == "InvalidSpec"
        assert condition(bad, "Rendered")["message"].startswith(
            "spec.source: 'pvc://models/qwen' names no .gguf file")
        # An impossible VRAM budget warns; it does not block.
        big = wait_until(
            lambda: (m if condition(m := c.api.get(MODEL_DEPLOYMENTS, c.namespace, "too-big"),
                                    "VRAMFits") else None),
            what="too-big's VRAM estimate",
        )
        fits = condition(big, "VRAMFits")
        assert (fits["status"], fits["reason"]) == ("False", "KVCacheExceedsGPUMemory")
        assert "14.4 GB" in fits["message"] and "8.0 GB" in fits["message"]
        assert condition(big, "Rendered")["status"] == "True"
        nodeless_status = wait_until(
            lambda: c.api.get(MODEL_CACHES, c.namespace, "nodeless").get("status"),
            what="nodeless's status",
        )
        assert "spec.nodeSelector" in nodeless_status["message"]
        assert condition({"status": nodeless_status}, "Ready")["reason"] == "InvalidSpec"
        wait_until(lambda: get_or_none(c, SERVICES, "fine"), what="fine rendered")
        # Nothing was created for the bad ones; the good one was.
        for name in ("missing-cache", "no-gguf"):
            assert get_or_none(c, DEPLOYMENTS, name) is None
        assert get_or_none(c, JOBS, "nodeless-download") is None
        reasons = {(e["involvedObject"]["name"], e["reason"]) for e in c.events()
                   if e["type"] == "Warning"}
        assert {("missing-cache", "CacheNotFound"), ("no-gguf", "InvalidSpec"),
                ("too-big", "KVCacheExceedsGPUMemory")} <= reasons


def test_a_model_and_a_model_deployment_of_one_name_never_share_a_deployment(
    local_cluster: Any, cluster: Cluster
) -> None:
    c = cluster
    c.add_model("twin")
    with controller(local_cluster, c.namespace):
        first = wait_until(lambda: get_or_none(c, DEPLOYMENTS, "twin"), what="twin rendered")
        c.api.create(MODEL_DEPLOYMENTS, c.namespace, {
            "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "twin"},
            "spec": {"backend": "llama-cpp", "model": f"file://{HOST_MODELS}/m.gguf", **on_kwok()},
        })
        md = wait_until(
            lambda: (m if condition(m := c.api.get(MODEL_DEPLOYMENTS, c.namespace, "twin"),
                                    "Rendered") else None),
            what="the clash reported",
        )
        clash = condition(md, "Rendered")
        assert (clash["status"], clash["reason"]) == ("False", "NameClash")
        assert "belongs to Model twin" in clash["message"]
        after = c.api.get(DEPLOYMENTS, c.namespace, "twin")
        assert after["metadata"]["ownerReferences"] == first["metadata"]["ownerReferences"]
        assert after["spec"]["template"] == first["spec"]["template"]
        assert not [p for p in c.api.list(PODS, c.namespace).get("items") or []]
        # Traffic on both: the loser's election never scales the winner's Deployment.
        c.demand("twin")
        c.wait_serving("twin")
        c.api.patch(MODEL_DEPLOYMENTS, c.namespace, "twin",
                    {"status": {"lastAccessTime": now_text()}}, subresource="status")
        hold_while_seconds(5, lambda: c.replicas("twin") == 1, what="the Model's replicas")
        assert not [e for e in c.events("twin") if e["reason"] == "IdleScaleToZero"]
