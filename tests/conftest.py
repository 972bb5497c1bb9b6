"""Fixtures shared by every integration suite.

`local_cluster` is one real control plane (etcd, kube-apiserver, controller manager,
scheduler, kwok) for the whole session; see `flexinfer_devcluster.localcluster`. The binaries
must already be built (`make test` runs `python -m flexinfer_devcluster.assets` first): a
missing build fails the test with the command to run instead of compiling for minutes
inside a test timeout. The same holds for `llama_server` (the cached `llama-server` that
the process node runs) and `ollama` (the cached `ollama`, `make test` builds it);
`tiny_model` is a freshly generated random-weight GGUF.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flexinfer_devcluster.assets import (
    AssetsError,
    ensure_assets,
    ensure_llama_server,
    ensure_ollama,
)
from flexinfer_devcluster.localcluster import LocalCluster
from flexinfer_devcluster.tinymodel import write_tiny_model
from flexinfer_kube.kubeapi import KubeApi, new_api_client


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    try:
        assets = ensure_assets(build=False)
    except AssetsError as error:
        pytest.fail(f"control-plane binaries are missing: {error}", pytrace=False)
    cluster = LocalCluster(assets_dir=assets, name="flexinfer-test", audit=True)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _cached(ensure: Callable[..., Path], what: str) -> Path:
    try:
        return ensure(build=False)
    except AssetsError as error:
        pytest.fail(f"{what} is missing: {error}", pytrace=False)


@pytest.fixture(scope="session")
def llama_server() -> Path:
    return _cached(ensure_llama_server, "llama-server")


@pytest.fixture(scope="session")
def ollama() -> Path:
    return _cached(ensure_ollama, "ollama")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight llama GGUF (seed 0), written once per session."""
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny.gguf", seed=0)


@pytest.fixture
def api(local_cluster: LocalCluster) -> Iterator[KubeApi]:
    """A client of the local cluster as a test's own (User-Agent `flexinfer-test`); a
    module may define its own `api`, which wins."""
    api_client = new_api_client(str(local_cluster.kubeconfig), user_agent="flexinfer-test")
    yield KubeApi(api_client)
    api_client.close()
