"""Fixtures of the proxy tests: backend processes, and a namespace on the local cluster.

The backends (two fake OpenAI servers) live for the session. `kubectl` and
`namespace` start the local control plane only for the tests that ask for them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flexinfer_devcluster.localcluster import LocalCluster

from ..k8s.kubectl import (
    Kubectl,
    create_namespace,
    delete_namespace,
    install_crds,
    kubectl_for,
)
from .harness import BackendProcess


@pytest.fixture(scope="session")
def backends() -> Iterator[dict[str, BackendProcess]]:
    started = {name: BackendProcess(name) for name in ("alpha", "beta")}
    try:
        yield started
    finally:
        for backend in started.values():
            backend.stop()


@pytest.fixture(scope="module")
def kubectl(local_cluster: LocalCluster) -> Kubectl:
    return kubectl_for(local_cluster)


@pytest.fixture(scope="module")
def namespace(local_cluster: LocalCluster, kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace per test module, with the CRDs installed."""
    install_crds(local_cluster)
    name = create_namespace(kubectl, "proxy")
    yield name
    delete_namespace(kubectl, name)
