"""The one place that pins the control-plane binaries flexinfer builds and tests against.

Changing a version here changes the cache key, so the next `ensure_assets()` builds
the new set once and leaves the old one in place. Nothing here does I/O.
"""

from __future__ import annotations

from typing import Final

KUBERNETES_VERSION: Final = "v1.37.2"
"""`k8s.io/kubernetes`: kube-apiserver, kube-controller-manager, kube-scheduler, kubectl."""

KUBERNETES_STAGING_VERSION: Final = "v0.37.2"
"""The published `k8s.io/*` staging modules that match `KUBERNETES_VERSION`."""

ETCD_VERSION: Final = "v3.6.16"
"""`go.etcd.io/etcd/server/v3` (Kubernetes documents 3.5.6+ as supported)."""

KWOK_VERSION: Final = "v0.8.0"
"""`sigs.k8s.io/kwok`: simulated nodes and pod lifecycles."""

KUBERNETES_STAGING_MODULES: Final = (
    "api",
    "apiextensions-apiserver",
    "apimachinery",
    "apiserver",
    "cli-runtime",
    "client-go",
    "cloud-provider",
    "cluster-bootstrap",
    "code-generator",
    "component-base",
    "component-helpers",
    "controller-manager",
    "cri-api",
    "cri-client",
    "cri-streaming",
    "csi-translation-lib",
    "dynamic-resource-allocation",
    "endpointslice",
    "externaljwt",
    "kms",
    "kube-aggregator",
    "kube-controller-manager",
    "kube-proxy",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "metrics",
    "mount-utils",
    "pod-security-admission",
    "sample-apiserver",
    "streaming",
)
"""`k8s.io/kubernetes`'s go.mod replaces these with `./staging/src/k8s.io/<name>`;
a build outside its repository points them at the published modules instead."""

BINARIES: Final = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
)


def assets_key(*, goos: str, goarch: str) -> str:
    """The cache directory name for this set of pins on one platform."""
    return f"k8s-{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}-kwok-{KWOK_VERSION}-{goos}-{goarch}"
