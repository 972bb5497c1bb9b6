"""Map a pod's llama.cpp server container to the local `llama-server` command that runs it.

The process node runs a pod as a local process: the container's image entrypoint is
`llama-server`, so the command is the cached binary with the container's own args,
except that `--host` becomes the pod's loopback address (added when absent: the server
would otherwise bind 127.0.0.1, shared by every pod) and any path argument that lies
under a volumeMount backed by a hostPath volume becomes the host path. Literal `env`
values are passed on (paths in them mapped the same way); `valueFrom` entries are not
resolved here. Everything else is kept as rendered, so a flag the server rejects makes
the real server fail.

It also reads how the kubelet would check readiness: the container's readinessProbe
(httpGet or tcpSocket, the port by number or by name), to be run against the pod's
address.

Pure: reads the pod as the API returns it (a dict) and returns what to run; never
touches the file system or starts anything.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from flexinfer_kube.objects import get_path

LLAMA_SERVER_IMAGE_WORDS = ("llama.cpp", "server")
"""A container runs here when its image name contains both words (lowercased), as
`ghcr.io/ggml-org/llama.cpp:server-rocm` and every `llama.cpp:server-*` tag do."""
LLAMA_SERVER_ENTRYPOINT = "llama-server"
HOST_FLAG = "--host"


class UnsupportedPod(ValueError):
    """The pod cannot run on the process node; the message says why, naming the field."""


@attrs.frozen
class HostPathMount:
    """A container path backed by a host path (a hostPath volume, possibly with subPath)."""

    mount_path: str
    host_path: str
    volume: str
    host_path_type: str


@attrs.frozen
class ReadinessCheck:
    """The container's readiness probe: an HTTP GET, a TCP connect, or none (ready once
    running, as the kubelet treats a container without one)."""

    kind: str  # "http", "tcp" or "none"
    port: int = 0
    path: str = "/"


@attrs.frozen
class ServerCommand:
    """What to start for one pod: the argv (binary first) and the container's env."""

    container: str
    image: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    mounts: tuple[HostPathMount, ...]
    readiness: ReadinessCheck


def is_llama_server_image(image: str) -> bool:
    lowered = image.lower()
    return all(word in lowered for word in LLAMA_SERVER_IMAGE_WORDS)


def host_path_mounts(pod: Mapping[str, Any], container: Mapping[str, Any]) -> list[HostPathMount]:
    """The container's mounts whose volume is a hostPath, longest mount path first."""
    volumes = {
        str(volume.get("name")): volume for volume in get_path(pod, "spec", "volumes") or []
    }
    mounts = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(str(mount.get("name")))
        host = get_path(volume, "hostPath", "path") if volume else None
        if not host:
            continue
        sub_path = str(mount.get("subPath") or "")
        mounts.append(
            HostPathMount(
                mount_path=posixpath.normpath(str(mount.get("mountPath"))),
                host_path=posixpath.join(str(host), sub_path) if sub_path else str(host),
                volume=str(mount.get("name")),
                host_path_type=str(get_path(volume, "hostPath", "type") or ""),
            )
        )
    return sorted(mounts, key=lambda m: len(m.mount_path), reverse=True)


def map_path(value: str, mounts: Sequence[HostPathMount]) -> str:
    """`value` with a container path under a hostPath mount replaced by the host path.

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


def readiness_check(container: Mapping[str, Any]) -> ReadinessCheck:
    """The container's readinessProbe as a check to run; raises `UnsupportedPod`."""
    probe = container.get("readinessProbe") or {}
    ports = {
        str(port.get("name")): int(port.get("containerPort"))
        for port in container.get("ports") or []
        if port.get("name")
    }

    def port_of(field: str, value: Any) -> int:
        if isinstance(value, int):
            return value
        if str(value).isdigit():
            return int(str(value))
        if str(value) in ports:
            return ports[str(value)]
        raise UnsupportedPod(
            f"container {container.get('name')!r}: readinessProbe.{field}.port {value!r} "
            "names no containerPort"
        )

    if "httpGet" in probe:
        http = probe["httpGet"]
        scheme = str(http.get("scheme") or "HTTP").upper()
        if scheme != "HTTP":
            raise UnsupportedPod(
                f"container {container.get('name')!r}: readinessProbe.httpGet.scheme "
                f"{scheme!r} is not run on the process node (HTTP only)"
            )
        return ReadinessCheck(
            "http", port=port_of("httpGet", http.get("port")), path=str(http.get("path") or "/")
        )
    if "tcpSocket" in probe:
        return ReadinessCheck("tcp", port=port_of("tcpSocket", probe["tcpSocket"].get("port")))
    # An exec probe has no container to run in; like no probe, ready once running.
    return ReadinessCheck("none")


def server_container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod's one container, which must be a llama.cpp server image."""
    name = f"{get_path(pod, 'metadata', 'namespace')}/{get_path(pod, 'metadata', 'name')}"
    if get_path(pod, "spec", "initContainers"):
        raise UnsupportedPod(
            f"pod {name}: spec.initContainers are not run on the process node; "
            "it runs one llama.cpp server container per pod"
        )
    containers = get_path(pod, "spec", "containers") or []
    if len(containers) != 1:
        raise UnsupportedPod(
            f"pod {name}: spec.containers has {len(containers)} containers; the process "
            "node runs exactly one llama.cpp server container per pod"
        )
    container: Mapping[str, Any] = containers[0]
    image = str(container.get("image") or "")
    if not is_llama_server_image(image):
        raise UnsupportedPod(
            f"pod {name}: container {container.get('name')!r} has image {image!r}, which is "
            "not a llama.cpp server image (its name must contain 'llama.cpp' and 'server'); "
            "the process node runs only llama-server. Other backends run on kwok nodes"
        )
    return container


def server_command(pod: Mapping[str, Any], *, binary: Path, address: str) -> ServerCommand:
    """The local command for `pod`, listening on `address`; raises `UnsupportedPod`."""
    container = server_container(pod)
    command = [str(part) for part in container.get("command") or []]
    args = [str(part) for part in container.get("args") or []]
    if command:
        if posixpath.basename(command[0]) != LLAMA_SERVER_ENTRYPOINT:
            raise UnsupportedPod(
                f"container {container.get('name')!r}: command {command!r} is not the "
                f"image's {LLAMA_SERVER_ENTRYPOINT} entrypoint; render args only"
            )
        args = command[1:] + args
    mounts = host_path_mounts(pod, container)
    env = {
        str(item.get("name")): map_path(str(item.get("value") or ""), mounts)
        for item in container.get("env") or []
        if "valueFrom" not in item
    }
    return ServerCommand(
        container=str(container.get("name") or ""),
        image=str(container.get("image") or ""),
        argv=(str(binary), *with_host([map_path(arg, mounts) for arg in args], address)),
        env=env,
        mounts=tuple(mounts),
        readiness=readiness_check(container),
    )
