"""The NetworkPolicy of one Model or ModelDeployment: only the proxy reaches its port.

A backend serves unauthenticated on port 8000 (and Ollama's API can pull, create and
delete models there). Without a policy every pod of the cluster could reach it past the
proxy's API keys and queues. So each rendered workload gets a NetworkPolicy named like
it, selecting its pods (the Service's selector) and admitting ingress on port 8000
only from the administrator's `backendIngressFrom` peers (default: the proxy's pods in
`flexinfer-system`). Kubelet probes come from the node and are not subject to it on
the usual CNIs. Egress is left alone (a server may fetch its model). It takes effect
only where the cluster's network plugin enforces NetworkPolicy. Pure.
"""

from __future__ import annotations

from flexinfer_k8s.render.backend import PORT
from flexinfer_k8s.render.policy import AdminPolicy
from flexinfer_kube.objects import JSON


def network_policy(
    *, name: str, namespace: str, labels: JSON, selector: JSON, owner: JSON, policy: AdminPolicy
) -> JSON:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels),
            "ownerReferences": [owner],
        },
        "spec": {
            "podSelector": {"matchLabels": dict(selector)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [dict(peer) for peer in policy.backend_ingress_from],
                    "ports": [{"protocol": "TCP", "port": PORT}],
                }
            ],
        },
    }
