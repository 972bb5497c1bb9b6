"""kubectl against the local control plane, as a user (or a ServiceAccount) runs it.

Tests of the manifests drive the API server through kubectl on purpose: the
messages and tables they assert are exactly what a person sees.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import yaml

from flexinfer_devcluster.assets import ensure_assets
from flexinfer_devcluster.localcluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "crds"
DEPLOY_DIR = ROOT / "deploy"


class KubectlError(AssertionError):
    """A kubectl command that had to succeed failed; carries its stderr."""


class Kubectl:
    def __init__(self, binary: Path | str, kubeconfig: Path | str) -> None:
        self.binary = str(binary)
        self.kubeconfig = str(kubeconfig)

    def run(
        self, *args: str, stdin: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def ok(self, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
        result = self.run(*args, stdin=stdin, timeout=timeout)
        if result.returncode != 0:
            raise KubectlError(f"kubectl {' '.join(args)} failed:\n{result.stderr}")
        return result.stdout

    def json(self, *args: str) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.ok(*args, "-o", "json"))
        return value

    def patch_status(
        self, namespace: str, resource: str, patch: dict[str, Any], *, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        args = ("patch", "-n", namespace, resource, "--subresource=status", "--type=merge")
        result = self.run(*args, "-p", json.dumps(patch))
        if check and result.returncode != 0:
            raise KubectlError(f"status patch of {resource} failed:\n{result.stderr}")
        return result

    def as_token(self, token: str, directory: Path) -> Kubectl:
        """The same cluster, authenticated only by a bearer token (no client cert)."""
        with open(self.kubeconfig, encoding="utf-8") as stream:
            admin = yaml.safe_load(stream)
        contexts = {c["name"]: c["context"] for c in admin["contexts"]}
        cluster_name = contexts[admin["current-context"]]["cluster"]
        (cluster,) = [c for c in admin["clusters"] if c["name"] == cluster_name]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cluster],
            "users": [{"name": "token", "user": {"token": token}}],
            "contexts": [{"name": "token", "context": {"cluster": cluster_name, "user": "token"}}],
            "current-context": "token",
        }
        path = directory / f"kubeconfig-{uuid.uuid4().hex[:8]}"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        path.chmod(0o600)
        return Kubectl(self.binary, path)


CRD_NAMES = (
    "models.ai.flexinfer",
    "gpuleases.ai.flexinfer",
    "gpugroups.ai.flexinfer",
    "modelcaches.ai.flexinfer",
    "modeldeployments.ai.flexinfer",
)


def install_crds(cluster: LocalCluster) -> None:
    """Apply crds/ (idempotent) and wait until every CRD is Established."""
    assert sorted(cluster.install_crds(CRD_DIR)) == sorted(CRD_NAMES)


POD_SECURITY = "pod-security.kubernetes.io"


def create_namespace(kubectl: Kubectl, prefix: str, *, pod_security: str = "baseline") -> str:
    """A fresh namespace that enforces Pod Security `pod_security` and warns about and
    audits what "restricted" would refuse, as docs/security.md asks of an administrator:
    every pod flexinfer renders must be admitted there."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    kubectl.ok("create", "namespace", name)
    set_pod_security(kubectl, name, pod_security)
    return name


def set_pod_security(kubectl: Kubectl, namespace: str, level: str) -> None:
    kubectl.ok(
        "label", "--overwrite", "namespace", namespace,
        f"{POD_SECURITY}/enforce={level}", f"{POD_SECURITY}/warn=restricted",
        f"{POD_SECURITY}/audit=restricted",
    )  # fmt: skip


def delete_namespace(kubectl: Kubectl, name: str) -> None:
    kubectl.run("delete", "namespace", name, "--wait=false")


def kubectl_for(cluster: LocalCluster) -> Kubectl:
    """Admin kubectl from the cluster's assets (the version the cluster was built from)."""
    return Kubectl(ensure_assets(build=False, log=False) / "kubectl", cluster.kubeconfig)
