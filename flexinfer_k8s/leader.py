"""Leader election between controller replicas, with a coordination.k8s.io Lease.

Uses the kubernetes client's own `kubernetes.leaderelection` with its `LeaseLock`;
nothing here re-implements the protocol. Three guards sit around it, because the
client's loop trusts more than it should:

- An attempt that fails with anything (urllib3's `MaxRetryError` during an API-server
  outage, a timeout, a parse error) is a failed attempt, not a dead thread: the
  client only catches `ApiException`, and a dead election thread used to leave a
  replica reconciling with a frozen `renewTime` beside the next leader.
- `Leadership` remembers the last successful renew on the monotonic clock. Every
  write the controller sends is fenced by it (`KubeApi(write_guard=...)`): once the
  renew deadline has passed since that renew, the write is refused and the process
  exits, as client-go's controllers do. A leader paused (SIGSTOP) past its lease
  therefore never acts on what it decided before the pause.
- The election thread ending for any reason, or leadership going stale with the
  thread stuck, ends the process too; `/healthz` fails once the thread is gone.

The lock gets its own ApiClient so lease renewals are not counted as the
controller's writes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from flexinfer_kube.kubeapi import NotLeading

log = logging.getLogger("flexinfer.leader")

Monotonic = Callable[[], float]


class Leadership:
    """This replica's own view of its leadership, measured on the monotonic clock.

    `renewed(at)` records a successful acquire or renew that began at `at`; leadership
    is *fresh* for `renew_deadline` seconds after it. `on_lost` runs once, the first
    time a write is refused or the watchdog finds leadership stale.
    """

    def __init__(
        self,
        *,
        renew_deadline: float,
        on_lost: Callable[[str], None],
        monotonic: Monotonic = time.monotonic,
    ) -> None:
        self.renew_deadline = renew_deadline
        self._on_lost = on_lost
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._renewed_at: float | None = None
        self._lost = False
        self.thread: threading.Thread | None = None

    def renewed(self, at: float) -> None:
        with self._lock:
            if self._renewed_at is None or at > self._renewed_at:
                self._renewed_at = at

    @property
    def leading(self) -> bool:
        with self._lock:
            return self._renewed_at is not None

    def staleness(self) -> float | None:
        """Seconds past the renew deadline (> 0: stale), None before ever leading."""
        with self._lock:
            if self._renewed_at is None:
                return None
            return self._monotonic() - self._renewed_at - self.renew_deadline

    def fresh(self) -> bool:
        late = self.staleness()
        return late is not None and late < 0

    def guard_write(self, method: str, path: str) -> None:
        """Refuse a write unless leadership is fresh (wired as `KubeApi.write_guard`)."""
        if self.fresh():
            return
        why = (
            "not leading yet"
            if not self.leading
            else f"no successful lease renew for more than {self.renew_deadline:g}s"
        )
        self.lose(why)
        raise NotLeading(0, f"refusing {method} {path}: {why}")

    def lose(self, why: str) -> None:
        with self._lock:
            if self._lost:
                return
            self._lost = True
        self._on_lost(why)

    def healthy(self) -> tuple[bool, str]:
        thread = self.thread
        if thread is not None and not thread.is_alive():
            return False, "leader election thread stopped"
        late = self.staleness()
        if late is not None and late >= 0:
            return False, f"leadership stale for {late:.1f}s"
        return True, "ok"

    def watch(self, *, interval: float) -> threading.Thread:
        """A watchdog: leadership that goes stale while nothing writes still ends it."""

        def run() -> None:
            while True:
                time.sleep(interval)
                late = self.staleness()
                if late is not None and late >= 0:
                    self.lose(f"no successful lease renew for more than {self.renew_deadline:g}s")
                    return

        thread = threading.Thread(target=run, name="leader-watchdog", daemon=True)
        thread.start()
        return thread


class _TimedCoordinationApi(k8s_client.CoordinationV1Api):
    """The Lease calls with a deadline: a hung request must not outlast the renew deadline."""

    def __init__(self, api_client: Any, *, timeout: float) -> None:
        super().__init__(api_client)
        self._timeout = timeout

    def read_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", self._timeout)
        return super().read_namespaced_lease(*args, **kwargs)

    def create_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", self._timeout)
        return super().create_namespaced_lease(*args, **kwargs)

    def replace_namespaced_lease(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", self._timeout)
        return super().replace_namespaced_lease(*args, **kwargs)


_LeaderElection: Any = leaderelection.LeaderElection


class _FencedElection(_LeaderElection):  # type: ignore[misc]
    """The client's election, with every attempt's outcome reported to `Leadership`."""

    def __init__(self, config: Any, leadership: Leadership, monotonic: Monotonic) -> None:
        super().__init__(config)
        self._leadership = leadership
        self._monotonic = monotonic
        self._failing = False

    def try_acquire_or_renew(self) -> bool:
        began = self._monotonic()
        try:
            succeeded = bool(super().try_acquire_or_renew())
        except Exception as error:
            # The client catches only ApiException; anything else would kill the thread.
            if not self._failing:
                log.warning(
                    "lease attempt failed; retrying",
                    extra={"fields": {"error": f"{type(error).__name__}: {error}"}},
                )
            self._failing = True
            return False
        if self._failing and succeeded:
            log.info("lease attempts succeed again")
            self._failing = False
        if succeeded:
            self._leadership.renewed(began)
        return succeeded


def run_leader_election(
    api_client: Any,
    *,
    name: str,
    namespace: str,
    identity: str,
    leadership: Leadership,
    on_started: Callable[[], None],
    lease_duration: int = 15,
    renew_deadline: int = 10,
    retry_period: int = 2,
    monotonic: Monotonic = time.monotonic,
) -> threading.Thread:
    """Campaign in a daemon thread; `on_started` runs (in its own thread) once leading.

    However the campaign ends (renew deadline missed, an exception), `leadership.lose`
    runs; the caller's `on_lost` must stop the process.
    """
    lock_type: Any = LeaseLock
    config_type: Any = electionconfig.Config
    lock = lock_type(name, namespace, identity)
    lock.api_instance = _TimedCoordinationApi(api_client, timeout=max(1.0, renew_deadline / 2))

    def stopped() -> None:
        leadership.lose("the lease could not be renewed within the renew deadline")

    config = config_type(
        lock,
        lease_duration=lease_duration,
        renew_deadline=renew_deadline,
        retry_period=retry_period,
        onstarted_leading=on_started,
        onstopped_leading=stopped,
    )
    election = _FencedElection(config, leadership, monotonic)

    def campaign() -> None:
        log.info(
            "campaigning for leadership",
            extra={"fields": {"lease": f"{namespace}/{name}", "identity": identity}},
        )
        try:
            election.run()
        except BaseException as error:  # any end of the loop ends leading
            leadership.lose(f"leader election failed: {type(error).__name__}: {error}")
            raise
        # run() returns only after onstopped_leading; make sure it counted.
        leadership.lose("leader election ended")

    thread = threading.Thread(target=campaign, name="leader-election", daemon=True)
    leadership.thread = thread
    thread.start()
    leadership.watch(interval=max(0.2, min(1.0, retry_period / 2)))
    return thread
