"""The controller image (`make image`) and what runs in it, on the local control plane.

The image is built by `flexinfer_devcluster.image.build_image`, exactly what `make image`
runs (buildah bud of deploy/Dockerfile, chroot isolation, vfs storage, on a debootstrap
base); buildah and debootstrap are installed with apt-get when missing. With the cache
warm and the inputs unchanged that takes seconds; a code change rebuilds the last layers
(under a minute); a cold cache bootstraps Debian first (minutes, once).

The entry points run with `buildah run --isolation chroot --network host` as the
image's USER, the way a pod runs them: the Deployments' own commands from deploy/, and a
TokenRequest token of deploy/'s ServiceAccount where a pod has it
(/var/run/secrets/kubernetes.io/serviceaccount, see SERVICE_ACCOUNT_DIR) and
KUBERNETES_SERVICE_HOST/PORT set, so the kubernetes client takes its in-cluster path and
the API server's RBAC decides.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from flexinfer_devcluster.image import (
    Buildah,
    ImageBuild,
    ImageError,
    build_image,
    container_name,
    default_buildah,
)
from flexinfer_devcluster.localcluster import LocalCluster
from flexinfer_devcluster.policy import dev_policy_yaml
from tests.k8s.harness import Cluster, PodTimeline
from tests.k8s.kubectl import (
    DEPLOY_DIR,
    Kubectl,
    create_namespace,
    delete_namespace,
    install_crds,
    kubectl_for,
)
from tests.k8s.test_deploy import SYSTEM_NAMESPACE, token_for
from tests.polling import wait_until

# A cold cache bootstraps Debian and installs packages inside the first test's fixtures.
pytestmark = [pytest.mark.image, pytest.mark.k8s, pytest.mark.timeout(1800)]

# Where the kubelet mounts a pod's token; the client reads it through /var/run, a symlink
# to /run in Debian. Mounted at the /run path: buildah 1.28's chroot isolation resolves an
# absolute symlink in a mount destination on the host, so a destination under /var/run
# would be made in the host's /run.
SERVICE_ACCOUNT_DIR = "/run/secrets/kubernetes.io/serviceaccount"
# A toolchain in the image, by file name, wherever it is: cc, gcc-12,
# x86_64-linux-gnu-g++-12, c++, clang, clang++-14, go (Debian puts it under
# /usr/lib/go-*/bin), gccgo, cpp, cc1 and cc1plus (gcc's compilers proper), as, ld.bfd.
COMPILER = re.compile(
    r"^(?:[\w.]+-linux-gnu-)?"
    r"(?:cc|c\+\+|gcc|g\+\+|cpp|cc1|cc1plus|clang|clang\+\+|go|gccgo|as|ld)"
    r"(?:\.bfd|\.gold)?(?:-[\d.]+)?$"
)


# --- the image --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image() -> Iterator[tuple[Buildah, ImageBuild]]:
    if os.geteuid() != 0:
        pytest.fail(
            "the image test needs root (debootstrap, apt-get and buildah's chroot isolation)",
            pytrace=False,
        )
    try:
        build = build_image(container=container_name("test"))
    except ImageError as error:
        pytest.fail(f"make image failed: {error}", pytrace=False)
    buildah = default_buildah()
    assert build.container is not None
    try:
        yield buildah, build
    finally:
        buildah.remove_container(build.container)


@pytest.fixture(scope="module")
def rootfs(image: tuple[Buildah, ImageBuild]) -> Path:
    buildah, build = image
    assert build.container is not None
    return buildah.mount(build.container)


def run_in_image(image: tuple[Buildah, ImageBuild], *argv: str) -> str:
    buildah, build = image
    assert build.container is not None
    result = subprocess.run(
        buildah.run_command(build.container, argv),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def compilers_in(rootfs: Path) -> list[str]:
    """Every file (or symlink) in the tree named like a compiler, assembler or linker."""
    found = []
    for directory, _, files in os.walk(rootfs):
        for name in files:
            if COMPILER.match(name):
                found.append("/" + str((Path(directory) / name).relative_to(rootfs)))
    return sorted(found)


def test_the_compiler_scan_finds_a_toolchain(tmp_path: Path) -> None:
    """The scan below can fail: it finds each kind of compiler where Debian puts it."""
    planted = [
        "usr/bin/cc",
        "usr/bin/gcc-12",
        "usr/bin/x86_64-linux-gnu-g++-12",
        "usr/bin/clang++-14",
        "usr/lib/go-1.19/bin/go",
        "usr/bin/ld.bfd",
        "usr/local/bin/as",
        "usr/libexec/gcc/x86_64-linux-gnu/12/cc1plus",
    ]
    harmless = ["usr/bin/gcov-dump", "usr/bin/python3", "usr/share/doc/gcc-12/copyright"]
    for relative in planted + harmless:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("")
    assert compilers_in(tmp_path) == sorted("/" + p for p in planted)


def test_the_image_holds_no_compiler(rootfs: Path) -> None:
    python = rootfs / "opt/flexinfer/bin/python"
    assert python.is_symlink() or python.is_file()  # the walk looks at the real image
    assert compilers_in(rootfs) == []


def test_the_image_is_debians_python_with_the_wheel_and_no_dev_control_plane(
    image: tuple[Buildah, ImageBuild],
) -> None:
    probe = (
        "import importlib.util, json, os, sys; print(json.dumps({"
        "'uid': os.getuid(), 'gid': os.getgid(), 'python': sys.executable,"
        "'base_prefix': sys.base_prefix, 'version': list(sys.version_info[:2]),"
        "'modules': {m: importlib.util.find_spec(m) is not None for m in ("
        "'flexinfer_k8s', 'flexinfer_proxy', 'flexinfer_cli', 'flexinfer_kube',"
        "'flexinfer_core', 'flexinfer_devcluster', 'cryptography')}}))"
    )
    seen = json.loads(run_in_image(image, "python", "-c", probe))
    assert (seen["uid"], seen["gid"]) == (10001, 10001)
    assert seen["python"] == "/opt/flexinfer/bin/python"
    assert seen["base_prefix"] == "/usr"  # Debian's python3, not one built for the image
    assert seen["version"] >= [3, 11]
    assert seen["modules"] == {
        "flexinfer_k8s": True,
        "flexinfer_proxy": True,
        "flexinfer_cli": True,
        "flexinfer_kube": True,
        "flexinfer_core": True,
        "flexinfer_devcluster": False,
        "cryptography": False,
    }
    buildah, build = image
    config = buildah.image_config(build.image_id)
    assert config["User"] == "10001:10001"  # numeric, for runAsNonRoot
    assert config["Cmd"][:3] == ["python", "-m", "flexinfer_k8s"]


# --- the entry points on the local control plane -------------------------------------------


@pytest.fixture(scope="module")
def kubectl(local_cluster: LocalCluster) -> Kubectl:
    return kubectl_for(local_cluster)


@pytest.fixture(scope="module")
def rendered(kubectl: Kubectl) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(kubectl.ok("kustomize", str(DEPLOY_DIR))) if doc]


@pytest.fixture(scope="module")
def deploy_rbac(
    local_cluster: LocalCluster, kubectl: Kubectl, rendered: list[dict[str, Any]]
) -> None:
    """deploy/ without its workloads: the namespace, ServiceAccounts, RBAC and policy."""
    install_crds(local_cluster)
    rest = [
        doc
        for doc in rendered
        if doc["kind"] not in ("CustomResourceDefinition", "Deployment", "Service", "Job")
    ]
    kubectl.ok("apply", "-f", "-", stdin=yaml.safe_dump_all(rest))


@pytest.fixture
def namespace(kubectl: Kubectl, deploy_rbac: None) -> Iterator[str]:
    name = create_namespace(kubectl, "image")
    yield name
    delete_namespace(kubectl, name)


def deployment_command(
    rendered: list[dict[str, Any]], name: str, *, kind: str = "Deployment"
) -> list[str]:
    (deployment,) = [
        d for d in rendered if d["kind"] == kind and d["metadata"]["name"] == name
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return list(container["command"])


def service_account_files(
    local_cluster: LocalCluster, kubectl: Kubectl, service_account: str, directory: Path
) -> Path:
    """What the kubelet mounts for a pod: a TokenRequest token, the cluster CA, the namespace."""
    admin = yaml.safe_load(local_cluster.kubeconfig.read_text())
    ca = base64.b64decode(admin["clusters"][0]["cluster"]["certificate-authority-data"])
    directory.mkdir(mode=0o755)
    (directory / "token").write_text(token_for(kubectl, service_account))
    (directory / "ca.crt").write_bytes(ca)
    (directory / "namespace").write_text(SYSTEM_NAMESPACE)
    for path in (directory, *directory.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)  # readable by uid 10001
    return directory


class InImage:
    """An entry point running in the image as a pod would run it (see the module docstring)."""

    def __init__(
        self,
        image: tuple[Buildah, ImageBuild],
        local_cluster: LocalCluster,
        argv: list[str],
        *,
        credentials: Path,
        env: dict[str, str],
        log: Path,
        mounts: dict[Path, str] | None = None,
    ) -> None:
        buildah, build = image
        assert build.container is not None
        server = urlsplit(local_cluster.server)
        in_cluster = {
            "KUBERNETES_SERVICE_HOST": str(server.hostname),
            "KUBERNETES_SERVICE_PORT": str(server.port),
        }
        command = buildah.run_command(
            build.container,
            argv,
            volumes={credentials: SERVICE_ACCOUNT_DIR, **(mounts or {})},
            env={**in_cluster, **env},
        )
        self.log = log
        self._sink = log.open("ab")
        self.popen = subprocess.Popen(
            command, stdout=self._sink, stderr=subprocess.STDOUT, start_new_session=True
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        # buildah ends the command it runs when it is terminated; the session covers
        # the chroot helper processes if it cannot.
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        self._sink.close()


def assert_never_forbidden(log: Path) -> None:
    """No request was refused: the API server says `... is forbidden: User ...`, the
    client `Reason: Forbidden` (an HTTP access log's 403 may be a body size)."""
    text = log.read_text(errors="replace")
    assert "forbidden" not in text.lower(), text[-3000:]


def get(url: str, *, token: str = "") -> tuple[int, str]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()
    except OSError:
        return 0, ""


def test_the_controller_in_the_image_swaps_models_as_its_service_account(
    image: tuple[Buildah, ImageBuild],
    local_cluster: LocalCluster,
    kubectl: Kubectl,
    rendered: list[dict[str, Any]],
    namespace: str,
    tmp_path: Path,
) -> None:
    cluster = Cluster(local_cluster, namespace)
    timeline = PodTimeline(cluster)
    cluster.add_model("a", priority=100)
    cluster.add_model("b", priority=100)
    cluster.demand("a")
    identity = f"image-controller-{uuid.uuid4().hex[:6]}"
    # What the Deployment mounts from the ConfigMap: here the local cluster's policy (the
    # kwok annotations and node label the test models use are its to allow).
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "policy.yaml").write_text(dev_policy_yaml())
    # The Deployment's command, then the test's own: one namespace, its own election
    # Lease, free ports, short windows.
    argv = [
        *deployment_command(rendered, "flexinfer-controller"),
        "--namespace", namespace, "--leader-election-id", identity,
        "--metrics-port", "0", "--health-port", "0", "--bind-address", "127.0.0.1",
        "--demand-window", "4s", "--recent-window", "6s", "--default-swap-cooldown", "3s",
    ]  # fmt: skip
    controller = InImage(
        image,
        local_cluster,
        argv,
        credentials=service_account_files(
            local_cluster, kubectl, "flexinfer-controller", tmp_path / "sa"
        ),
        env={"POD_NAME": identity, "POD_NAMESPACE": SYSTEM_NAMESPACE},
        log=tmp_path / "controller.log",
        mounts={policy: "/etc/flexinfer"},
    )
    try:

        def health_port() -> int | None:
            for line in controller.text().splitlines():
                if line.startswith("{") and json.loads(line).get("msg") == "listening":
                    return int(json.loads(line)["ports"][-1])
            assert controller.popen.poll() is None, controller.text()[-3000:]
            return None

        port = wait_until(health_port, what="the controller to listen", timeout=120)
        assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        lease = kubectl.json("get", "-n", SYSTEM_NAMESPACE, f"lease/{identity}")
        assert lease["spec"]["holderIdentity"] == identity

        cluster.wait_serving("a", timeout=120)
        assert cluster.holders() == {"a"}

        def b_serving() -> bool:
            cluster.demand("b")  # a is no longer asked for: it goes idle and b takes over
            return cluster.status("b").get("phase") == "Ready"

        wait_until(b_serving, what="b to take the card from a", interval=1.0, timeout=120)
        cluster.wait_serving("b")
        assert cluster.status("a")["phase"] == "Preempted"
        assert cluster.holders() == {"b"}
        assert cluster.replicas("a") == 0
        assert timeline.created_apps()[:2] == ["a", "b"]
        assert timeline.violations == []
        assert controller.popen.poll() is None, controller.text()[-3000:]
    finally:
        timeline.stop()
        controller.stop()
    assert_never_forbidden(controller.log)


def test_the_proxy_in_the_image_answers_healthz_as_its_service_account(
    image: tuple[Buildah, ImageBuild],
    local_cluster: LocalCluster,
    kubectl: Kubectl,
    rendered: list[dict[str, Any]],
    namespace: str,
    tmp_path: Path,
) -> None:
    cluster = Cluster(local_cluster, namespace)
    cluster.add_model("listed")
    # API keys are on: the keys Job generates the Secret, as its own ServiceAccount.
    kubectl.run("delete", "secret", "-n", SYSTEM_NAMESPACE, "flexinfer-proxy-api-keys")
    keys = InImage(
        image,
        local_cluster,
        deployment_command(rendered, "flexinfer-proxy-keys", kind="Job"),
        credentials=service_account_files(
            local_cluster, kubectl, "flexinfer-proxy-keys", tmp_path / "keys-sa"
        ),
        env={},
        log=tmp_path / "keys.log",
    )
    assert keys.popen.wait(120) == 0, keys.text()[-3000:]
    assert "created with one key, 'admin'" in keys.text()
    secret = kubectl.json("get", "secret", "-n", SYSTEM_NAMESPACE, "flexinfer-proxy-api-keys")
    key = base64.b64decode(secret["data"]["admin"]).decode()
    assert len(key) >= 32
    again = InImage(
        image,
        local_cluster,
        deployment_command(rendered, "flexinfer-proxy-keys", kind="Job"),
        credentials=service_account_files(
            local_cluster, kubectl, "flexinfer-proxy-keys", tmp_path / "keys-sa-2"
        ),
        env={},
        log=tmp_path / "keys-again.log",
    )
    assert again.popen.wait(120) == 0, again.text()[-3000:]
    assert "exists: kept as it is" in again.text()
    argv = [
        *deployment_command(rendered, "flexinfer-proxy"),
        "--namespace", namespace, "--host", "127.0.0.1", "--port", "0",
    ]  # fmt: skip
    proxy = InImage(
        image,
        local_cluster,
        argv,
        credentials=service_account_files(
            local_cluster, kubectl, "flexinfer-proxy", tmp_path / "sa"
        ),
        env={"POD_NAMESPACE": SYSTEM_NAMESPACE},
        log=tmp_path / "proxy.log",
    )
    try:

        def port() -> int | None:
            found = re.search(r"^listening on 127\.0\.0\.1:(\d+)$", proxy.text(), re.MULTILINE)
            assert proxy.popen.poll() is None, proxy.text()[-3000:]
            return int(found.group(1)) if found else None

        listening = wait_until(port, what="the proxy to listen", timeout=120)
        base = f"http://127.0.0.1:{listening}"
        assert get(f"{base}/healthz") == (200, json.dumps({"status": "ok"}))
        # Ready once its informers listed through the API server on the proxy's token.
        wait_until(lambda: get(f"{base}/readyz")[0] == 200, what="the proxy to be ready")
        assert get(f"{base}/v1/models")[0] == 401
        status, body = get(f"{base}/v1/models", token=key)
        assert status == 200
        assert [card["id"] for card in json.loads(body)["data"]] == ["listed"]
    finally:
        proxy.stop()
    assert_never_forbidden(proxy.log)
