"""The phase the controller reports for a ModelDeployment, from its pods."""

from __future__ import annotations

import pytest

from flexinfer_core import (
    DeploymentPhase,
    Phase,
    ServerFailure,
    model_deployment_phase,
    observed_phase,
)


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


def test_a_failing_server_is_failed_with_its_own_words_until_a_pod_is_ready() -> None:
    failure = ServerFailure(
        "server", restarts=3, exit_code=1, reason="Error", message="error: bad\n  flag"
    )
    observed = model_deployment_phase(replicas=1, ready_pods=0, failure=failure)
    assert observed.phase is DeploymentPhase.FAILED
    assert observed.message == (
        "container server keeps restarting (last termination: exit code 1, Error): error: bad flag"
    )
    assert model_deployment_phase(replicas=1, ready_pods=1, failure=failure).phase is (
        DeploymentPhase.RUNNING
    )
    assert model_deployment_phase(replicas=0, ready_pods=0, failure=failure).phase is (
        DeploymentPhase.IDLE
    )
    for phase in (Phase.IDLE, Phase.LOADING, Phase.READY):
        assert observed_phase(phase, replicas=1, pods=1, ready_pods=0, failure=failure) is (
            Phase.FAILED
        )
    assert observed_phase(Phase.FAILED, replicas=1, pods=1, ready_pods=1, failure=failure) is (
        Phase.READY
    )


def test_a_long_termination_message_keeps_its_end() -> None:
    failure = ServerFailure("server", message="x" * 5000 + " the reason")
    text = failure.describe()
    assert text.endswith("the reason")
    assert len(text) < 1200
