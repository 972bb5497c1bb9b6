"""Workloads that kwok can run for a Model: a Deployment and a Service named like it.

Until the controller renders real backends, a Model's workload is a Deployment and
a Service with the Model's name (the controller's convention, docs/controller.md).
These builders make ones that the local control plane's kwok nodes run: the pod
asks for `amd.com/gpu`, lands on a kwok node, and becomes Ready after
`load_time` (the simulated model load). Used by the demo and the tests; the
controller itself never creates them.
"""

from __future__ import annotations

from typing import Any

from flexinfer_devcluster.localcluster import (
    GPU_RESOURCE,
    KWOK_NODE_LABEL,
    KWOK_NODE_LABEL_VALUE,
    READY_DELAY_ANNOTATION,
    TERMINATE_DELAY_ANNOTATION,
)

JSON = dict[str, Any]
SERVING_PORT = 8000


def kwok_deployment(
    name: str, *, replicas: int = 0, load_time: str = "1s", terminate_time: str = "1s"
) -> JSON:
    """A Deployment whose pods take `load_time` to be Ready and `terminate_time` to go."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            # Recreate: a restart never runs two pods of one model on one card.
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": {
                    "labels": {"app": name, "flexinfer.test/workload": "yes"},
                    "annotations": {
                        READY_DELAY_ANNOTATION: load_time,
                        TERMINATE_DELAY_ANNOTATION: terminate_time,
                    },
                },
                "spec": {
                    "nodeSelector": {KWOK_NODE_LABEL: KWOK_NODE_LABEL_VALUE},
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {
                            "name": "server",
                            "image": "flexinfer/fake-server:test",
                            "ports": [{"containerPort": SERVING_PORT}],
                            "resources": {
                                "limits": {GPU_RESOURCE: "1"},
                                "requests": {GPU_RESOURCE: "1"},
                            },
                        }
                    ],
                },
            },
        },
    }


def kwok_service(name: str) -> JSON:
    """The Service in front of the Model's pods (OpenAI API on port 8000)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "selector": {"app": name},
            "ports": [{"port": SERVING_PORT, "targetPort": SERVING_PORT}],
        },
    }
