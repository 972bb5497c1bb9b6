"""The kubernetes-backed directory and demand sink against the real local control plane."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from flexinfer_core.timestamps import format_rfc3339
from flexinfer_devcluster.localcluster import LocalCluster
from flexinfer_kube.kubeapi import KubeApi
from flexinfer_proxy.api_keys import SecretKeySource
from flexinfer_proxy.app import Proxy, ProxyConfig, serve
from flexinfer_proxy.demand import (
    ALREADY_CURRENT,
    CHANGED_SINCE,
    CONFLICTED,
    SET_BY_OTHER,
    WRITTEN,
    QueueReport,
)
from flexinfer_proxy.directory import ModelEntry, ModelKind
from flexinfer_proxy.kube_demand import KubeDemandSink
from flexinfer_proxy.kube_directory import KubeDirectory

from ..k8s.kubectl import Kubectl, create_namespace, delete_namespace
from .harness import async_test, eventually

pytestmark = pytest.mark.k8s


@pytest.fixture()
def api(local_cluster: LocalCluster) -> Iterator[KubeApi]:
    client = local_cluster.new_api_client()
    yield KubeApi(client)
    client.close()


def apply(kubectl: Kubectl, namespace: str, manifest: dict[str, Any]) -> None:
    kubectl.ok("apply", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))


def model(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": name},
        "spec": {"backend": "vllm", "source": "HF://org/model", **spec},
    }


def model_deployment(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {"backend": "vllm", "model": "org/model", **spec},
    }


def entry_for(
    name: str, namespace: str, kind: ModelKind, gpu_group: str | None = None
) -> ModelEntry:
    return ModelEntry(
        name=name,
        namespace=namespace,
        kind=kind,
        ready=False,
        endpoint="http://unused/v1",
        gpu_group=gpu_group,
    )


def status_of(kubectl: Kubectl, namespace: str, resource: str) -> dict[str, Any]:
    status: dict[str, Any] = kubectl.json("get", "-n", namespace, resource).get("status") or {}
    return status


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def test_a_model_gets_last_active_time_through_the_status_subresource(
    kubectl: Kubectl, namespace: str, api: KubeApi
) -> None:
    apply(kubectl, namespace, model("demand-a"))
    target = entry_for("demand-a", namespace, ModelKind.MODEL)
    sink = KubeDemandSink(api)
    now = _now()

    assert sink.mark_active_blocking(target, now=now).result == WRITTEN
    assert status_of(kubectl, namespace, "model/demand-a")["lastActiveTime"] == format_rfc3339(now)
    # Never backwards, and no write when it already says so.
    earlier = now - timedelta(minutes=1)
    assert sink.mark_active_blocking(target, now=earlier).result == ALREADY_CURRENT
    assert sink.mark_active_blocking(target, now=now).result == ALREADY_CURRENT
    assert status_of(kubectl, namespace, "model/demand-a")["lastActiveTime"] == format_rfc3339(now)


def test_a_model_deployment_gets_last_access_time(
    kubectl: Kubectl, namespace: str, api: KubeApi
) -> None:
    apply(kubectl, namespace, model_deployment("demand-md"))
    target = entry_for("demand-md", namespace, ModelKind.MODEL_DEPLOYMENT)
    now = _now()
    assert KubeDemandSink(api).mark_active_blocking(target, now=now).result == WRITTEN
    status = status_of(kubectl, namespace, "modeldeployment/demand-md")
    assert status["lastAccessTime"] == format_rfc3339(now)


def test_a_withdrawal_puts_back_what_the_burst_replaced_unless_written_since(
    kubectl: Kubectl, namespace: str, api: KubeApi
) -> None:
    apply(kubectl, namespace, model("withdraw-a"))
    target = entry_for("withdraw-a", namespace, ModelKind.MODEL)
    sink = KubeDemandSink(api)
    before = _now() - timedelta(hours=1)
    assert sink.mark_active_blocking(target, now=before).replaced is None
    now = _now()
    outcome = sink.mark_active_blocking(target, now=now)
    assert (outcome.result, outcome.replaced) == (WRITTEN, before)

    assert sink.withdraw_blocking(target, written=now, restore=before) == WRITTEN
    assert status_of(kubectl, namespace, "model/withdraw-a")["lastActiveTime"] == (
        format_rfc3339(before)
    )
    # Absent before the burst: removed.
    assert sink.withdraw_blocking(target, written=before, restore=None) == WRITTEN
    assert "lastActiveTime" not in status_of(kubectl, namespace, "model/withdraw-a")
    # Someone wrote after this proxy: theirs stays.
    later = now + timedelta(seconds=5)  # not _now(): within the same second it is `now`
    sink.mark_active_blocking(target, now=later)
    assert sink.withdraw_blocking(target, written=now, restore=None) == CHANGED_SINCE
    assert status_of(kubectl, namespace, "model/withdraw-a")["lastActiveTime"] == (
        format_rfc3339(later)
    )


def _bump(kubectl: Kubectl, namespace: str, resource: str, **status: str) -> Any:
    """A hook that changes the object between the sink's read and its write."""
    count = 0

    def hook(obj: dict[str, Any]) -> None:
        nonlocal count
        count += 1
        kubectl.ok("label", "-n", namespace, resource, f"bump={count}", "--overwrite")
        if status:
            kubectl.patch_status(namespace, resource, {"status": status})

    return hook


def test_a_conflict_is_reread_and_retried(kubectl: Kubectl, namespace: str, api: KubeApi) -> None:
    apply(kubectl, namespace, model("conflict-once"))
    target = entry_for("conflict-once", namespace, ModelKind.MODEL)
    bump = _bump(kubectl, namespace, "model/conflict-once")
    calls = 0

    def once(obj: dict[str, Any]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            bump(obj)

    now = _now()
    outcome = KubeDemandSink(api, before_write=once).mark_active_blocking(target, now=now)
    assert (outcome.result, outcome.conflicts) == (WRITTEN, 1)
    status = status_of(kubectl, namespace, "model/conflict-once")
    assert status["lastActiveTime"] == format_rfc3339(now)


def test_three_conflicts_still_count_when_someone_else_set_it_recently(
    kubectl: Kubectl, namespace: str, api: KubeApi
) -> None:
    apply(kubectl, namespace, model("conflict-other"))
    target = entry_for("conflict-other", namespace, ModelKind.MODEL)
    now = _now()
    recent = format_rfc3339(now - timedelta(seconds=10))
    hook = _bump(kubectl, namespace, "model/conflict-other", lastActiveTime=recent)
    outcome = KubeDemandSink(api, before_write=hook).mark_active_blocking(target, now=now)
    assert (outcome.result, outcome.conflicts) == (SET_BY_OTHER, 3)
    assert outcome.done


def test_three_conflicts_without_recent_activity_are_not_done(
    kubectl: Kubectl, namespace: str, api: KubeApi
) -> None:
    apply(kubectl, namespace, model("conflict-stale"))
    target = entry_for("conflict-stale", namespace, ModelKind.MODEL)
    hook = _bump(kubectl, namespace, "model/conflict-stale")
    outcome = KubeDemandSink(api, before_write=hook).mark_active_blocking(target, now=_now())
    assert (outcome.result, outcome.conflicts) == (CONFLICTED, 3)
    assert not outcome.done
    assert "lastActiveTime" not in status_of(kubectl, namespace, "model/conflict-stale")


def test_a_gpugroup_member_queue_is_an_annotation_that_is_cleared(
    kubectl: Kubectl, namespace: str, api: KubeApi
) -> None:
    group = {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "GPUGroup",
        "metadata": {"name": "grp", "annotations": {"team": "ml"}},
        "spec": {"models": [{"name": "member-a"}, {"name": "member-b"}]},
    }
    apply(kubectl, namespace, group)
    sink = KubeDemandSink(api)
    now = _now()
    oldest = now - timedelta(seconds=5)
    member_a = entry_for("member-a", namespace, ModelKind.MODEL_DEPLOYMENT, gpu_group="grp")
    member_b = entry_for("member-b", namespace, ModelKind.MODEL_DEPLOYMENT, gpu_group="grp")

    sink.report_queue_blocking(member_a, QueueReport(queued=3, oldest_waiting=oldest), now=now)
    sink.report_queue_blocking(member_b, QueueReport(queued=1, oldest_waiting=now), now=now)
    annotations = kubectl.json("get", "-n", namespace, "gpugroup/grp")["metadata"]["annotations"]
    assert json.loads(annotations["demand.ai.flexinfer/member-a"]) == {
        "queued": 3,
        "oldestWaiting": format_rfc3339(oldest),
        "reportedAt": format_rfc3339(now),
    }
    assert annotations["team"] == "ml"

    sink.report_queue_blocking(member_a, None, now=now)
    annotations = kubectl.json("get", "-n", namespace, "gpugroup/grp")["metadata"]["annotations"]
    assert "demand.ai.flexinfer/member-a" not in annotations
    assert json.loads(annotations["demand.ai.flexinfer/member-b"])["queued"] == 1
    assert annotations["team"] == "ml"


async def _until(probe: Any, *, what: str) -> Any:
    return await eventually(probe, what=what, attempts=600, interval=0.1)


def rendered_service(
    name: str, *, kind: str, owner_uid: str, port: int, **annotations: str
) -> dict[str, Any]:
    """A Service as the renderer makes it for `name` (labels, owner, port `http`)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/managed-by": "flexinfer",
                "app.kubernetes.io/instance": name,
                "ai.flexinfer/model": name,
                "ai.flexinfer/kind": kind,
                "ai.flexinfer/backend": "vllm",
            },
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "ai.flexinfer/v1alpha2",
                    "kind": kind,
                    "name": name,
                    "uid": owner_uid,
                    "controller": True,
                }
            ],
        },
        "spec": {"ports": [{"name": "http", "port": port}], "selector": {"app": "x"}},
    }


def _found(directory: KubeDirectory, name: str) -> ModelEntry | None:
    return directory.resolve(name).entry


@async_test
async def test_the_directory_follows_models_deployments_and_services(
    kubectl: Kubectl, namespace: str, api: KubeApi
) -> None:
    directory = KubeDirectory(api, namespaces=[namespace], watch_timeout_seconds=5)
    changes: list[str] = []
    directory.subscribe(changes.append)
    await directory.start()
    try:
        await _until(lambda: directory.synced, what="the initial lists")
        await asyncio.to_thread(
            apply,
            kubectl,
            namespace,
            model("watched", serverless={"coldStartTimeout": "3m"}, serviceLabels=["chat"]),
        )
        first = await _until(lambda: _found(directory, "watched"), what="the Model to appear")
        assert (first.kind, first.ready, first.namespace) == (ModelKind.MODEL, False, namespace)
        assert first.cold_start_timeout == timedelta(minutes=3)
        assert first.endpoint == f"http://watched.{namespace}.svc:8000/v1"

        await asyncio.to_thread(
            kubectl.patch_status,
            namespace,
            "model/watched",
            {"status": {"phase": "Ready", "endpoint": "http://for-people:1/v1"}},
        )
        ready = await _until(
            lambda: (e := _found(directory, "watched")) is not None and e.ready and e,
            what="the Model to turn Ready",
        )
        assert ready.phase == "Ready"
        assert ready.endpoint == f"http://watched.{namespace}.svc:8000/v1", "never status.endpoint"
        assert f"{namespace}/watched" in changes

        # A Service of the same name that flexinfer did not render is not the route.
        uid = (await asyncio.to_thread(kubectl.json, "get", "-n", namespace, "model/watched"))[
            "metadata"
        ]["uid"]
        stranger = rendered_service("watched", kind="Model", owner_uid=uid, port=9999)
        stranger["metadata"]["labels"] = {}
        await asyncio.to_thread(apply, kubectl, namespace, stranger)
        ours = rendered_service("watched", kind="Model", owner_uid=uid, port=8080)
        await asyncio.to_thread(apply, kubectl, namespace, ours)
        # It holds its card, as its status says: its service labels go to it first.
        await asyncio.to_thread(
            kubectl.patch_status,
            namespace,
            "model/watched",
            {"status": {"sharedGroup": {"state": "Active", "queuePosition": 0}}},
        )
        routed = await _until(
            lambda: (
                (e := _found(directory, "watched")) is not None
                and e.endpoint == f"http://watched.{namespace}.svc:8080/v1"
                and e.active_services
                and e
            ),
            what="the rendered Service's port in the endpoint, and the holder's labels",
        )
        assert routed.active_services == ("chat",)
        by_label = directory.resolve("chat")
        assert (by_label.entry, by_label.by_service_label) == (routed, True)

        await asyncio.to_thread(
            kubectl.patch_status,
            namespace,
            "model/watched",
            {"status": {"servedModelName": "org/model-7b"}},
        )
        served = await _until(
            lambda: (e := _found(directory, "watched")) is not None and e.served_name and e,
            what="the served name",
        )
        assert served.backend_model == "org/model-7b"

        await asyncio.to_thread(
            apply,
            kubectl,
            namespace,
            model_deployment("member", gpuGroupRef="grp2", coldStartTimeoutSeconds=120),
        )
        member = await _until(lambda: _found(directory, "member"), what="the ModelDeployment")
        # grp2 does not exist yet: a gpuGroupRef alone makes no member.
        assert (member.kind, member.gpu_group, member.ready) == (
            ModelKind.MODEL_DEPLOYMENT,
            None,
            False,
        )
        assert member.cold_start_timeout == timedelta(seconds=120)
        group = {
            "apiVersion": "ai.flexinfer/v1alpha1",
            "kind": "GPUGroup",
            "metadata": {"name": "grp2"},
            "spec": {"models": [{"name": "member"}, {"name": "listed"}]},
        }
        await asyncio.to_thread(apply, kubectl, namespace, group)
        await _until(
            lambda: (e := _found(directory, "member")) is not None and e.gpu_group == "grp2",
            what="the GPUGroup that lists it to make it a member",
        )
        # Listed, no gpuGroupRef: a member all the same, as the controller sees it.
        await asyncio.to_thread(apply, kubectl, namespace, model_deployment("listed"))
        listed = await _until(
            lambda: (e := _found(directory, "listed")) is not None and e.gpu_group == "grp2" and e,
            what="the listed ModelDeployment to be a member",
        )
        assert listed.reports_queue
        group["spec"] = {"models": [{"name": "member"}]}
        await asyncio.to_thread(apply, kubectl, namespace, group)
        await _until(
            lambda: (e := _found(directory, "listed")) is not None and e.gpu_group is None,
            what="a ModelDeployment the group drops to be standalone again",
        )

        await asyncio.to_thread(kubectl.ok, "delete", "-n", namespace, "model/watched")
        await _until(lambda: _found(directory, "watched") is None, what="the Model to go")
        await _until(lambda: directory.resolve("chat").entry is None, what="its label to go")
    finally:
        await directory.stop()


@async_test
async def test_a_service_label_follows_a_handover_before_the_new_holder_s_status(
    kubectl: Kubectl, namespace: str, api: KubeApi
) -> None:
    """a served `pair`; b took the card: a's status (Preempted, naming b) is written,
    b's is not yet. The label goes to b at once: the entry of b changes when a's
    status does. Then b's own status says Active, and nothing moves."""
    directory = KubeDirectory(api, namespaces=[namespace], watch_timeout_seconds=5)
    await directory.start()
    try:
        await _until(lambda: directory.synced, what="the initial lists")
        for name in ("a", "b"):
            await asyncio.to_thread(
                apply, kubectl, namespace,
                model(name, gpu={"shared": "g"}, serviceLabels=["pair"]),
            )  # fmt: skip

        def patch(name: str, status: dict[str, Any]) -> None:
            kubectl.patch_status(namespace, f"model/{name}", {"status": status})

        await asyncio.to_thread(patch, "a", {"phase": "Ready", "sharedGroup": {
            "groupName": "g", "state": "Active", "queuePosition": 0}})  # fmt: skip
        await asyncio.to_thread(patch, "b", {"phase": "Idle", "sharedGroup": {
            "groupName": "g", "state": "Queued", "queuePosition": 1}})  # fmt: skip

        def routed() -> str | None:
            entry = directory.resolve("pair").entry
            return entry.name if entry is not None else None

        await _until(lambda: routed() == "a", what="the label to go to the holder, a")
        await asyncio.to_thread(patch, "a", {"phase": "Preempted", "sharedGroup": {
            "state": "Queued", "queuePosition": 1, "preemptedBy": "b",
            "preemptedAt": _now().isoformat().replace("+00:00", "Z")}})  # fmt: skip
        await _until(lambda: routed() == "b", what="the label to follow a's eviction to b")
        b = _found(directory, "b")
        assert b is not None and b.active_services == ("pair",)
        await asyncio.to_thread(patch, "b", {"phase": "Ready", "sharedGroup": {
            "state": "Active", "queuePosition": 0}})  # fmt: skip
        await _until(lambda: (e := _found(directory, "b")) is not None and e.ready,
                     what="b Ready")  # fmt: skip
        assert routed() == "b"
    finally:
        await directory.stop()


@async_test
async def test_a_name_in_several_namespaces_is_ambiguous_unless_they_are_ordered(
    kubectl: Kubectl, namespace: str, api: KubeApi
) -> None:
    other = await asyncio.to_thread(create_namespace, kubectl, "proxy-other")
    try:
        for ns in (namespace, other):
            await asyncio.to_thread(apply, kubectl, ns, model("shadowed"))
        preferring_other = KubeDirectory(api, namespaces=[other, namespace])
        everywhere = KubeDirectory(api)
        for directory in (preferring_other, everywhere):
            await directory.start()
        try:
            # Until both namespaces have listed, the name may resolve to whichever
            # listed first; the preference is only defined on a full view.
            await _until(lambda: preferring_other.synced, what="both namespaces' lists")
            first = await _until(
                lambda: _found(preferring_other, "shadowed"),
                what="the Model in both namespaces",
            )
            assert first.namespace == other
            await _until(lambda: everywhere.synced, what="the cluster-wide lists")
            # Watching every namespace, a bare name there twice is never a guess.
            both = await _until(
                lambda: everywhere.resolve("shadowed").ambiguous, what="both namespaces seen"
            )
            assert both == tuple(sorted((namespace, other)))
            assert everywhere.resolve("shadowed").entry is None
            chosen = _found(everywhere, f"{other}/shadowed")
            assert chosen is not None and chosen.namespace == other

            # A Model named like another namespace's service label captures nothing.
            await asyncio.to_thread(apply, kubectl, other, model("small", serviceLabels=["cap"]))
            await asyncio.to_thread(apply, kubectl, namespace, model("cap"))
            captured = await _until(
                lambda: everywhere.resolve("cap").labelled_in, what="both meanings of 'cap'"
            )
            assert captured == (other,)
            assert everywhere.resolve("cap").ambiguous == tuple(sorted((namespace, other)))
            labelled = everywhere.resolve("cap", reachable=frozenset({other})).entry
            assert labelled is not None and labelled.key == f"{other}/small"

            await asyncio.to_thread(kubectl.ok, "delete", "-n", other, "model/shadowed")
            await _until(
                lambda: (
                    (e := _found(preferring_other, "shadowed")) is not None
                    and e.namespace == namespace
                ),
                what="the name to fall back to the next namespace",
            )
            await _until(
                lambda: (
                    (e := _found(everywhere, "shadowed")) is not None and e.namespace == namespace
                ),
                what="the name to be unambiguous again",
            )
        finally:
            for directory in (preferring_other, everywhere):
                await directory.stop()
    finally:
        await asyncio.to_thread(delete_namespace, kubectl, other)


@async_test
async def test_api_keys_come_from_a_secret_and_follow_its_rotation(
    kubectl: Kubectl, namespace: str, api: KubeApi
) -> None:
    def secret(**keys: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "proxy-keys"},
                "stringData": keys}  # fmt: skip

    source = SecretKeySource(api, namespace, "proxy-keys", refresh=3600)

    def reaches(token: str) -> frozenset[str] | bool | None:
        """The namespaces the token reaches (None: all), or False: not a key."""
        key = source.keys.key_for(f"Bearer {token}")
        return False if key is None else key.namespaces

    await source.read_once()
    assert source.keys.loaded and reaches("anything") is False, "missing: nobody"

    await asyncio.to_thread(apply, kubectl, namespace, secret(team_a="old-key"))
    await source.read_once()
    assert reaches("old-key") is None, "a bare token reaches every namespace"

    await asyncio.to_thread(kubectl.ok, "delete", "-n", namespace, "secret/proxy-keys")
    rotated = secret(team_a="new-key namespaces=team-a", ci="ci-key", typo="ci-2 namespace=x")
    await asyncio.to_thread(apply, kubectl, namespace, rotated)
    await source.read_once()
    assert reaches("old-key") is False
    assert reaches("new-key") == frozenset({"team-a"}) and reaches("ci-key") is None
    assert reaches("ci-2") is False, "an entry that cannot be read lets nobody in"


def test_requests_in_flight_are_written_where_the_controller_reads_them(
    kubectl: Kubectl, namespace: str, api: KubeApi
) -> None:
    # docs/election.md 1.6: a Model's in status.inFlight, a GPUGroup member's in its
    # demand annotation (kept while either its queue or its count is above 0).
    apply(kubectl, namespace, model("busy"))
    earlier = {"status": {"lastActiveTime": "2026-01-01T00:00:00Z"}}
    kubectl.patch_status(namespace, "model/busy", earlier)
    sink = KubeDemandSink(api)
    now = _now()
    busy = entry_for("busy", namespace, ModelKind.MODEL)
    sink.report_in_flight_blocking(busy, 2, now=now)
    status = status_of(kubectl, namespace, "model/busy")
    assert status["inFlight"] == {"count": 2, "reportedAt": format_rfc3339(now)}
    assert status["lastActiveTime"] == "2026-01-01T00:00:00Z"  # nothing else touched
    sink.report_in_flight_blocking(busy, 0, now=now)
    assert status_of(kubectl, namespace, "model/busy")["inFlight"]["count"] == 0

    group = {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "GPUGroup",
        "metadata": {"name": "answering"},
        "spec": {"models": [{"name": "member-c"}]},
    }
    apply(kubectl, namespace, group)
    member = entry_for("member-c", namespace, ModelKind.MODEL_DEPLOYMENT, gpu_group="answering")
    report = QueueReport(queued=0, oldest_waiting=None, in_flight=2)
    sink.report_queue_blocking(member, report, now=now)
    annotations = kubectl.json("get", "-n", namespace, "gpugroup/answering")["metadata"][
        "annotations"
    ]
    assert json.loads(annotations["demand.ai.flexinfer/member-c"]) == {
        "queued": 0,
        "inFlight": 2,
        "reportedAt": format_rfc3339(now),
    }


def _packed_status(
    footprint: str, *, reason: str, holds: bool, used: str = "9728Mi"
) -> dict[str, Any]:
    """A budgeted group's member as the controller writes it (docs/election.md 1.7)."""
    at = format_rfc3339(_now())
    words = "fits: 9.5 of 24 GiB used" if holds else "coder needs 16 GiB, 14.5 free"
    return {
        "phase": "Ready" if holds else "Idle",
        "sharedGroup": {"groupName": "card", "state": "Active" if holds else "Queued",
                        "queuePosition": 0 if holds else 1},
        "conditions": [
            {"type": "Active", "status": "True" if holds else "False", "reason": reason,
             "message": words, "lastTransitionTime": at},
            {"type": "Packed", "status": "True" if holds else "False",
             "reason": reason if holds else "WaitingForVram", "message": words,
             "lastTransitionTime": at},
        ],
        "vram": {"footprint": footprint, "budget": "24Gi", "used": used},
    }  # fmt: skip


@async_test
async def test_every_holder_of_a_packed_group_answers_at_once_with_no_queue(
    kubectl: Kubectl, namespace: str, api: KubeApi, backends: dict[str, Any]
) -> None:
    """chat leads a budgeted group and embed sits beside it (both Active, Packed True,
    as the controller writes them; coder waits for room). The proxy over the real API
    server sends a request for each holder to its own server at once: both streams are
    open together, neither waits in a queue; only coder's request waits. The page's
    data names both holders, the leader, and the budget's use."""
    alpha, beta = backends["alpha"], backends["beta"]
    sizes = {"chat": "5632Mi", "embed": "4Gi", "coder": "16Gi"}
    for name, size in sizes.items():
        body = model(name, gpu={"shared": "card", "vramBudget": "24Gi", "vramEstimate": size})
        await asyncio.to_thread(apply, kubectl, namespace, body)
    statuses = {
        "chat": _packed_status("5632Mi", reason="HighestPriority", holds=True),
        "embed": _packed_status("4Gi", reason="CoResident", holds=True),
        "coder": _packed_status("16Gi", reason="Queued", holds=False),
    }
    for name, status in statuses.items():
        await asyncio.to_thread(kubectl.patch_status, namespace, f"model/{name}",
                                {"status": status})  # fmt: skip
    directory = KubeDirectory(
        api,
        namespaces=[namespace],
        endpoint_overrides={"chat": alpha.endpoint, "embed": beta.endpoint,
                            "coder": alpha.endpoint},
        watch_timeout_seconds=5,
    )  # fmt: skip
    proxy = Proxy(directory, KubeDemandSink(api), registry=CollectorRegistry(),
                  config=ProxyConfig(min_queue_wait=timedelta(seconds=30)))  # fmt: skip
    server, port = await serve(proxy, host="127.0.0.1", port=0)
    url = f"http://127.0.0.1:{port}"
    try:
        await _until(lambda: directory.synced, what="the initial lists")
        await _until(
            lambda: all((e := _found(directory, n)) is not None and e.ready
                        for n in ("chat", "embed")),
            what="chat and embed Ready",
        )  # fmt: skip
        async with aiohttp.ClientSession() as session:
            tag = f"packed-{namespace}"
            holders = {"chat": alpha, "embed": beta}
            async with _held_side_by_side(
                session, url, proxy, namespace, tag=tag, holders=holders, waiter="coder"
            ):
                data = proxy.live.status()
                (group,) = [g for g in data["groups"] if g["name"] == "card"]
                assert (group["holder"], group["active"], group["packed"]) == (
                    "chat", ["chat", "embed"], True
                )  # fmt: skip
                assert group["vram"] == {"budget": "24Gi", "used": "9728Mi"}
                assert [w["name"] for w in data["waiting"]] == ["coder"]
        # Asked for, both: the proxy marked each active, and nothing else of theirs.
        for name in ("chat", "embed"):
            status = await asyncio.to_thread(status_of, kubectl, namespace, f"model/{name}")
            assert status["lastActiveTime"]
            assert status["sharedGroup"]["state"] == "Active"
    finally:
        await server.cleanup()


@contextlib.asynccontextmanager
async def _held_side_by_side(
    session: aiohttp.ClientSession,
    url: str,
    proxy: Any,
    namespace: str,
    *,
    tag: str,
    holders: dict[str, Any],
    waiter: str,
) -> AsyncIterator[None]:
    """A held streaming request for each holder (name -> its backend) and one for
    `waiter`: inside, both reached their own servers while neither answer is done, none
    of them queued, and `waiter`'s request waits in its queue; on leaving, both are
    released and each answered in full with no queue position."""

    async def stream(name: str) -> tuple[int, dict[str, str], list[bytes]]:
        body = {"model": name, "stream": True, "hold": True, "tag": f"{tag}-{name}"}
        async with session.post(f"{url}/v1/chat/completions", json=body) as response:
            head = dict(response.headers)
            lines = [line async for line in response.content if line.strip()]
            return response.status, head, lines

    answers = [asyncio.create_task(stream(n)) for n in holders]
    waiting = asyncio.create_task(
        session.post(f"{url}/v1/chat/completions", json={"model": waiter})
    )
    try:
        for name, backend in holders.items():
            await _until(
                lambda b=backend, n=name: _arrived(session, b, f"{tag}-{n}"),
                what=f"{name} at its server",
            )
        assert not any(a.done() for a in answers)
        for name in holders:
            assert proxy.queues.depth(f"{namespace}/{name}") == 0
        await _until(lambda: proxy.queues.depth(f"{namespace}/{waiter}") == 1,
                     what=f"{waiter}'s request to wait")  # fmt: skip
        yield
        for name, backend in holders.items():
            await backend.release(session, f"{tag}-{name}")
        for status, head, lines in await asyncio.gather(*answers):
            assert status == 200 and lines[-1].strip() == b"data: [DONE]"
            assert "x-flexinfer-queue-position" not in {h.lower() for h in head}
    finally:
        waiting.cancel()


async def _arrived(session: aiohttp.ClientSession, backend: Any, tag: str) -> bool:
    return tag in await backend.arrivals(session)


@async_test
async def test_every_holder_of_a_packed_gpugroup_answers_at_once_with_no_queue(
    kubectl: Kubectl, namespace: str, api: KubeApi, backends: dict[str, Any]
) -> None:
    """A GPUGroup as the controller writes it once packed (docs/election.md 3): gchat
    leads, gembed sits beside it (both Active in modelStatuses, both ModelDeployments
    Running, Packed True), gcoder waits for room. Through the proxy over the real API
    server a request for each holder reaches its own server at once, neither queued;
    only gcoder's waits (and is reported as its queue on the group). The page's data
    names both holders, the leader, and the budget's use. (Not chat, embed, coder nor card:
    the shared group of the test above, in this namespace too, has those names.)"""
    alpha, beta = backends["alpha"], backends["beta"]
    sizes = {"gchat": "5632Mi", "gembed": "4Gi", "gcoder": "16Gi"}
    group = {
        "apiVersion": "ai.flexinfer/v1alpha1", "kind": "GPUGroup",
        "metadata": {"name": "gcard"},
        "spec": {"vramBudget": "24Gi",
                 "models": [{"name": n, "vramEstimate": s} for n, s in sizes.items()]},
    }  # fmt: skip
    await asyncio.to_thread(apply, kubectl, namespace, group)
    for name in sizes:
        await asyncio.to_thread(apply, kubectl, namespace,
                                model_deployment(name, gpuGroupRef="gcard"))  # fmt: skip
    at = format_rfc3339(_now())
    for name in sizes:
        holds = name != "gcoder"
        status = {"phase": "Running" if holds else "Idle", "replicas": int(holds),
                  "readyReplicas": int(holds),
                  "conditions": [{"type": "Ready", "status": "True" if holds else "False",
                                  "reason": "Running" if holds else "NotActive",
                                  "message": "", "lastTransitionTime": at}]}  # fmt: skip
        await asyncio.to_thread(kubectl.patch_status, namespace, f"modeldeployment/{name}",
                                {"status": status})  # fmt: skip
    words = "gchat, gembed hold the card together: fits: 9.5 of 24 GiB used"
    group_status = {
        "phase": "Active", "message": "gchat holds the GPU", "activeModel": "gchat",
        "swapCount": 1, "lastSwapTime": at,
        "modelStatuses": [
            {"name": "gchat", "state": "Active", "queuedRequests": 0, "footprint": "5632Mi"},
            {"name": "gembed", "state": "Active", "queuedRequests": 0, "footprint": "4Gi"},
            {"name": "gcoder", "state": "Idle", "queuedRequests": 0, "footprint": "16Gi"},
        ],
        "vram": {"budget": "24Gi", "used": "9728Mi"},
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "KeepCurrent",
             "message": "gchat holds the GPU", "lastTransitionTime": at},
            {"type": "Packed", "status": "True", "reason": "CoResident", "message": words,
             "lastTransitionTime": at},
        ],
    }  # fmt: skip
    await asyncio.to_thread(kubectl.patch_status, namespace, "gpugroup/gcard",
                            {"status": group_status})  # fmt: skip
    directory = KubeDirectory(
        api,
        namespaces=[namespace],
        endpoint_overrides={"gchat": alpha.endpoint, "gembed": beta.endpoint,
                            "gcoder": alpha.endpoint},
        watch_timeout_seconds=5,
    )  # fmt: skip
    proxy = Proxy(directory, KubeDemandSink(api), registry=CollectorRegistry(),
                  config=ProxyConfig(min_queue_wait=timedelta(seconds=30)))  # fmt: skip
    server, port = await serve(proxy, host="127.0.0.1", port=0)
    url = f"http://127.0.0.1:{port}"
    try:
        await _until(lambda: directory.synced, what="the initial lists")
        await _until(
            lambda: all((e := _found(directory, n)) is not None and e.ready
                        and e.gpu_group == "gcard" for n in ("gchat", "gembed")),
            what="gchat and gembed Ready members of gcard",
        )  # fmt: skip
        # Packed True (CoResident): gcoder would start beside them, so its wait estimate
        # is its own swap, not theirs added first (queues.estimate_wait).
        gcoder = _found(directory, "gcoder")
        assert gcoder is not None and gcoder.side_by_side and not gcoder.ready
        async with aiohttp.ClientSession() as session:
            tag = f"packed-gg-{namespace}"
            holders = {"gchat": alpha, "gembed": beta}
            async with _held_side_by_side(
                session, url, proxy, namespace, tag=tag, holders=holders, waiter="gcoder"
            ):
                data = proxy.live.status()
                (row,) = [g for g in data["groups"] if g["name"] == "gcard"]
                assert (row["kind"], row["holder"], row["active"], row["packed"]) == (
                    "GPUGroup", "gchat", ["gchat", "gembed"], True
                )  # fmt: skip
                assert row["vram"] == {"budget": "24Gi", "used": "9728Mi"}

                def coder_reported() -> bool:
                    stored = kubectl.json("get", "-n", namespace, "gpugroup/gcard")
                    notes = stored["metadata"].get("annotations") or {}
                    return "demand.ai.flexinfer/gcoder" in notes

                await _until(lambda: coder_reported(), what="gcoder's queue on the group")
        # The proxy wrote no status: the seats stay as the controller wrote them.
        stored = status_of(kubectl, namespace, "gpugroup/gcard")
        assert [r["state"] for r in stored["modelStatuses"]] == ["Active", "Active", "Idle"]
    finally:
        await server.cleanup()
