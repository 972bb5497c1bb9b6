"""The phases the controller reports for Models and ModelDeployments, from their workloads.

- A Model's phase (docs/election.md 1): from its Deployment's replicas and pods.
- A ModelDeployment's phase (docs/resources.md): Running once a pod is ready,
  Pending while its pods start, Idle at zero replicas.
- Both are `Failed` while no pod is ready and a server is failing (`ServerFailure`): its
  container restarted (a crash, a liveness or startup probe kill: a CrashLoopBackOff), or
  the pod itself failed. The failure says the container's last termination in its own
  words, so a server that rejects a flag is read as Failed with that message, not as
  Loading until the cold-start timeout.

Observations in, phase values out: no clock, no I/O, no Kubernetes JSON (the
adapter counts the pods and reads their container statuses).
"""

from __future__ import annotations

import enum

import attrs

from flexinfer_core.snapshot import Phase, ServerFailure


def observed_phase(
    current: Phase,
    *,
    replicas: int,
    pods: int,
    ready_pods: int,
    failed: bool = False,
    failure: ServerFailure | None = None,
) -> Phase:
    """A member's phase from its workload, as the adapter observes it.

    A member scaled to zero keeps `Preempted` (its terminating pods may still be
    Ready, and must not make it look Ready again, which would preempt it twice);
    otherwise zero replicas is `Idle`. Scaled up: Ready once a pod is ready, Failed
    while none is and a server is failing (`failure`), Loading while pods start,
    Pending before any exists. `failed`: every pod has failed, whatever the replicas.
    A member recorded `Draining` stays so while it is scaled up and a pod is ready
    (docs/election.md 1.6: the decision ends the drain, not the pods).
    """
    if failed:
        return Phase.FAILED
    if replicas <= 0:
        return Phase.PREEMPTED if current is Phase.PREEMPTED else Phase.IDLE
    if ready_pods > 0:
        return Phase.DRAINING if current is Phase.DRAINING else Phase.READY
    if failure is not None:
        return Phase.FAILED
    if pods > 0:
        return Phase.LOADING
    return Phase.PENDING


class DeploymentPhase(enum.StrEnum):
    """`ModelDeployment.status.phase`."""

    PENDING = "Pending"
    RUNNING = "Running"
    IDLE = "Idle"
    FAILED = "Failed"
    # A GPUGroup member that lost the card and finishes its requests in flight
    # (docs/election.md 1.6); the group's decision says so, not its pods.
    DRAINING = "Draining"


@attrs.frozen
class DeploymentObservation:
    """A ModelDeployment's observed phase, with the message and ready count to report."""

    phase: DeploymentPhase
    message: str
    ready_replicas: int


def model_deployment_phase(
    *, replicas: int | None, ready_pods: int, failure: ServerFailure | None = None
) -> DeploymentObservation:
    """Running once a pod is ready, Failed while none is and a server is failing,
    Pending while its pods start, Idle at zero replicas.

    `ready_pods` counts ready pods that are not terminating; `replicas` is the
    Deployment's (None: there is none).
    """
    if ready_pods:
        phase, message = DeploymentPhase.RUNNING, f"{ready_pods} pod(s) ready"
    elif replicas and failure is not None:
        phase, message = DeploymentPhase.FAILED, failure.describe()
    elif replicas:
        phase, message = DeploymentPhase.PENDING, "waiting for its pods to be ready"
    else:
        phase, message = DeploymentPhase.IDLE, "scaled to zero"
    return DeploymentObservation(phase=phase, message=message, ready_replicas=ready_pods)
