"""`flexinfer nodes label` and doctor's gpu-node-label check on the local control plane:
a GPU node without the vendor label the manifests select on is found, a dry run changes
nothing, `--apply` labels it from its capacity, a label naming another vendor stays."""

# The fixtures come from tests/k8s/harness; test parameters name them again on purpose.
# ruff: noqa: F811

from __future__ import annotations

import json
from typing import Any

import pytest

from flexinfer_cli.__main__ import main
from flexinfer_devcluster.localcluster import KwokNode
from flexinfer_kube.resources import MODELS, NODES
from tests.cli.test_doctor import doctor, findings
from tests.k8s.harness import (  # noqa: F401  (fixtures)
    Cluster,
    cluster,
    crds,
    kubectl,
    model_body,
)

pytestmark = pytest.mark.k8s

LABEL = "flexinfer.ai/gpu.vendor"


def label_nodes(c: Cluster, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["nodes", "label", "--kubeconfig", str(c.local.kubeconfig), "-o", "json",
                 *args]) == 0
    return dict(json.loads(capsys.readouterr().out))


def node_label(c: Cluster, name: str) -> str | None:
    return (c.api.get(NODES, "", name)["metadata"].get("labels") or {}).get(LABEL)


def test_gpu_nodes_are_found_and_labelled_from_their_capacity(
    local_cluster: Any, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cluster
    bare, other = f"bare-{c.namespace}", f"other-{c.namespace}"
    local_cluster.add_node(KwokNode(name=bare, gpus=1))
    local_cluster.add_node(KwokNode(name=other, gpus=1, labels={LABEL: "NVIDIA"}))
    try:
        # The docs' "any AMD GPU node" selector, which matches no node yet.
        model = model_body("m")
        model["spec"]["nodeSelector"] = {LABEL: "AMD"}
        c.api.create(MODELS, c.namespace, model)
        code, data = doctor(c, capsys)
        found = {f["object"]: f for f in findings(data, "gpu-node-label")}
        assert code == 1
        assert found[f"node/{bare}"]["severity"] == "fail"
        assert "model/m select on it" in found[f"node/{bare}"]["message"]
        assert found[f"node/{bare}"]["fix"].startswith("flexinfer nodes label --apply")
        assert f"{LABEL}=NVIDIA" in found[f"node/{other}"]["message"]

        dry = {r["node"]: r for r in label_nodes(c, capsys)["nodes"]}
        assert dry[bare]["action"] == "would label" and dry[bare]["wanted"] == "AMD"
        assert node_label(c, bare) is None  # a dry run writes nothing

        applied = {r["node"]: r for r in label_nodes(c, capsys, "--apply")["nodes"]}
        assert applied[bare]["action"] == "labelled"
        assert node_label(c, bare) == "AMD"
        assert applied[other]["action"].startswith("left")
        assert node_label(c, other) == "NVIDIA"  # another vendor's label is not replaced

        code, data = doctor(c, capsys)
        objects = {f["object"] for f in findings(data, "gpu-node-label")}
        assert f"node/{bare}" not in objects and f"node/{other}" in objects
        label_nodes(c, capsys, "--apply", "--overwrite")
        assert node_label(c, other) == "AMD"
    finally:
        for name in (bare, other):
            c.api.delete(NODES, "", name)
