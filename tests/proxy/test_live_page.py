"""The live page's data: groups as recorded in status (the shaping `flexinfer status -o
json` shares), the proxy's queues beside them, swaps in a bounded ring, and who may
read it (with API keys: a key, and only its namespaces).

The browser test over a real cluster and proxy is tests/e2e/test_live_page_browser.py.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from flexinfer_cli.manifests import load_manifests
from flexinfer_cli.status import status_data
from flexinfer_core import DEFAULT_POLICY
from flexinfer_kube.clock import ManualClock
from flexinfer_kube.objects import JSON
from flexinfer_kube.recorded_status import MAX_CONDITIONS, card_holders, recorded_groups
from flexinfer_proxy.api_keys import ApiKeys
from flexinfer_proxy.app import Proxy, ProxyConfig, serve
from flexinfer_proxy.directory import InMemoryDirectory, ModelEntry
from flexinfer_proxy.live_page import (
    OBSERVE_DELAY_SECONDS,
    TIMELINE_LENGTH,
    LivePage,
    RecordedObjects,
    Swap,
)

from .harness import RecordingSink, async_test, entry

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
DOC = Path(__file__).resolve().parents[2] / "docs" / "live-page.md"


def condition(kind: str, status: bool, reason: str, message: str = "") -> JSON:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-12-01T11:59:00Z",
    }


def shared_model(
    name: str,
    *,
    namespace: str = "ai",
    group: str = "card",
    state: str = "Queued",
    phase: str = "Idle",
    position: int | None = None,
    reason: str = "Queued",
    message: str = "",
) -> JSON:
    shared: JSON = {"groupName": group, "state": state}
    if position is not None:  # a merge patch's None deletes the field
        shared["queuePosition"] = position
    return {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"backend": "vllm", "source": f"HF://org/{name}", "gpu": {"shared": group}},
        "status": {
            "phase": phase,
            "message": message,
            "sharedGroup": shared,
            "conditions": [
                condition("Active", state == "Active", reason, message),
                condition("Ready", phase == "Ready", "Ready" if phase == "Ready" else "NotActive"),
            ],
        },
    }


GPU_GROUP = {
    "apiVersion": "ai.flexinfer/v1alpha1",
    "kind": "GPUGroup",
    "metadata": {"name": "box", "namespace": "ai"},
    "spec": {"models": [{"name": "md-a"}, {"name": "md-b"}]},
    "status": {
        "phase": "Active",
        "message": "md-a is active",
        "activeModel": "md-a",
        "lastSwapTime": "2026-12-01T11:50:00Z",
        "lastSwapReason": "HigherPriority",
        "swapCount": 3,
        "modelStatuses": [
            {"name": "md-a", "state": "Active", "queuedRequests": 0},
            {"name": "md-b", "state": "Queued", "queuedRequests": 2},
        ],
        "conditions": [condition("Ready", True, "Active", "md-a is active")],
    },
}
MD_A = {
    "apiVersion": "ai.flexinfer/v1alpha1",
    "kind": "ModelDeployment",
    "metadata": {"name": "md-a", "namespace": "ai"},
    "spec": {"backend": "vllm", "model": "m", "gpuGroupRef": "box"},
    "status": {"phase": "Running", "conditions": [condition("Ready", True, "Running")]},
}


def test_a_shared_group_shows_its_holder_why_and_members_in_queue_order() -> None:
    models = [
        shared_model("b", position=2, reason="Queued", message="behind c"),
        shared_model(
            "a", state="Active", phase="Ready", reason="HighestPriority", message="a holds it"
        ),
        shared_model("c", position=1, phase="Draining", message="a phase of tomorrow"),
    ]
    (group,) = recorded_groups(models=models, gpu_groups=[], model_deployments=[])
    assert (group["kind"], group["namespace"], group["name"]) == ("SharedGroup", "ai", "card")
    assert (group["holder"], group["phase"]) == ("a", "Ready")
    assert (group["reason"], group["message"]) == ("HighestPriority", "a holds it")
    assert [m["name"] for m in group["members"]] == ["a", "c", "b"]
    c = group["members"][1]
    # A phase this code never heard of is shown as written, not dropped or mapped.
    assert (c["phase"], c["state"], c["queuePosition"]) == ("Draining", "Queued", 1)
    assert [x["type"] for x in c["conditions"]] == ["Active", "Ready"]


def member(name: str, phase: str, state: str, **shared: str) -> JSON:
    return {"metadata": {"name": name, "namespace": "ai"}, "spec": {"gpu": {"shared": "g"}},
            "status": {"phase": phase, "sharedGroup": {"state": state, **shared}}}  # fmt: skip


def test_the_holder_is_the_active_member() -> None:
    group = [
        member("a", "Preempted", "Queued", preemptedBy="b", preemptedAt="2026-01-01T00:00:00Z"),
        member("b", "Ready", "Active"),
        member("c", "Idle", "Queued"),
    ]
    assert card_holders(group) == {"b"}


def test_while_no_member_says_active_the_latest_eviction_names_the_holder() -> None:
    """The controller writes the evicted member's status at the handover and the new
    holder's with its next step: until then, the holder is who the eviction names."""
    group = [
        # An old eviction, still on record while a stays Preempted.
        member("a", "Preempted", "Queued", preemptedBy="b", preemptedAt="2026-01-01T00:00:00Z"),
        member("b", "Preempted", "Queued", preemptedBy="c", preemptedAt="2026-01-01T00:05:00Z"),
        member("c", "Idle", "Queued", queuePosition="1"),
    ]
    assert card_holders(group) == {"c"}
    # A drain is an eviction too, from its start.
    draining = member("c", "Draining", "Queued", preemptedBy="a",
                      drainingSince="2026-01-01T00:06:00Z")  # fmt: skip
    assert card_holders([*group[:2], draining]) == {"a"}
    # A lease (or a member gone) holds no entry: nobody advertises.
    leased = member("b", "Preempted", "Queued", preemptedBy="gpu-lease/trainer",
                    preemptedAt="2026-01-01T00:05:00Z")  # fmt: skip
    assert card_holders([group[0], leased, group[2]]) == set()
    assert card_holders([member("c", "Idle", "Queued")]) == set()


def test_a_holder_whose_status_follows_its_handover_is_the_group_s_holder() -> None:
    """The page (and `flexinfer status -o json`) name the holder from the eviction
    while the new holder's own status is not written yet."""
    models = [
        member("a", "Preempted", "Queued", preemptedBy="b", preemptedAt="2026-12-01T11:59:00Z"),
        member("b", "Idle", "Queued"),
    ]
    (group,) = recorded_groups(models=models, gpu_groups=[], model_deployments=[])
    assert (group["holder"], group["active"]) == ("b", ["b"])
    assert [m["name"] for m in group["members"]] == ["b", "a"]


def test_two_active_members_mid_swap_make_no_holder() -> None:
    models = [shared_model("a", state="Active"), shared_model("b", state="Active")]
    (group,) = recorded_groups(models=models, gpu_groups=[], model_deployments=[])
    assert (group["holder"], group["active"]) == (None, ["a", "b"])


def packed_model(
    name: str, footprint: str, *, reason: str = "CoResident", used: str = "9728Mi",
    budget: str = "24Gi", packed: bool = True, state: str = "Active",
) -> JSON:
    """A member of a budgeted group as the controller writes it (docs/election.md 1.7):
    `Packed` and `status.vram` beside its `Active` condition."""
    model = shared_model(name, state=state, phase="Ready" if state == "Active" else "Idle",
                         position=0 if state == "Active" else 1, reason=reason)
    model["spec"]["gpu"] |= {"vramBudget": budget, "vramEstimate": footprint}
    model["status"]["conditions"].append(
        condition("Packed", packed, reason if packed else "Queued", "fits: 9.5 of 24 GiB used")
    )
    model["status"]["vram"] = {"footprint": footprint, "budget": budget, "used": used}
    return model


def test_a_packed_group_has_several_holders_and_its_leader_is_the_holder() -> None:
    """Several Active members each saying Packed, within the budget together: every one
    holds the card (the proxy routes to each), the leader is named, the use is shown."""
    models = [
        packed_model("embed", "4Gi"),
        packed_model("coder", "16Gi", state="Queued", packed=False),
        packed_model("chat", "5632Mi", reason="HighestPriority"),
    ]
    assert card_holders(models) == {"chat", "embed"}
    (group,) = recorded_groups(models=models, gpu_groups=[], model_deployments=[])
    assert (group["holder"], group["active"], group["packed"]) == ("chat", ["chat", "embed"], True)
    assert (group["phase"], group["reason"]) == ("Ready", "HighestPriority")
    assert group["vram"] == {"budget": "24Gi", "used": "9728Mi"}
    assert [(m["name"], m["footprint"]) for m in group["members"]] == [
        ("chat", "5632Mi"), ("embed", "4Gi"), ("coder", "16Gi")
    ]  # fmt: skip


def test_a_packed_reading_that_does_not_add_up_is_a_change_half_written() -> None:
    """Statuses are written one after the other: an evicted member may still read
    Active and Packed beside the one that took its room. Over the budget together, or
    two leaders, or a holder not Packed: nobody is named, as for a swap half written."""
    chat = packed_model("chat", "5632Mi", reason="HighestPriority")
    over = [chat, packed_model("embed", "4Gi"), packed_model("coder", "16Gi")]
    two_leaders = [chat, packed_model("embed", "4Gi", reason="Demanded")]
    unpacked = [chat, packed_model("embed", "4Gi", packed=False)]
    for models in (over, two_leaders, unpacked):
        (group,) = recorded_groups(models=models, gpu_groups=[], model_deployments=[])
        assert (group["holder"], group["packed"]) == (None, False)
        assert len(group["active"]) == len(card_holders(models)) > 1


def test_the_timeline_follows_a_packed_group_s_set_of_holders() -> None:
    async def run() -> list[JSON]:
        directory = _swapping_directory()
        clock = ManualClock(NOW)
        proxy = Proxy(directory, RecordingSink(), clock=clock)
        page = LivePage(directory, proxy.queues, clock=clock)
        chat = packed_model("chat", "5632Mi", reason="HighestPriority")
        readings = [
            [chat],  # where the strip starts
            [chat, packed_model("embed", "4Gi")],  # embed sits beside chat
            [chat, packed_model("embed", "4Gi"), packed_model("coder", "16Gi")],  # half
            [chat, packed_model("coder", "16Gi", used="21Gi")],  # coder evicted embed
        ]
        for models in readings:
            directory.objects = RecordedObjects(models=models)
            page.groups()
        timeline: list[JSON] = page.status()["timeline"]
        return timeline

    timeline = asyncio.run(run())
    assert [(s["from"], s["fromHolders"], s["to"], s["toHolders"]) for s in timeline] == [
        ("chat", ["chat"], "chat", ["chat", "embed"]),
        ("chat", ["chat", "embed"], "chat", ["chat", "coder"]),
    ]


def test_a_gpu_group_shows_its_active_model_and_each_members_recorded_state() -> None:
    (group,) = recorded_groups(models=[], gpu_groups=[GPU_GROUP], model_deployments=[MD_A])
    assert (group["kind"], group["holder"], group["reason"]) == ("GPUGroup", "md-a", "Active")
    assert (group["swapCount"], group["lastSwapReason"]) == (3, "HigherPriority")
    a, b = group["members"]
    assert (a["name"], a["phase"], a["state"]) == ("md-a", "Running", "Active")
    assert (b["name"], b["phase"], b["state"], b["queuedRequests"]) == ("md-b", None, "Queued", 2)


def test_a_packed_gpu_group_shows_every_member_it_records_active_leader_first() -> None:
    """As the controller writes a packed GPUGroup: md-a leads, md-b sits beside it
    (both Active), the Packed condition True; both hold the card, md-a is the holder."""
    group = copy.deepcopy(GPU_GROUP)
    group["spec"]["models"].insert(0, {"name": "md-c"})
    group["status"]["modelStatuses"] = [
        {"name": "md-c", "state": "Queued", "queuedRequests": 1, "footprint": "16Gi"},
        {"name": "md-b", "state": "Active", "queuedRequests": 0, "footprint": "4Gi"},
        {"name": "md-a", "state": "Active", "queuedRequests": 0, "footprint": "5632Mi"},
    ]
    group["status"]["vram"] = {"budget": "24Gi", "used": "9728Mi"}
    group["status"]["conditions"].append(
        condition("Packed", True, "CoResident",
                  "md-a, md-b hold the card together: fits: 9.5 of 24 GiB used")
    )  # fmt: skip
    (row,) = recorded_groups(models=[], gpu_groups=[group], model_deployments=[MD_A])
    assert (row["holder"], row["active"], row["packed"]) == ("md-a", ["md-a", "md-b"], True)
    assert row["vram"] == {"budget": "24Gi", "used": "9728Mi"}
    # Without Packed True (a controller without a shared card), one holder only.
    group["status"]["conditions"][-1] = condition("Packed", False, "NoSharedCard", "")
    (row,) = recorded_groups(models=[], gpu_groups=[group], model_deployments=[MD_A])
    assert (row["holder"], row["active"], row["packed"]) == ("md-a", ["md-a"], False)


def test_conditions_shown_are_bounded() -> None:
    model = shared_model("a", state="Active")
    model["status"]["conditions"] = [condition(f"C{i}", True, "x") for i in range(50)]
    (group,) = recorded_groups(models=[model], gpu_groups=[], model_deployments=[])
    assert len(group["members"][0]["conditions"]) == MAX_CONDITIONS


class RecordingDirectory(InMemoryDirectory):
    """An in-memory directory that also holds status objects, as the cluster's does."""

    def __init__(self, entries: Sequence[ModelEntry], objects: RecordedObjects) -> None:
        super().__init__(entries)
        self.objects = objects

    def recorded_objects(self) -> RecordedObjects:
        return self.objects


def test_flexinfer_status_json_and_the_page_share_one_shaping(tmp_path: Path) -> None:
    objects = [shared_model("a", state="Active", phase="Ready"), shared_model("b", position=1)]
    objects += [GPU_GROUP, MD_A]
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    view = load_manifests([str(path)], namespace="ai")
    cli = status_data(view, now=NOW, policy=DEFAULT_POLICY)["recorded"]

    async def page() -> JSON:
        directory = RecordingDirectory(
            [],
            RecordedObjects(
                models=objects[:2], gpu_groups=[GPU_GROUP], model_deployments=[MD_A]
            ),
        )
        proxy = Proxy(directory, RecordingSink(), clock=ManualClock(NOW))
        return proxy.live.status()

    shown = asyncio.run(page())["groups"]
    for group in shown:
        assert group.pop("observedSince") == "2026-12-01T12:00:00Z"  # the proxy's own
        for member in group["members"]:
            assert member.pop("waiting") == {
                "queued": 0,
                "oldestWaitSeconds": 0.0,
                "expectedWaitSeconds": 0.0,
            }
    assert [g["holder"] for g in cli] == ["a", "md-a"]
    assert shown == cli


def _swapping_directory() -> RecordingDirectory:
    return RecordingDirectory([], RecordedObjects())


def _hold(directory: RecordingDirectory, *active: str) -> None:
    directory.objects = RecordedObjects(models=[shared_model(n, state="Active") for n in active])


def test_swaps_are_holder_changes_kept_in_a_bounded_ring() -> None:
    async def run() -> list[JSON]:
        directory = _swapping_directory()
        clock = ManualClock(NOW)
        proxy = Proxy(directory, RecordingSink(), clock=clock)
        page = LivePage(directory, proxy.queues, clock=clock, timeline_length=3)
        _hold(directory, "a")
        page.groups()  # the first holder seen: where the strip starts, not a swap
        assert list(page.timeline) == []
        _hold(directory, "a", "b")
        page.groups()  # between the two status writes of a swap: skipped
        assert list(page.timeline) == []
        for holder in ("b", "a", "b", "a"):
            _hold(directory, holder)
            page.groups()
            page.groups()  # the same holder read again is no swap
        timeline: list[JSON] = page.status()["timeline"]
        return timeline

    timeline = asyncio.run(run())
    # Four swaps (a→b, b→a, a→b, b→a); the ring keeps the last three.
    assert [(s["from"], s["to"]) for s in timeline] == [("b", "a"), ("a", "b"), ("b", "a")]
    assert timeline[-1] == {
        "at": "2026-12-01T12:00:00Z",
        "kind": "SharedGroup",
        "namespace": "ai",
        "group": "card",
        "from": "b",
        "to": "a",
        "fromHolders": ["b"],
        "toHolders": ["a"],
    }


def test_a_swap_is_seen_when_the_directory_changes_with_nobody_watching() -> None:
    # The holder is read again after each change the directory reports, so the timeline
    # has the swap although no page asked for /status.json in between.
    async def run() -> list[Swap]:
        directory = _swapping_directory()
        clock = ManualClock(NOW)
        proxy = Proxy(directory, RecordingSink(), clock=clock)
        changed = entry("a", "http://unused/v1", namespace="ai")
        for holder in ("a", "b"):
            _hold(directory, holder)
            directory.put(changed)
            # A later timer of the same loop: the read is due before it, whatever the load.
            await asyncio.sleep(OBSERVE_DELAY_SECONDS * 3)
        proxy.live.close()
        return list(proxy.live.timeline)

    (swap,) = asyncio.run(run())
    assert (swap.group, swap.previous, swap.holder) == ("card", "a", "b")


@asynccontextmanager
async def page_proxy(
    directory: InMemoryDirectory, *, api_keys: ApiKeys | None = None
) -> AsyncIterator[str]:
    proxy = Proxy(directory, RecordingSink(), config=ProxyConfig(), api_keys=api_keys)
    server, port = await serve(proxy, host="127.0.0.1", port=0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await server.cleanup()


async def _get(session: aiohttp.ClientSession, url: str, key: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with session.get(url, headers=headers) as response:
        body = await response.read()
        return response.status, response.headers, body


def _two_teams() -> RecordingDirectory:
    models = [
        shared_model("a", namespace="team-a", state="Active"),
        shared_model("b", namespace="team-b", state="Active"),
    ]
    entries = [entry("a", "http://unused/v1", namespace="team-a", ready=False)]
    return RecordingDirectory(entries, RecordedObjects(models=models))


@async_test
async def test_without_api_keys_the_page_and_its_data_are_open_and_show_queues() -> None:
    directory = _two_teams()
    async with page_proxy(directory) as url, aiohttp.ClientSession() as session:
        status, headers, body = await _get(session, f"{url}/ui")
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        assert b"status.json" in body and b"<script" in body
        assert "connect-src 'self'" in headers["Content-Security-Policy"]
        # A request waits for team-a/a (not Ready): the page shows it waiting.
        waiting = asyncio.create_task(
            session.post(f"{url}/v1/completions", json={"model": "team-a/a"})
        )
        try:
            for _ in range(200):
                status, headers, body = await _get(session, f"{url}/status.json")
                data = yaml.safe_load(body)
                if data["waiting"]:
                    break
                await asyncio.sleep(0.05)
            assert headers["Cache-Control"] == "no-store"
            assert [w["model"] for w in data["waiting"]] == ["team-a/a"]
            (a,) = next(g for g in data["groups"] if g["namespace"] == "team-a")["members"]
            assert a["waiting"]["queued"] == 1
            # The 30 s prior less the moment it has waited (the system clock here).
            assert 25.0 <= a["waiting"]["expectedWaitSeconds"] <= 30.0
            assert [g["namespace"] for g in data["groups"]] == ["team-a", "team-b"]
        finally:
            waiting.cancel()


@async_test
async def test_with_api_keys_the_data_needs_a_key_and_shows_only_its_namespaces() -> None:
    keys = ApiKeys.from_entries({"admin": "k-admin", "a": "k-a namespaces=team-a"})
    async with page_proxy(_two_teams(), api_keys=keys) as url, aiohttp.ClientSession() as s:
        # The page is static (no data): a browser opens it, then gives the key.
        assert (await _get(s, f"{url}/ui"))[0] == 200
        status, _, body = await _get(s, f"{url}/status.json")
        assert status == 401, body
        assert (await _get(s, f"{url}/status.json", "k-wrong"))[0] == 401
        status, _, body = await _get(s, f"{url}/status.json", "k-a")
        assert status == 200
        assert [g["namespace"] for g in yaml.safe_load(body)["groups"]] == ["team-a"]
        status, _, body = await _get(s, f"{url}/status.json", "k-admin")
        assert [g["namespace"] for g in yaml.safe_load(body)["groups"]] == ["team-a", "team-b"]


def test_the_documented_bounds_are_the_codes() -> None:
    text = " ".join(DOC.read_text().split())
    assert f"the timeline keeps the last {TIMELINE_LENGTH} swaps" in text
    assert f"with at most {MAX_CONDITIONS} conditions per object" in text


def test_flexinfer_status_json_shows_a_packed_group_s_holders_and_budget(tmp_path: Path) -> None:
    objects = [
        packed_model("chat", "5632Mi", reason="HighestPriority"),
        packed_model("embed", "4Gi"),
        packed_model("coder", "16Gi", state="Queued", packed=False),
    ]
    path = tmp_path / "objects.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    view = load_manifests([str(path)], namespace="ai")
    (recorded,) = status_data(view, now=NOW, policy=DEFAULT_POLICY)["recorded"]
    assert (recorded["holder"], recorded["active"], recorded["packed"]) == (
        "chat", ["chat", "embed"], True
    )  # fmt: skip
    assert recorded["vram"] == {"budget": "24Gi", "used": "9728Mi"}
    assert [m["footprint"] for m in recorded["members"]] == ["5632Mi", "4Gi", "16Gi"]
