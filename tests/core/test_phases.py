"""The phase the controller reports for a ModelDeployment, from its pods."""

from __future__ import annotations

import pytest

from flexinfer_core import DeploymentPhase, model_deployment_phase


@pytest.mark.parametrize(
    ("replicas", "ready_pods", "phase", "message"),
    [
        (1, 1, DeploymentPhase.RUNNING, "1 pod(s) ready"),
        (0, 2, DeploymentPhase.RUNNING, "2 pod(s) ready"),  # scaled down, pods not gone yet
        (2, 0, DeploymentPhase.PENDING, "waiting for its pods to be ready"),
        (0, 0, DeploymentPhase.IDLE, "scaled to zero"),
        (None, 0, DeploymentPhase.IDLE, "scaled to zero"),  # no Deployment yet
    ],
)
def test_model_deployment_phase(
    replicas: int | None, ready_pods: int, phase: DeploymentPhase, message: str
) -> None:
    observed = model_deployment_phase(replicas=replicas, ready_pods=ready_pods)
    assert (observed.phase, observed.message, observed.ready_replicas) == (
        phase,
        message,
        ready_pods,
    )
