"""Map a pod's containers to the local processes that run them on the process node.

The process node runs a pod as local processes, one per container, in order: its init
containers one after the other, then its one server container. What each runs:

- a **llama.cpp server** image (its name contains `llama.cpp` and `server`, e.g.
  `ghcr.io/ggml-org/llama.cpp:server-rocm`): the image's entrypoint is `llama-server`,
  so the cached binary runs with the container's args, except that `--host` becomes the
  pod's loopback address (added when absent: the server would otherwise bind 127.0.0.1,
  shared by every pod); the port is `--port` (llama-server's default 8080);
- an **Ollama** image (its name contains `ollama`): the image's entrypoint is
  `ollama`, so the cached binary runs with the container's args (`serve`). The pod's
  port is the one `OLLAMA_HOST` names (Ollama's default 11434 when it names none), but
  `OLLAMA_HOST` becomes `0.0.0.0:<relay port>`: listening on a loopback address, Ollama
  would refuse every request whose Host header is a name (its DNS-rebinding guard),
  which it never does in a real pod, where it listens on all addresses; the node relays
  the pod's address and port to it (`PodRun.relayed`);
- an **init container** whose command is a shell script (`sh -c SCRIPT [ARG...]`, as
  the flash loader and Ollama's pull are rendered): the machine's `/bin/sh` runs the
  script, with every container path under a mount (in the script text and in its
  arguments) replaced by the host directory behind it. The image is not used: the
  script runs with the machine's tools (the renderer's scripts use only POSIX shell
  and coreutils), and the server binaries are on `PATH` under their image names;
- a **Job's one container** whose command is a shell script (a pod with `restartPolicy`
  `Never` or `OnFailure`, as the Job that makes a node cache's directory is rendered):
  run as an init container is, listening on no port; the pod ends when it exits.

Paths: a container path under a volumeMount whose volume the node resolved to a host
directory (`volumes`: a hostPath, a PersistentVolumeClaim's bound volume, an emptyDir)
becomes the host path (subPath honoured), in args (a bare path or `--flag=/path`),
literal `env` values and init scripts. `valueFrom` env is not resolved. Everything else
is kept as rendered, so a flag the server rejects makes the real server fail.

Probes are read as the kubelet runs them: startup, liveness and readiness, httpGet or
tcpSocket (the port by number or by name), with their timings and the Kubernetes
defaults (period 10 s, timeout 1 s, success 1, failure 3); an exec or grpc probe has no
container to run in and always passes.

Pure: reads the pod as the API returns it (a dict) and returns what to run; never
touches the file system or starts anything.
"""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from flexinfer_kube.objects import get_path

LLAMA_SERVER_IMAGE_WORDS = ("llama.cpp", "server")
"""A container runs llama-server when its image name contains both words (lowercased),
as `ghcr.io/ggml-org/llama.cpp:server-rocm` and every `llama.cpp:server-*` tag do."""
OLLAMA_IMAGE_WORD = "ollama"
"""A container runs `ollama` when its image name contains this (`ollama/ollama:rocm`)."""
LLAMA_SERVER_ENTRYPOINT = "llama-server"
OLLAMA_ENTRYPOINT = "ollama"
HOST_FLAG = "--host"
LLAMA_SERVER_DEFAULT_PORT = 8080
OLLAMA_DEFAULT_PORT = 11434
SHELLS = frozenset({"sh", "bash", "ash", "dash"})
PROBE_KINDS = ("startupProbe", "livenessProbe", "readinessProbe")


class UnsupportedPod(ValueError):
    """The pod cannot run on the process node; the message says why, naming the field."""


@attrs.frozen
class Binaries:
    """The executables the node runs for the images' entrypoints (None: not built)."""

    llama_server: str
    ollama: str | None = None


@attrs.frozen
class Mount:
    """A container path backed by a host path (its volume resolved, subPath applied)."""

    mount_path: str
    host_path: str
    volume: str


@attrs.frozen
class Probe:
    """One probe as the kubelet runs it: an HTTP GET, a TCP connect, or none (an exec or
    grpc probe: it always passes here), with its timings in seconds."""

    kind: str  # "http", "tcp" or "none"
    port: int = 0
    path: str = "/"
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3

    def first_at(self, started: float) -> float:
        """When the kubelet first runs it for a container started at `started`: at the
        first tick of its period (its worker starts with the pod) past the initial delay."""
        return started + self.period * max(1, math.ceil(self.initial_delay / self.period))


@attrs.frozen
class ContainerRun:
    """What to start for one container: the argv (binary first), its own env, its mounts
    (longest container path first) and its probes."""

    name: str
    image: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    mounts: tuple[Mount, ...] = ()
    startup: Probe | None = None
    liveness: Probe | None = None
    readiness: Probe | None = None


@attrs.frozen
class PodRun:
    """A pod as processes: init containers in order, then the server; `port` is the pod's
    (reserved by the node at the pod's address). `relayed`: the server listens on all
    addresses at the `relay_port` it was given, and the node relays the pod's address
    and port to it."""

    init_containers: tuple[ContainerRun, ...]
    server: ContainerRun
    port: int
    relayed: bool = False


def is_llama_server_image(image: str) -> bool:
    lowered = image.lower()
    return all(word in lowered for word in LLAMA_SERVER_IMAGE_WORDS)


def is_ollama_image(image: str) -> bool:
    return OLLAMA_IMAGE_WORD in image.lower()


def volume_names(pod: Mapping[str, Any]) -> list[str]:
    """The names of the pod's volumes that some container mounts."""
    mounted = {
        str(mount.get("name"))
        for container in [
            *(get_path(pod, "spec", "initContainers") or []),
            *(get_path(pod, "spec", "containers") or []),
        ]
        for mount in container.get("volumeMounts") or []
    }
    return [
        str(volume.get("name"))
        for volume in get_path(pod, "spec", "volumes") or []
        if str(volume.get("name")) in mounted
    ]


def container_mounts(container: Mapping[str, Any], volumes: Mapping[str, str]) -> list[Mount]:
    """The container's mounts whose volume has a host path, longest mount path first."""
    mounts = []
    for mount in container.get("volumeMounts") or []:
        host = volumes.get(str(mount.get("name")))
        if not host:
            continue
        sub_path = str(mount.get("subPath") or "")
        mounts.append(
            Mount(
                mount_path=posixpath.normpath(str(mount.get("mountPath"))),
                host_path=posixpath.join(host, sub_path) if sub_path else host,
                volume=str(mount.get("name")),
            )
        )
    return sorted(mounts, key=lambda m: len(m.mount_path), reverse=True)


def map_path(value: str, mounts: Sequence[Mount]) -> str:
    """`value` with a container path under a mount replaced by the host path.

    Works on a bare path and on the value of `--flag=/path`; anything else is returned
    unchanged.
    """
    if "=" in value and value.startswith("-"):
        flag, _, rest = value.partition("=")
        return f"{flag}={map_path(rest, mounts)}"
    if not value.startswith("/"):
        return value
    normal = posixpath.normpath(value)
    for mount in mounts:  # longest first: the innermost mount wins
        if normal == mount.mount_path:
            return mount.host_path
        if normal.startswith(mount.mount_path.rstrip("/") + "/"):
            return posixpath.join(mount.host_path, normal[len(mount.mount_path) :].lstrip("/"))
    return value


def map_text(text: str, mounts: Sequence[Mount]) -> str:
    """A script with every mount path that stands as a whole path component replaced by
    its host path: `/cache-source/x` and `"/cache-source"` are mapped, `/cache-sources`
    and `a/cache-source` are not."""
    if not mounts:
        return text
    by_path = {mount.mount_path: mount.host_path for mount in mounts}
    pattern = re.compile(
        r"(?<![\w./-])("
        + "|".join(re.escape(path) for path in sorted(by_path, key=len, reverse=True))
        + r")(?![\w.-])"
    )
    return pattern.sub(lambda match: by_path[match.group(1)], text)


def with_host(args: Sequence[str], address: str) -> list[str]:
    """`args` with every `--host X` / `--host=X` set to `address` (appended if absent)."""
    result: list[str] = []
    found = False
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == HOST_FLAG:
            result += [HOST_FLAG, address]
            found = True
            index += 2  # the flag and its value
            continue
        if arg.startswith(f"{HOST_FLAG}="):
            result.append(f"{HOST_FLAG}={address}")
            found = True
        else:
            result.append(arg)
        index += 1
    if not found:
        result += [HOST_FLAG, address]
    return result


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def read_probe(container: Mapping[str, Any], field: str) -> Probe | None:
    """The container's `field` probe (startupProbe, livenessProbe, readinessProbe) as the
    kubelet would run it; None when it has none. Raises `UnsupportedPod`."""
    probe = container.get(field)
    if not probe:
        return None
    ports = {
        str(port.get("name")): int(port.get("containerPort"))
        for port in container.get("ports") or []
        if port.get("name")
    }
    name = container.get("name")

    def port_of(kind: str, value: Any) -> int:
        if isinstance(value, int):
            return value
        if str(value).isdigit():
            return int(str(value))
        if str(value) in ports:
            return ports[str(value)]
        raise UnsupportedPod(
            f"container {name!r}: {field}.{kind}.port {value!r} names no containerPort"
        )

    base = Probe(
        "none",
        initial_delay=float(_int(probe.get("initialDelaySeconds"), 0)),
        period=float(max(1, _int(probe.get("periodSeconds"), 10))),
        timeout=float(max(1, _int(probe.get("timeoutSeconds"), 1))),
        success_threshold=max(1, _int(probe.get("successThreshold"), 1)),
        failure_threshold=max(1, _int(probe.get("failureThreshold"), 3)),
    )
    if "httpGet" in probe:
        http = probe["httpGet"]
        scheme = str(http.get("scheme") or "HTTP").upper()
        if scheme != "HTTP":
            raise UnsupportedPod(
                f"container {name!r}: {field}.httpGet.scheme {scheme!r} is not run on the "
                "process node (HTTP only)"
            )
        return attrs.evolve(
            base,
            kind="http",
            port=port_of("httpGet", http.get("port")),
            path=str(http.get("path") or "/"),
        )
    if "tcpSocket" in probe:
        return attrs.evolve(
            base, kind="tcp", port=port_of("tcpSocket", probe["tcpSocket"].get("port"))
        )
    return base


def _env(container: Mapping[str, Any], mounts: Sequence[Mount]) -> dict[str, str]:
    return {
        str(item.get("name")): map_path(str(item.get("value") or ""), mounts)
        for item in container.get("env") or []
        if "valueFrom" not in item
    }


def _entrypoint_args(container: Mapping[str, Any], entrypoint: str) -> list[str]:
    """The container's args after the image's entrypoint (an explicit command naming
    that entrypoint is accepted too)."""
    command = [str(part) for part in container.get("command") or []]
    args = [str(part) for part in container.get("args") or []]
    if command:
        if posixpath.basename(command[0]) != entrypoint:
            raise UnsupportedPod(
                f"container {container.get('name')!r}: command {command!r} is not the "
                f"image's {entrypoint} entrypoint; render args only"
            )
        args = command[1:] + args
    return args


def _port_of_args(args: Sequence[str]) -> int:
    for index, arg in enumerate(args):
        try:
            if arg == "--port":
                return int(args[index + 1])
            if arg.startswith("--port="):
                return int(arg.partition("=")[2])
        except (ValueError, IndexError):
            continue
    return LLAMA_SERVER_DEFAULT_PORT


def _ollama_port(value: str) -> int:
    """The port of an `OLLAMA_HOST` value (`0.0.0.0:8000`, `http://host:8000`, `:8000`)."""
    rest = value.split("://", 1)[-1].rstrip("/")
    host, _, port = rest.rpartition(":")
    if host and port.isdigit():
        return int(port)
    if not host and port.isdigit() and rest.startswith(":"):
        return int(port)
    return OLLAMA_DEFAULT_PORT


def _probes(container: Mapping[str, Any]) -> dict[str, Probe | None]:
    return {
        "startup": read_probe(container, "startupProbe"),
        "liveness": read_probe(container, "livenessProbe"),
        "readiness": read_probe(container, "readinessProbe"),
    }


def server_run(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    binaries: Binaries,
    volumes: Mapping[str, str],
    address: str,
    relay_port: int = 0,
) -> tuple[ContainerRun, int, bool]:
    """The server container as a process listening on `address`, its port, and whether
    it listens on all addresses at `relay_port` instead (to be relayed)."""
    name = f"{get_path(pod, 'metadata', 'namespace')}/{get_path(pod, 'metadata', 'name')}"
    image = str(container.get("image") or "")
    mounts = container_mounts(container, volumes)
    env = _env(container, mounts)
    if is_llama_server_image(image):
        args = _entrypoint_args(container, LLAMA_SERVER_ENTRYPOINT)
        argv = (binaries.llama_server, *with_host([map_path(a, mounts) for a in args], address))
        port, relayed = _port_of_args(args), False
    elif is_ollama_image(image):
        if binaries.ollama is None:
            raise UnsupportedPod(
                f"pod {name}: container {container.get('name')!r} runs Ollama, which is not "
                "built for this process node (python -m flexinfer_devcluster.assets --ollama)"
            )
        args = _entrypoint_args(container, OLLAMA_ENTRYPOINT)
        if args[:1] != ["serve"]:
            raise UnsupportedPod(
                f"pod {name}: container {container.get('name')!r} args {args!r}: the process "
                "node runs `ollama serve` only"
            )
        port, relayed = _ollama_port(env.get("OLLAMA_HOST", "")), True
        env["OLLAMA_HOST"] = f"0.0.0.0:{relay_port}"
        argv = (binaries.ollama, *(map_path(a, mounts) for a in args))
    elif _is_script(container) and get_path(pod, "spec", "restartPolicy") in ("Never", "OnFailure"):
        # A Job's one container that is a shell script (the Jobs that make a node cache's
        # directory): run as an init container is, listening nowhere.
        script = init_run(pod, 0, container, volumes=volumes)
        argv, port, relayed = script.argv, 0, False
    else:
        raise UnsupportedPod(
            f"pod {name}: container {container.get('name')!r} has image {image!r}, which is "
            "neither a llama.cpp server image (its name must contain 'llama.cpp' and "
            "'server') nor an Ollama one; the process node runs only llama-server and "
            "ollama. Other backends run on kwok nodes"
        )
    run = ContainerRun(
        name=str(container.get("name") or ""),
        image=image,
        argv=argv,
        env=env,
        mounts=tuple(mounts),
        **_probes(container),
    )
    return run, port, relayed


def _is_script(container: Mapping[str, Any]) -> bool:
    command = [str(part) for part in container.get("command") or []]
    return len(command) >= 3 and posixpath.basename(command[0]) in SHELLS and command[1] == "-c"


def init_run(
    pod: Mapping[str, Any], index: int, container: Mapping[str, Any], *, volumes: Mapping[str, str]
) -> ContainerRun:
    """An init container's shell script, run by the machine's /bin/sh with its container
    paths mapped onto host directories."""
    command = [str(part) for part in container.get("command") or []]
    command += [str(part) for part in container.get("args") or []]
    if len(command) < 3 or posixpath.basename(command[0]) not in SHELLS or command[1] != "-c":
        raise UnsupportedPod(
            f"pod {get_path(pod, 'metadata', 'namespace')}/{get_path(pod, 'metadata', 'name')}: "
            f"spec.initContainers[{index}] ({container.get('name')!r}) command "
            f"{command[:2]!r} is not a shell script (sh -c SCRIPT); the process node runs "
            "init containers as scripts only"
        )
    mounts = container_mounts(container, volumes)
    argv = (
        "/bin/sh",
        "-c",
        map_text(command[2], mounts),
        *(map_path(a, mounts) for a in command[3:]),
    )
    return ContainerRun(
        name=str(container.get("name") or ""),
        image=str(container.get("image") or ""),
        argv=argv,
        env=_env(container, mounts),
        mounts=tuple(mounts),
    )


def pod_run(
    pod: Mapping[str, Any],
    *,
    binaries: Binaries,
    volumes: Mapping[str, str],
    address: str,
    relay_port: int = 0,
) -> PodRun:
    """The processes that run `pod` at `address`; raises `UnsupportedPod` naming the field.

    `volumes`: volume name → the host path the node resolved it to; `relay_port`: where a
    relayed server listens (`PodRun.relayed`).
    """
    name = f"{get_path(pod, 'metadata', 'namespace')}/{get_path(pod, 'metadata', 'name')}"
    containers = get_path(pod, "spec", "containers") or []
    if len(containers) != 1:
        raise UnsupportedPod(
            f"pod {name}: spec.containers has {len(containers)} containers; the process "
            "node runs exactly one server container per pod"
        )
    inits = tuple(
        init_run(pod, index, container, volumes=volumes)
        for index, container in enumerate(get_path(pod, "spec", "initContainers") or [])
    )
    server, port, relayed = server_run(
        pod,
        containers[0],
        binaries=binaries,
        volumes=volumes,
        address=address,
        relay_port=relay_port,
    )
    return PodRun(init_containers=inits, server=server, port=port, relayed=relayed)
