"""The rendered llama.cpp container becomes the local command: same args but `--host`,
container paths under hostPath mounts mapped to the host, anything else refused by name."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from flexinfer_devcluster.podcommand import (
    ReadinessCheck,
    UnsupportedPod,
    map_path,
    server_command,
)
from flexinfer_devcluster.policy import dev_policy
from flexinfer_devcluster.processnode import PROCESS_NODE_SELECTOR, PROCESS_NODE_TOLERATION
from flexinfer_k8s.render.workload import workload_from_model
from flexinfer_k8s.render.workloads import RenderSettings, render_workload

BINARY = Path("/cache/llama-server")
RENDERED_ARGS = [
    "-m", "/models/model.gguf", "--host", "0.0.0.0", "--port", "8000", "--alias", "tiny",
    "--n-gpu-layers", "999", "--ctx-size", "256",
]  # fmt: skip


def _pod(**container: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "server",
        "image": "ghcr.io/ggml-org/llama.cpp:server-rocm",
        "args": RENDERED_ARGS,
        "volumeMounts": [
            {"name": "model-source", "mountPath": "/models/model.gguf", "readOnly": True},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
    }
    spec.update(container)
    return {
        "metadata": {"namespace": "ns", "name": "tiny-abc"},
        "spec": {
            "containers": [spec],
            "volumes": [
                {"name": "model-source", "hostPath": {"path": "/data/tiny.gguf", "type": "File"}},
                {"name": "shm", "emptyDir": {"medium": "Memory"}},
            ],
        },
    }


def test_the_rendered_args_run_unchanged_but_host_and_the_model_path() -> None:
    command = server_command(_pod(), binary=BINARY, address="127.0.0.7")
    assert command.argv == (
        str(BINARY), "-m", "/data/tiny.gguf", "--host", "127.0.0.7", "--port", "8000",
        "--alias", "tiny", "--n-gpu-layers", "999", "--ctx-size", "256",
    )  # fmt: skip
    assert command.container == "server"


def test_flags_the_user_added_are_kept_so_the_server_judges_them() -> None:
    args = [*RENDERED_ARGS, "--no-such-flag", "--host=::"]
    command = server_command(_pod(args=args), binary=BINARY, address="127.0.0.9")
    assert command.argv[-2:] == ("--no-such-flag", "--host=127.0.0.9")
    assert "0.0.0.0" not in command.argv


def test_a_missing_host_is_added_so_no_two_pods_share_127_0_0_1() -> None:
    pod = _pod(args=["-m", "/models/model.gguf"])
    command = server_command(pod, binary=BINARY, address="127.0.0.3")
    assert command.argv[-2:] == ("--host", "127.0.0.3")


def test_paths_under_a_hostpath_mount_are_mapped_and_others_kept() -> None:
    pod = _pod(
        volumeMounts=[
            {"name": "models", "mountPath": "/models"},
            {"name": "models", "mountPath": "/models/sub", "subPath": "inner"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ]
    )
    pod["spec"]["volumes"][0] = {"name": "models", "hostPath": {"path": "/srv/m"}}
    mounts = server_command(pod, binary=BINARY, address="127.0.0.2").mounts
    assert map_path("/models/a.gguf", mounts) == "/srv/m/a.gguf"
    assert map_path("/models/sub/b.gguf", mounts) == "/srv/m/inner/b.gguf"
    assert map_path("--lora=/models/l.gguf", mounts) == "--lora=/srv/m/l.gguf"
    assert map_path("/modelsx/c.gguf", mounts) == "/modelsx/c.gguf"
    assert map_path("/dev/shm/x", mounts) == "/dev/shm/x"
    assert map_path("tiny", mounts) == "tiny"


def test_literal_env_is_passed_with_paths_mapped() -> None:
    env = [
        {"name": "LLAMA_ARG_MODEL", "value": "/models/model.gguf"},
        {"name": "HIP_VISIBLE_DEVICES", "value": "0"},
        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
    ]
    command = server_command(_pod(env=env), binary=BINARY, address="127.0.0.2")
    assert command.env == {"LLAMA_ARG_MODEL": "/data/tiny.gguf", "HIP_VISIBLE_DEVICES": "0"}


def test_an_explicit_llama_server_command_is_accepted_and_any_other_refused() -> None:
    pod = _pod(command=["/app/llama-server", "--verbose"])
    assert server_command(pod, binary=BINARY, address="127.0.0.2").argv[1] == "--verbose"
    with pytest.raises(UnsupportedPod, match=r"command \['python3', '-m', 'x'\]"):
        server_command(_pod(command=["python3", "-m", "x"]), binary=BINARY, address="127.0.0.2")


@pytest.mark.parametrize(
    "image", ["vllm/vllm-openai:latest", "ollama/ollama:rocm", "ghcr.io/ggml-org/llama.cpp:full"]
)
def test_an_image_that_is_not_a_llama_cpp_server_is_refused_naming_it(image: str) -> None:
    with pytest.raises(UnsupportedPod, match=rf"image '{image}', which is not a llama\.cpp server"):
        server_command(_pod(image=image), binary=BINARY, address="127.0.0.2")


def test_a_second_container_or_an_init_container_is_refused() -> None:
    pod = _pod()
    pod["spec"]["containers"].append({"name": "sidecar", "image": "busybox"})
    with pytest.raises(UnsupportedPod, match=r"spec\.containers has 2 containers"):
        server_command(pod, binary=BINARY, address="127.0.0.2")
    pod = _pod()
    pod["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox"}]
    with pytest.raises(UnsupportedPod, match=r"spec\.initContainers"):
        server_command(pod, binary=BINARY, address="127.0.0.2")


def test_the_readiness_probe_is_read_with_its_port_by_number_or_name() -> None:
    named = {"httpGet": {"path": "/health", "port": "http"}}
    pod = _pod(readinessProbe=named, ports=[{"name": "http", "containerPort": 8000}])
    assert server_command(pod, binary=BINARY, address="127.0.0.2").readiness == ReadinessCheck(
        "http", port=8000, path="/health"
    )
    pod = _pod(readinessProbe={"tcpSocket": {"port": 8000}})
    assert server_command(pod, binary=BINARY, address="127.0.0.2").readiness.kind == "tcp"
    assert server_command(_pod(), binary=BINARY, address="127.0.0.2").readiness.kind == "none"
    with pytest.raises(UnsupportedPod, match=r"readinessProbe\.httpGet\.port 'metrics'"):
        pod = _pod(readinessProbe={"httpGet": {"path": "/health", "port": "metrics"}})
        server_command(pod, binary=BINARY, address="127.0.0.2")


# Under the temporary directory: the local cluster's policy allows that host path.
MODEL_FILE = f"{tempfile.gettempdir()}/models/tiny.gguf"


def test_the_renderers_llama_cpp_pod_runs_with_only_host_and_model_path_changed() -> None:
    """The contract with flexinfer_k8s.render: what it writes for a file:// GGUF source."""
    model = {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": "tiny", "namespace": "ns", "uid": "uid-1"},
        "spec": {
            "backend": "llama-cpp",
            "source": f"file://{MODEL_FILE}",
            "llamacpp": {"ctxSize": 256},
            "extraArgs": ["--threads", "1"],
            "nodeSelector": PROCESS_NODE_SELECTOR,
            "tolerations": [PROCESS_NODE_TOLERATION],
        },
    }
    settings = RenderSettings(policy=dev_policy())
    rendered = render_workload(workload_from_model(model), cache=None, settings=settings)
    template = rendered.deployment["spec"]["template"]
    pod = {"metadata": {"namespace": "ns", "name": "tiny-x", **template["metadata"]}, **template}
    command = server_command(pod, binary=BINARY, address="127.0.0.4")
    assert command.argv == (
        str(BINARY), "-m", MODEL_FILE, "--host", "127.0.0.4", "--port", "8000",
        "--alias", "tiny", "--n-gpu-layers", "999", "--ctx-size", "256", "--threads", "1",
    )  # fmt: skip
    assert command.readiness == ReadinessCheck("http", port=8000, path="/health")
    assert template["spec"]["nodeSelector"] == PROCESS_NODE_SELECTOR
    assert template["spec"]["tolerations"] == [PROCESS_NODE_TOLERATION]
