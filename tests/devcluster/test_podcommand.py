"""The rendered containers become local commands: llama-server with the same args but
`--host`, `ollama serve` with `OLLAMA_HOST` moved to the pod's address, init scripts run
by /bin/sh; container paths under mounts mapped to the host directories the node resolved,
probes read with their timings, anything else refused by name."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from flexinfer_devcluster.podcommand import (
    Binaries,
    PodRun,
    Probe,
    UnsupportedPod,
    map_path,
    map_text,
    pod_run,
)
from flexinfer_devcluster.policy import dev_policy
from flexinfer_devcluster.processnode import PROCESS_NODE_SELECTOR, PROCESS_NODE_TOLERATION
from flexinfer_k8s.render.cache import cache_from_k8s
from flexinfer_k8s.render.local_volume import HostVolume, directory_job
from flexinfer_k8s.render.workload import workload_from_model
from flexinfer_k8s.render.workloads import RenderSettings, render_workload

BINARY = Path("/cache/llama-server")
BINARIES = Binaries(llama_server=str(BINARY), ollama="/cache/ollama")
VOLUMES = {"model-source": "/data/tiny.gguf", "shm": "/node/pods/x/shm"}


def server_command(
    pod: dict[str, Any], *, binary: Path = BINARY, address: str, volumes: Any = None
) -> Any:
    """The server container's run (the node resolved the volumes as `VOLUMES` says)."""
    run: PodRun = pod_run(
        pod, binaries=BINARIES, volumes=VOLUMES if volumes is None else volumes, address=address
    )
    return run.server
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
    assert command.name == "server"


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
    volumes = {"models": "/srv/m", "shm": "/node/shm"}
    mounts = server_command(pod, binary=BINARY, address="127.0.0.2", volumes=volumes).mounts
    assert map_path("/models/a.gguf", mounts) == "/srv/m/a.gguf"
    assert map_path("/models/sub/b.gguf", mounts) == "/srv/m/inner/b.gguf"
    assert map_path("--lora=/models/l.gguf", mounts) == "--lora=/srv/m/l.gguf"
    assert map_path("/modelsx/c.gguf", mounts) == "/modelsx/c.gguf"
    assert map_path("/dev/shm/x", mounts) == "/node/shm/x"  # an emptyDir is a directory too
    assert map_path("/etc/x", mounts) == "/etc/x"
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
    "image", ["vllm/vllm-openai:latest", "mlc/mlc-llm:rocm", "ghcr.io/ggml-org/llama.cpp:full"]
)
def test_an_image_that_is_not_a_server_the_node_runs_is_refused_naming_it(image: str) -> None:
    with pytest.raises(UnsupportedPod, match=rf"image '{image}', which is neither a llama\.cpp"):
        server_command(_pod(image=image), binary=BINARY, address="127.0.0.2")


def test_a_second_container_or_an_init_container_that_is_no_script_is_refused() -> None:
    pod = _pod()
    pod["spec"]["containers"].append({"name": "sidecar", "image": "busybox"})
    with pytest.raises(UnsupportedPod, match=r"spec\.containers has 2 containers"):
        server_command(pod, binary=BINARY, address="127.0.0.2")
    pod = _pod()
    pod["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox", "command": ["wget"]}]
    with pytest.raises(UnsupportedPod, match=r"spec\.initContainers\[0\] \('fetch'\) command"):
        server_command(pod, binary=BINARY, address="127.0.0.2")


def test_probes_are_read_with_their_timings_and_the_kubernetes_defaults() -> None:
    named = {"httpGet": {"path": "/health", "port": "http"}}
    startup = {**named, "periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 12}
    pod = _pod(readinessProbe=named, startupProbe=startup,
               livenessProbe={"tcpSocket": {"port": 8000}, "initialDelaySeconds": 120},
               ports=[{"name": "http", "containerPort": 8000}])
    run = server_command(pod, address="127.0.0.2")
    assert run.readiness == Probe("http", port=8000, path="/health", period=10.0, timeout=1.0,
                                  success_threshold=1, failure_threshold=3)
    assert run.startup == Probe("http", port=8000, path="/health", period=5.0, timeout=5.0,
                                failure_threshold=12)
    assert (run.liveness.kind, run.liveness.initial_delay) == ("tcp", 120.0)
    # The kubelet's worker ticks every period from the start, past the initial delay.
    assert run.startup.first_at(100.0) == 105.0
    assert run.liveness.first_at(100.0) == 220.0
    assert server_command(_pod(), address="127.0.0.2").readiness is None
    exec_probe = server_command(_pod(livenessProbe={"exec": {"command": ["true"]}}),
                                address="127.0.0.2")
    assert exec_probe.liveness.kind == "none"  # no container to exec in: it passes
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
    # The process node serves the claim from its local volume's path (the policy's
    # prefix, the temporary directory); the mount's subPath leads to the file.
    (source,) = [v for v in template["spec"]["volumes"] if v["name"] == "model-source"]
    assert "hostPath" not in source
    volumes = {"model-source": tempfile.gettempdir(), "dshm": "/node/dshm"}
    command = server_command(pod, address="127.0.0.4", volumes=volumes)
    assert command.argv == (
        str(BINARY), "-m", MODEL_FILE, "--host", "127.0.0.4", "--port", "8000",
        "--alias", "tiny", "--n-gpu-layers", "999", "--ctx-size", "256", "--threads", "1",
    )  # fmt: skip
    assert (command.readiness.kind, command.readiness.port) == ("http", 8000)
    assert command.readiness.path == "/health"
    # The whole coldStartTimeout (60s) in probes of the rendered period.
    assert (command.startup.period, command.startup.failure_threshold) == (2.0, 30)
    assert template["spec"]["nodeSelector"] == PROCESS_NODE_SELECTOR
    assert template["spec"]["tolerations"][0] == PROCESS_NODE_TOLERATION


def rendered_pod(model_spec: dict[str, Any], cache_spec: dict[str, Any] | None = None) -> Any:
    model = {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": "tiny", "namespace": "ns", "uid": "uid-1"},
        "spec": {**model_spec, "nodeSelector": PROCESS_NODE_SELECTOR,
                 "tolerations": [PROCESS_NODE_TOLERATION]},
    }
    cache = None
    if cache_spec is not None:
        cache = cache_from_k8s({
            "apiVersion": "ai.flexinfer/v1alpha1", "kind": "ModelCache",
            "metadata": {"name": "c", "namespace": "ns", "uid": "uid-2"}, "spec": cache_spec,
        })
    settings = RenderSettings(policy=dev_policy())  # the local cluster's administrator
    rendered = render_workload(workload_from_model(model), cache=cache, settings=settings)
    template = rendered.deployment["spec"]["template"]
    return {"metadata": {"namespace": "ns", "name": "tiny-x", **template["metadata"]}, **template}


def test_the_renderers_cached_ollama_pod_runs_ollama_serve_at_the_pods_address() -> None:
    pod = rendered_pod(
        {"backend": "ollama", "source": "ollama://tiny", "cache": {"modelCacheRef": "c"}},
        {"source": "ollama://tiny", "storageStrategy": "SharedPVC",
         "existingClaimName": "ollama-models", "modelPath": "store"},
    )
    volumes = {"model-cache": "/volumes/claims/ns/ollama-models", "dshm": "/node/dshm",
               "models-root": "/node/pods/x/models-root"}
    run = pod_run(pod, binaries=BINARIES, volumes=volumes, address="127.0.0.5",
                  relay_port=40123)
    # The /models layout's links are made by its script, in the pod's own /models.
    [layout] = run.init_containers
    assert layout.name == "models-layout"
    assert layout.argv[0:2] == ("/bin/sh", "-c")
    assert "cd /node/pods/x/models-root\n" in layout.argv[2]
    assert run.server.argv == ("/cache/ollama", "serve")
    assert run.port == 8000  # the rendered OLLAMA_HOST's: the pod's port
    # On all addresses, as in a real pod (on loopback Ollama would refuse a Host header
    # naming the Service); the node relays 127.0.0.5:8000 to it.
    assert run.relayed
    assert run.server.env["OLLAMA_HOST"] == "0.0.0.0:40123"
    # The claim is mounted at /models/c with the cache's modelPath as subPath.
    assert run.server.env["OLLAMA_MODELS"] == "/volumes/claims/ns/ollama-models/store"
    assert run.server.env["OLLAMA_KEEP_ALIVE"] == "-1"


def test_ollama_without_its_binary_or_with_another_command_is_refused() -> None:
    pod = rendered_pod({"backend": "ollama", "source": "ollama://tiny"})
    with pytest.raises(UnsupportedPod, match=r"assets --ollama"):
        pod_run(pod, binaries=Binaries(llama_server="/x"), volumes={}, address="127.0.0.5")
    pod["spec"]["containers"][0]["args"] = ["run", "tiny"]
    with pytest.raises(UnsupportedPod, match=r"runs `ollama serve` only"):
        pod_run(pod, binaries=BINARIES, volumes={}, address="127.0.0.5")


def test_the_flash_loader_runs_as_its_script_with_container_paths_mapped() -> None:
    pod = rendered_pod(
        {"backend": "llama-cpp", "source": f"file://{MODEL_FILE}",
         "cache": {"modelCacheRef": "c"}},
        {"source": f"file://{MODEL_FILE}", "storageStrategy": "Memory",
         "nodeSelector": {"kubernetes.io/hostname": "process-node"}},
    )
    # The namespace's local volumes; the mounts' subPath is the cache's name.
    volumes = {"cache-source": "/root/var/lib/flexinfer/models/ns",
               "model-cache": "/root/dev/shm/flexinfer/ns", "dshm": "/node/dshm"}
    run = pod_run(pod, binaries=BINARIES, volumes=volumes, address="127.0.0.6")
    [loader] = run.init_containers
    assert loader.name == "flash-loader"
    shell, flag, script, arg0, target = loader.argv
    assert (shell, flag, arg0) == ("/bin/sh", "-c", "flash-loader")
    assert target == "/root/dev/shm/flexinfer/ns/c"  # $1: the RAM copy's directory
    assert "src=/root/var/lib/flexinfer/models/ns/c;" in script
    assert "/cache-source" not in script
    # The server reads the RAM copy.
    assert run.server.argv[1:3] == ("-m", "/root/dev/shm/flexinfer/ns/c/tiny.gguf")


def test_mount_paths_are_mapped_in_scripts_only_as_whole_path_components() -> None:
    mounts = pod_run(
        _pod(volumeMounts=[{"name": "src", "mountPath": "/cache-source"},
                           {"name": "dst", "mountPath": "/models/c"}]),
        binaries=BINARIES, volumes={"src": "/h/src", "dst": "/h/dst"}, address="127.0.0.2",
    ).server.mounts
    script = (
        'cd /cache-source; cp "/cache-source/a" /models/c/; '
        "ls /cache-sources a/cache-source /models/cx"
    )
    assert map_text(script, mounts) == (
        'cd /h/src; cp "/h/src/a" /h/dst/; ls /cache-sources a/cache-source /models/cx'
    )


def test_the_directory_job_runs_as_its_script_and_a_server_pod_still_needs_a_server() -> None:
    """The Job that makes a node cache's directory: its one container is a shell script,
    run with its mount mapped; a pod that restarts Always with such a container is not
    a server and is refused."""
    volume = HostVolume(namespace="ns", root="/var/lib/flexinfer/models/ns", kind="models",
                        selector=(("kubernetes.io/hostname", "process-node"),),
                        capacity="1Gi")
    job = directory_job(volume, controller_namespace="flexinfer-system", policy=dev_policy())
    assert job is not None
    pod = {"metadata": {"namespace": "flexinfer-system", "name": "dir-x"},
           **job["spec"]["template"]}
    run = pod_run(pod, binaries=BINARIES, volumes={"parent": "/root/var/lib/flexinfer/models"},
                  address="127.0.0.9")
    assert run.port == 0 and not run.relayed
    shell, flag, _script, arg0, target = run.server.argv
    assert (shell, flag, arg0) == ("/bin/sh", "-c", "directory")
    assert target == "/root/var/lib/flexinfer/models/ns"
    forever = {**pod, "spec": {**pod["spec"], "restartPolicy": "Always"}}
    with pytest.raises(UnsupportedPod, match=r"neither a llama\.cpp server image"):
        pod_run(forever, binaries=BINARIES, volumes={}, address="127.0.0.9")
