"""The proxy's live page: `GET /ui` (one HTML file) and `GET /status.json` (what it polls).

Per group (a shared group of Models, or a GPUGroup): who holds the card and why, each
member's phase, state and conditions, exactly as the controller wrote them in status
(`flexinfer_kube.recorded_status`, the shaping `flexinfer status -o json` shares),
with this proxy's own queues beside each member (requests waiting and the oldest
wait); every model with requests waiting; and the last swaps on a timeline.

Swaps are what this proxy saw: the holders of each group, read from the objects it
already watches (no Events, no extra permission), compared at each change the
directory reports and at each `/status.json`; a new holder, or for a packed group
(docs/election.md 1.7) a new set of holders, is one timeline entry (`at` is when the
proxy saw it). A reading with two `Active` members that is not a packed one (between
the two status writes of a swap) is skipped. The first holders seen of a group after
the proxy starts are not a swap: they are where the group's strip on the page begins
(its `observedSince`).

Bounds: the timeline keeps the last `TIMELINE_LENGTH` swaps over all groups (a
ring: the oldest goes first); the JSON lists each group and model the directory
holds once, with at most `recorded_status.MAX_CONDITIONS` conditions per object,
and queues as counts (never one entry per request): nothing a client sends makes
it grow. With API keys the JSON shows only the namespaces the key reaches (the
page itself is static and carries no data).

The page is `live_page.html` beside this module (package data: plain HTML, CSS and
JavaScript, no build step, nothing fetched from elsewhere). This module does no
I/O but reading that file once, and writes nothing to the cluster.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Sequence
from importlib import resources
from typing import Any, Protocol, runtime_checkable

import attrs

from flexinfer_core.timestamps import format_rfc3339
from flexinfer_kube.clock import Clock
from flexinfer_kube.objects import JSON
from flexinfer_kube.recorded_status import recorded_groups
from flexinfer_proxy.directory import ModelDirectory
from flexinfer_proxy.queues import RequestQueues

PAGE_PATH = "/ui"
STATUS_PATH = "/status.json"
# Swaps kept over all groups: about an afternoon of a busy homelab's swaps, a few KiB.
TIMELINE_LENGTH = 100
# A burst of directory changes (a resync lists every model) is read once, this late.
OBSERVE_DELAY_SECONDS = 0.2


@attrs.frozen
class RecordedObjects:
    """The Models, ModelDeployments and GPUGroups as the directory last saw them."""

    models: Sequence[JSON] = ()
    model_deployments: Sequence[JSON] = ()
    gpu_groups: Sequence[JSON] = ()


@runtime_checkable
class RecordsStatus(Protocol):
    """A directory that keeps the objects it reads (the cluster's does; a static one has
    no status: its page shows queues only)."""

    def recorded_objects(self) -> RecordedObjects: ...


@attrs.frozen
class Swap:
    at: str
    kind: str
    namespace: str
    group: str
    previous: str | None
    holder: str | None
    # Every holder before and after, the leader first: several in a packed group.
    previous_holders: tuple[str, ...] = ()
    holders: tuple[str, ...] = ()

    def as_json(self) -> JSON:
        return {
            "at": self.at,
            "kind": self.kind,
            "namespace": self.namespace,
            "group": self.group,
            "from": self.previous,
            "to": self.holder,
            "fromHolders": list(self.previous_holders),
            "toHolders": list(self.holders),
        }


class LivePage:
    """The page's data: recorded groups, this proxy's queues, and the swaps it saw."""

    def __init__(
        self,
        directory: ModelDirectory,
        queues: RequestQueues,
        *,
        clock: Clock,
        timeline_length: int = TIMELINE_LENGTH,
    ) -> None:
        if timeline_length < 1:
            raise ValueError(f"timeline_length must be at least 1, not {timeline_length}")
        self._directory = directory
        self._queues = queues
        self._clock = clock
        self.timeline: deque[Swap] = deque(maxlen=timeline_length)
        # Per group: (holder, every holder), as last read.
        self._holders: dict[tuple[str, str, str], tuple[str | None, tuple[str, ...]]] = {}
        self._since: dict[tuple[str, str, str], str] = {}  # when each group was first seen
        self._scheduled: asyncio.TimerHandle | None = None
        directory.subscribe(self._changed)

    # -- following holders ---------------------------------------------------------

    def _changed(self, key: str) -> None:
        if self._scheduled is not None or not isinstance(self._directory, RecordsStatus):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.groups()
            return
        self._scheduled = loop.call_later(OBSERVE_DELAY_SECONDS, self._observe_now)

    def _observe_now(self) -> None:
        self._scheduled = None
        self.groups()

    def close(self) -> None:
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None

    def groups(self) -> list[JSON]:
        """The recorded groups now; a holder that changed since last read is a swap."""
        if not isinstance(self._directory, RecordsStatus):
            return []
        objects = self._directory.recorded_objects()
        groups = recorded_groups(
            models=objects.models,
            gpu_groups=objects.gpu_groups,
            model_deployments=objects.model_deployments,
        )
        self._observe(groups)
        return groups

    def _observe(self, groups: list[JSON]) -> None:
        at = format_rfc3339(self._clock.now())
        seen = set()
        for group in groups:
            key = (group["kind"], group["namespace"], group["name"])
            seen.add(key)
            group["observedSince"] = self._since.setdefault(key, at)
            if len(group["active"]) > 1 and not group["packed"]:
                continue  # between the two status writes of a swap
            holding = (group["holder"], tuple(group["active"]))
            if key not in self._holders:
                self._holders[key] = holding
                continue
            previous = self._holders[key]
            if previous == holding:
                continue
            self._holders[key] = holding
            self.timeline.append(
                Swap(
                    at,
                    *key,
                    previous=previous[0],
                    holder=holding[0],
                    previous_holders=previous[1],
                    holders=holding[1],
                )
            )
        for gone in set(self._since) - seen:
            del self._since[gone]
            self._holders.pop(gone, None)

    # -- the JSON ------------------------------------------------------------------

    def status(self, *, reachable: frozenset[str] | None = None) -> JSON:
        """`/status.json`: only the namespaces in `reachable` (None: all)."""

        def shown(namespace: str) -> bool:
            return reachable is None or namespace in reachable

        groups = [g for g in self.groups() if shown(g["namespace"])]
        for group in groups:
            for member in group["members"]:
                member["waiting"] = self._waiting(f"{group['namespace']}/{member['name']}")
        waiting = [
            {"model": entry.key, "namespace": entry.namespace, "name": entry.name}
            | self._waiting(entry.key)
            for entry in self._directory.entries()
            if shown(entry.namespace) and self._queues.depth(entry.key)
        ]
        return {
            "at": format_rfc3339(self._clock.now()),
            "groups": groups,
            "waiting": waiting,
            "timeline": [s.as_json() for s in self.timeline if shown(s.namespace)],
            "timelineLength": self.timeline.maxlen,
        }

    def _waiting(self, key: str) -> dict[str, Any]:
        depth = self._queues.depth(key)
        oldest = round(self._queues.oldest_wait(key), 1) if depth else 0.0
        # What a request joining now would be told (x-flexinfer-wait-seconds).
        expected = round(self._queues.estimate_wait(key), 1) if depth else 0.0
        return {"queued": depth, "oldestWaitSeconds": oldest, "expectedWaitSeconds": expected}


@functools.cache
def page_html() -> bytes:
    """The page, read from the package once."""
    return resources.files("flexinfer_proxy").joinpath("live_page.html").read_bytes()
