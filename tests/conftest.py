"""Fixtures shared by every integration suite.

`local_cluster` is one real control plane (etcd, kube-apiserver, controller manager,
scheduler, kwok) for the whole session; see `flexinfer_devcluster.localcluster`. The binaries
must already be built (`make test` runs `python -m flexinfer_devcluster.assets` first): a
missing build fails the test with the command to run instead of compiling for minutes
inside a test timeout.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flexinfer_devcluster.assets import AssetsError, ensure_assets
from flexinfer_devcluster.localcluster import LocalCluster


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
