"""Where each model lives and whether it can serve: the `ModelDirectory` seam.

The HTTP layer asks a directory for a `ModelEntry` by the name a client puts in
the request's `model` field and subscribes to changes (to drain a queue when its
model turns Ready). `InMemoryDirectory` is the directory tests and static setups
use; `flexinfer_proxy.kube_directory` fills the same view from the cluster. This
module performs no I/O and reads no clock.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Protocol

import attrs

Listener = Callable[[str], None]

DEFAULT_COLD_START_TIMEOUT = timedelta(seconds=60)


class ModelKind(enum.Enum):
    """Which resource a name resolves to; it decides where demand is written."""

    MODEL = "Model"
    MODEL_DEPLOYMENT = "ModelDeployment"


@attrs.frozen
class ModelEntry:
    """One routable model: enough to forward a request and to signal demand for it.

    `endpoint` is the base URL of the backend's OpenAI API, ending in `/v1`.
    `gpu_group` is the GPUGroup a ModelDeployment belongs to (None otherwise).
    """

    name: str
    namespace: str
    kind: ModelKind
    ready: bool
    endpoint: str
    phase: str = ""
    cold_start_timeout: timedelta = DEFAULT_COLD_START_TIMEOUT
    gpu_group: str | None = None
    created: int = 0

    @property
    def reports_queue(self) -> bool:
        """GPUGroup members signal demand as queue reports, not as a timestamp."""
        return self.kind is ModelKind.MODEL_DEPLOYMENT and bool(self.gpu_group)


class ModelDirectory(Protocol):
    """A read view of the routable models, kept current by whoever implements it."""

    @property
    def synced(self) -> bool:
        """True once the view is complete enough to route (initial lists done)."""
        ...

    def lookup(self, name: str) -> ModelEntry | None: ...

    def entries(self) -> Sequence[ModelEntry]: ...

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(name)` on the event loop whenever `name`'s entry changes."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class InMemoryDirectory:
    """A directory whose entries are set by its owner (tests, static configuration).

    `put` and `remove` must be called on the event loop's thread: listeners run
    synchronously inside them.
    """

    def __init__(self, entries: Iterable[ModelEntry] = ()) -> None:
        self._entries: dict[str, ModelEntry] = {e.name: e for e in entries}
        self._listeners: list[Listener] = []

    @property
    def synced(self) -> bool:
        return True

    def lookup(self, name: str) -> ModelEntry | None:
        return self._entries.get(name)

    def entries(self) -> Sequence[ModelEntry]:
        return sorted(self._entries.values(), key=lambda e: e.name)

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def put(self, entry: ModelEntry) -> None:
        self._entries[entry.name] = entry
        self._notify(entry.name)

    def set_ready(self, name: str, ready: bool = True) -> None:
        entry = self._entries[name]
        self.put(attrs.evolve(entry, ready=ready, phase="Ready" if ready else "Idle"))

    def remove(self, name: str) -> None:
        if self._entries.pop(name, None) is not None:
            self._notify(name)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def _notify(self, name: str) -> None:
        for listener in list(self._listeners):
            listener(name)
