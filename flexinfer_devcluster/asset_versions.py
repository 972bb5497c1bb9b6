"""The one place that pins the binaries flexinfer builds and tests against.

The control-plane binaries come from Go modules; `llama-server` (a real model server
the local cluster runs) from the llama.cpp sources vendored in a pinned
`llama-cpp-python` sdist; `ollama` (the second) from its Go module, with the C++ headers
its module zip lacks taken from that same sdist.

Changing a version here changes the cache key, so the next `ensure_assets()` builds
the new set once and leaves the old one in place. Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
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


LLAMA_CPP_PYTHON_VERSION: Final = "0.3.36"
"""The `llama-cpp-python` sdist on PyPI whose vendored llama.cpp sources build `llama-server`."""

LLAMA_CPP_PYTHON_SHA256: Final = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
"""The sdist's SHA-256 (pip checks it with --require-hashes, and so does the cache)."""

LLAMA_SERVER_CMAKE_FLAGS: Final = (
    "-DCMAKE_BUILD_TYPE=Release",
    # Release means -O3; the C++ is 98 % of the build and -O1 compiles it with a quarter
    # less CPU (747 -> 564 s; benchmarks/bench_cold_build.py, docs/local-cluster.md).
    # The C kernels keep -O3.
    # (CMAKE_CXX_FLAGS=-O1 would not do it: the Release flags come after it and win.)
    "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG",
    # Portable CPU code: the binary may be cached on one machine and run on another.
    "-DGGML_NATIVE=OFF",
    # One self-contained executable, no libllama.so/libggml.so beside it.
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_OPENMP=OFF",
    # No network at build time: the web UI would otherwise be fetched during the build,
    # and HTTPS model downloads (OpenSSL) are never used here.
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)
"""How `llama-server` is configured (CPU only). `LLAMA_CURL` is not passed: these sources
dropped libcurl and only warn that the option is ignored."""

LLAMA_SERVER_BINARY: Final = "llama-server"


def llama_server_key(*, goos: str, goarch: str) -> str:
    """The cache directory name for `llama-server`: the sdist version, the flags, the platform."""
    flags = hashlib.sha256("\n".join(LLAMA_SERVER_CMAKE_FLAGS).encode()).hexdigest()[:8]
    return f"llama-server-{LLAMA_CPP_PYTHON_VERSION}-{flags}-{goos}-{goarch}"


OLLAMA_VERSION: Final = "v0.17.4"
"""`github.com/ollama/ollama`: the `ollama` binary the process node runs for Ollama pods."""

OLLAMA_VENDOR_PREFIX: Final = "vendor/llama.cpp/vendor/"
"""Where the sdist keeps llama.cpp's third-party headers (nlohmann/json, stb, miniaudio,
cpp-httplib): Go module zips drop every `vendor/` directory, so the module's
`llama/llama.cpp/vendor` is missing and is filled from here (never from the system's
headers: a different nlohmann version breaks the build's ABI)."""

OLLAMA_CGO_FLAGS: Final = ("-O1", "-g0")
"""CFLAGS and CXXFLAGS of its cgo build (Go's default is `-O2 -g`). Debug info and the
heavier optimisation cost build minutes on every cold CI machine and buy nothing for a
random-weight tiny model; ggml's CPU kernels keep their own `-O3`."""

OLLAMA_BINARY: Final = "ollama"


def ollama_key(*, goos: str, goarch: str) -> str:
    """The cache directory name for `ollama`: its version, the sdist, the flags, the platform."""
    flags = hashlib.sha256(
        "\n".join((*OLLAMA_CGO_FLAGS, LLAMA_CPP_PYTHON_SHA256)).encode()
    ).hexdigest()[:8]
    return f"ollama-{OLLAMA_VERSION}-{flags}-{goos}-{goarch}"
