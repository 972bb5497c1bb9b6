"""Leader election between controller replicas, with a coordination.k8s.io Lease.

Uses the kubernetes client's own `kubernetes.leaderelection` with its `LeaseLock`
(present in the installed client, 37.x); nothing here re-implements the protocol.
The lock gets its own ApiClient so lease renewals are not counted as the
controller's writes. When leadership is lost the process must stop acting at
once: `__main__` exits (as client-go's controllers do) and the Deployment restarts
it as a standby.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

log = logging.getLogger("flexinfer.leader")


def run_leader_election(
    api_client: Any,
    *,
    name: str,
    namespace: str,
    identity: str,
    on_started: Callable[[], None],
    on_stopped: Callable[[], None],
    lease_duration: int = 15,
    renew_deadline: int = 10,
    retry_period: int = 2,
) -> threading.Thread:
    """Campaign in a daemon thread; `on_started` runs (in its own thread) once leading."""
    lock_type: Any = LeaseLock
    config_type: Any = electionconfig.Config
    election_type: Any = leaderelection.LeaderElection
    lock = lock_type(name, namespace, identity)
    lock.api_instance = k8s_client.CoordinationV1Api(api_client)
    config = config_type(
        lock,
        lease_duration=lease_duration,
        renew_deadline=renew_deadline,
        retry_period=retry_period,
        onstarted_leading=on_started,
        onstopped_leading=on_stopped,
    )
    election = election_type(config)

    def campaign() -> None:
        log.info(
            "campaigning for leadership",
            extra={"fields": {"lease": f"{namespace}/{name}", "identity": identity}},
        )
        election.run()

    thread = threading.Thread(target=campaign, name="leader-election", daemon=True)
    thread.start()
    return thread
