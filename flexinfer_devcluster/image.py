"""`make image`: the controller image built without Docker, by buildah on a debootstrap base.

What it owns, all under `<cache>/image/` (`<cache>` is `assets.cache_root()`,
normally ~/.cache/flexinfer):
- `base-<key>.tar`: a `debootstrap --variant=minbase` root filesystem of Debian `SUITE`,
  trimmed the way the official debian:<suite>-slim image is (no docs, man pages or
  locales; apt keeps no package cache; the updates and security suites in its sources).
  `<key>` hashes everything the base is made of (suite, architecture, mirrors, this
  recipe, debootstrap's version): a change to any of them makes a new base, and the
  old one is deleted.
- `containers/`: buildah's storage for these builds only (vfs driver, never the
  system's storage). It holds the base as `localhost/flexinfer-base:<key>` and buildah's
  layer cache, which is keyed by each Dockerfile step and the files it copies: a build
  whose inputs did not change takes seconds; a change to the code re-runs the last steps
  only; a change to pyproject.toml also reinstalls the dependencies.
- `build.lock` (one build at a time, across processes and worktrees sharing the cache)
  and `build.log` (the last build's output).

`build_image()` runs `buildah bud` (chroot isolation, host network) on deploy/Dockerfile
with `BASE` set to the debootstrap base: the same file Docker builds from
debian:bookworm-slim, so the two recipes cannot drift apart (deploy/README.md).

It needs root (debootstrap and chroot isolation do) and installs buildah and debootstrap
with apt-get when they are missing. Nothing that runs in the image imports it (the
import-linter contract on flexinfer_devcluster).
"""

from __future__ import annotations

import argparse
import fnmatch
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import attrs

from flexinfer_devcluster.assets import cache_root, exclusive_lock
from flexinfer_devcluster.devcluster import process_alive

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
IGNOREFILE = ROOT / "deploy" / "Dockerfile.dockerignore"
DEFAULT_TAG = "localhost/flexinfer:0.1.0"
BASE_REPOSITORY = "localhost/flexinfer-base"
# Every build is also tagged `<BUILD_REPOSITORY>:<input digest>`: the same inputs are not
# built twice, and worktrees sharing the cache keep their images apart.
BUILD_REPOSITORY = "localhost/flexinfer-build"
KEPT_BUILDS = 3

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
# command -> the Debian package that brings it
TOOLS = {"buildah": "buildah", "debootstrap": "debootstrap"}
KEYRING_PACKAGE = "debian-archive-keyring"
# The pip steps of the Dockerfile mount this build secret as their CA bundle (a
# TLS-intercepting proxy); it is never stored in the image.
PIP_CA_SECRET = "pip-ca"
SYSTEM_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# Working containers are named `<prefix><pid>-<purpose>-<random>`, so a build can remove
# those whose process died without cleaning up (each is a full copy of the image on vfs).
CONTAINER_PREFIX = "flexinfer-image-"
LOG_TAIL_LINES = 40

# Bump when the trimming below changes in a way the texts do not show.
RECIPE_VERSION = 1
# The config of debian:<suite>-slim: PATH and an interactive shell.
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SOURCES = f"""\
Types: deb
URIs: {MIRROR}
Suites: {SUITE} {SUITE}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: {SECURITY_MIRROR}
Suites: {SUITE}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
# What the slim images leave out, for packages installed later as well as now.
SLIM_EXCLUDES = (
    "/usr/share/doc/*",
    "/usr/share/groff/*",
    "/usr/share/info/*",
    "/usr/share/linda/*",
    "/usr/share/lintian/overrides/*",
    "/usr/share/locale/*",
    "/usr/share/man/*",
)
SLIM_INCLUDES = ("/usr/share/doc/*/copyright",)
DPKG_CONFIG = "".join(
    [f"path-exclude {p}\n" for p in SLIM_EXCLUDES] + [f"path-include {p}\n" for p in SLIM_INCLUDES]
)
_NO_APT_CACHE = (
    '"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb '
    '/var/cache/apt/*.bin || true"'
)
APT_CONFIG = {
    "flexinfer-clean": (
        f"DPkg::Post-Invoke {{ {_NO_APT_CACHE}; }};\n"
        f"APT::Update::Post-Invoke {{ {_NO_APT_CACHE}; }};\n"
        'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n'
    ),
    "flexinfer-no-languages": 'Acquire::Languages "none";\n',
    "flexinfer-gzip-indexes": 'Acquire::GzipIndexes "true";\n',
    "flexinfer-autoremove-suggests": 'Apt::AutoRemove::SuggestsImportant "false";\n',
}
# Left behind by debootstrap: the build host's names and resolver, package lists,
# logs, backups.
HOST_LEFTOVERS = (
    "etc/hostname",
    "etc/resolv.conf",
    "etc/apt/sources.list",
    "var/cache/ldconfig/aux-cache",
    "var/log/bootstrap.log",
    "var/log/dpkg.log",
    "var/log/alternatives.log",
)
LEFTOVER_PATTERNS = (
    "dev/*",
    "var/lib/apt/lists/*",
    "var/cache/apt/*.bin",
    "var/cache/apt/archives/*.deb",
    "var/log/apt/*",
    "var/cache/debconf/*-old",
    "var/lib/dpkg/*-old",
)


class ImageError(RuntimeError):
    """The image could not be built; the message says which step and why."""


@attrs.frozen
class ImageBuild:
    """One `build_image()`: what was built, from which base, and how long it took."""

    tag: str
    image_id: str
    base: str
    reused: bool
    """True when an image of the same inputs existed and was tagged again."""
    base_seconds: float
    """Making (or finding) the base; minutes only when the base had to be bootstrapped."""
    build_seconds: float
    container: str | None = None
    """A working container of the image, when `build_image` was asked for one."""


@attrs.frozen
class Buildah:
    """buildah on the storage under `storage_dir` (vfs): commands and their answers."""

    storage_dir: Path

    def command(self, *args: str) -> list[str]:
        return [
            "buildah",
            "--root", str(self.storage_dir / "storage"),
            "--runroot", str(self.storage_dir / "run"),
            "--storage-driver", "vfs",
            *args,
        ]  # fmt: skip

    def output(self, *args: str, timeout: float = 600) -> str:
        """stdout of `buildah <args>`; ImageError (with stderr) when it fails."""
        result = subprocess.run(
            self.command(*args), capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            raise ImageError(f"buildah {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def has_image(self, name: str) -> bool:
        result = subprocess.run(
            self.command("inspect", "--type", "image", name),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return result.returncode == 0

    def image_config(self, image: str) -> dict[str, Any]:
        """The image's OCI config (User, Env, Cmd, WorkingDir, ...)."""
        inspected = json.loads(self.output("inspect", "--type", "image", image))
        config: dict[str, Any] = inspected["OCIv1"]["config"]
        return config

    def image_id(self, image: str) -> str:
        return self.output(
            "inspect", "--type", "image", "--format", "{{.FromImageID}}", image
        ).strip()

    def images(self) -> list[dict[str, Any]]:
        listed = json.loads(self.output("images", "--json") or "null")
        return list(listed or [])

    def containers(self) -> list[dict[str, Any]]:
        listed = json.loads(self.output("containers", "--json") or "null")
        return list(listed or [])

    def from_image(self, image: str, *, name: str) -> str:
        """A working container of `image` (vfs: a full copy of its files)."""
        return self.output("from", "--pull=never", "--name", name, image).strip()

    def mount(self, container: str) -> Path:
        return Path(self.output("mount", container).strip())

    def remove_container(self, container: str) -> None:
        self.output("rm", container)

    def run_command(
        self,
        container: str,
        argv: Sequence[str],
        *,
        volumes: Mapping[Path, str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> list[str]:
        """The command line that runs `argv` in `container` as its image's USER.

        chroot isolation and the host's network, as a pod with hostNetwork would see
        it; `volumes` are bind mounts (host path -> path in the container, read-only).
        A container path must not pass through a symlink (Debian's /var/run): buildah
        1.28's chroot isolation resolves it on the host and mounts outside the container.
        """
        options: list[str] = ["run", "--isolation", "chroot", "--network", "host"]
        for source, target in (volumes or {}).items():
            options += ["--volume", f"{source}:{target}:ro"]
        for key, value in (env or {}).items():
            options += ["--env", f"{key}={value}"]
        return self.command(*options, container, "--", *argv)


def image_cache_dir() -> Path:
    return cache_root() / "image"


def default_buildah() -> Buildah:
    return Buildah(image_cache_dir() / "containers")


def container_name(purpose: str) -> str:
    """A working-container name that records our pid (see `remove_abandoned_containers`)."""
    return f"{CONTAINER_PREFIX}{os.getpid()}-{purpose}-{uuid.uuid4().hex[:6]}"


def require_root() -> None:
    if os.geteuid() != 0:
        raise ImageError(
            "building the image needs root: debootstrap and buildah's chroot isolation "
            "do (run `sudo make image`)"
        )


def ensure_tools(*, log: TextIO) -> None:
    """Install buildah, debootstrap and Debian's archive keyring with apt-get if missing."""
    missing = [package for command, package in TOOLS.items() if shutil.which(command) is None]
    if not KEYRING.is_file():
        missing.append(KEYRING_PACKAGE)
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise ImageError(
            f"{', '.join(missing)} missing and there is no apt-get to install them with"
        )
    _say(f"installing {', '.join(missing)} with apt-get", log=log)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *missing]):
        _run_logged(step, log=log, env=env, what=" ".join(step))


def base_key(*, architecture: str, debootstrap_version: str) -> str:
    """What the base is made of, hashed: a change to any part means a new base."""
    recipe = {
        "suite": SUITE,
        "variant": "minbase",
        "architecture": architecture,
        "mirror": MIRROR,
        "sources": SOURCES,
        "dpkg": DPKG_CONFIG,
        "apt": APT_CONFIG,
        "leftovers": [HOST_LEFTOVERS, LEFTOVER_PATTERNS],
        "recipe": RECIPE_VERSION,
        "debootstrap": debootstrap_version,
    }
    encoded = json.dumps(recipe, sort_keys=True).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


def current_base_key() -> str:
    architecture = _stdout(["dpkg", "--print-architecture"]).strip()
    version = _stdout(["debootstrap", "--version"]).strip()
    return base_key(architecture=architecture, debootstrap_version=version)


def ensure_base(buildah: Buildah, *, log: TextIO) -> str:
    """The base image's name, bootstrapping and importing it when it is not cached.

    Call with the build lock held.
    """
    key = current_base_key()
    name = f"{BASE_REPOSITORY}:{key}"
    if buildah.has_image(name):
        return name
    directory = image_cache_dir()
    archive = directory / f"base-{key}.tar"
    if not archive.is_file():
        _bootstrap(archive, log=log)
    for stale in directory.glob("base-*.tar"):
        if stale != archive:
            stale.unlink()
    _say(f"importing {archive.name} as {name}", log=log)
    container = buildah.output("from", "--name", container_name("base"), "scratch").strip()
    try:
        buildah.output("add", container, str(archive), "/")
        buildah.output(
            "config", "--env", f"PATH={BASE_PATH}", "--cmd", "bash", "--created-by",
            f"debootstrap --variant=minbase {SUITE} ({archive.name})", container,
        )  # fmt: skip
        buildah.output("commit", "--rm", container, name)
    except BaseException:
        subprocess.run(buildah.command("rm", container), capture_output=True, check=False)
        raise
    for image in buildah.images():
        for other in image.get("names") or []:
            if other.startswith(f"{BASE_REPOSITORY}:") and other != name:
                buildah.output("rmi", other)
    return name


def _bootstrap(archive: Path, *, log: TextIO) -> None:
    staging = Path(tempfile.mkdtemp(prefix=".base-", dir=archive.parent))
    rootfs = staging / "rootfs"
    try:
        _say(
            f"debootstrap --variant=minbase {SUITE} from {MIRROR} (minutes, once per "
            f"base; output in {log_path()})",
            log=log,
        )
        _run_logged(
            [
                "debootstrap", "--variant=minbase", f"--keyring={KEYRING}",
                SUITE, str(rootfs), MIRROR,
            ],
            log=log,
            what="debootstrap",
        )  # fmt: skip
        trim_like_slim(rootfs)
        partial = staging / "base.tar"
        _run_logged(
            ["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", str(partial), "."],
            log=log,
            what="tar of the base",
        )
        partial.rename(archive)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def trim_like_slim(rootfs: Path) -> None:
    """Make a debootstrap tree match debian:<suite>-slim (see the module docstring)."""
    for relative in HOST_LEFTOVERS:
        (rootfs / relative).unlink(missing_ok=True)
    for pattern in LEFTOVER_PATTERNS:
        for path in rootfs.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                if path.name != "partial":  # apt wants it to exist
                    shutil.rmtree(path)
            else:
                path.unlink()
    for path in _slim_excluded(rootfs):
        path.unlink()
    (rootfs / "etc/dpkg/dpkg.cfg.d/flexinfer-slim").write_text(DPKG_CONFIG)
    for name, text in APT_CONFIG.items():
        (rootfs / "etc/apt/apt.conf.d" / name).write_text(text)
    (rootfs / "etc/apt/sources.list.d/debian.sources").write_text(SOURCES)


def _slim_excluded(rootfs: Path) -> Iterator[Path]:
    """Files the dpkg excludes would have kept out had they been set before debootstrap."""
    for pattern in SLIM_EXCLUDES:
        top = rootfs / pattern.strip("/").removesuffix("/*")
        if not top.is_dir():
            continue
        for directory, _, files in os.walk(top):
            for file in files:
                path = Path(directory) / file
                inside = "/" + str(path.relative_to(rootfs))
                if not any(fnmatch.fnmatch(inside, keep) for keep in SLIM_INCLUDES):
                    yield path


def pip_ca_bundle() -> Path | None:
    """The CA bundle pip trusts on this machine (`$PIP_CERT`, else the system's)."""
    explicit = os.environ.get("PIP_CERT")
    for candidate in (Path(explicit) if explicit else None, SYSTEM_CA_BUNDLE):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def bud_command(buildah: Buildah, *, base: str, tags: Sequence[str], context: Path) -> list[str]:
    """`buildah bud` of deploy/Dockerfile on `base`, as `make image` runs it."""
    secret = pip_ca_bundle()
    return buildah.command(
        "bud",
        "--isolation", "chroot",
        "--network", "host",
        "--layers",
        "--force-rm",
        "--pull=never",
        "--build-arg", f"BASE={base}",
        *(["--secret", f"id={PIP_CA_SECRET},src={secret}"] if secret else []),
        "--ignorefile", str(context / IGNOREFILE.relative_to(ROOT)),
        "--file", str(context / DOCKERFILE.relative_to(ROOT)),
        *(option for tag in tags for option in ("--tag", tag)),
        str(context),
    )  # fmt: skip


def build_image(
    *,
    tag: str = DEFAULT_TAG,
    context: Path = ROOT,
    container: str | None = None,
    log: TextIO | None = None,
) -> ImageBuild:
    """Build deploy/Dockerfile on the debootstrap base; see the module docstring.

    An image already built from the same inputs (`input_digest`) is tagged again rather
    than rebuilt. `container`: also make a working container of the image with this
    name, under the same lock, so that a concurrent build cannot untag and prune the
    image first. `log` receives the progress lines (default: stderr); the tools' full
    output goes to `build.log` in the cache.
    """
    log = log or sys.stderr
    require_root()
    ensure_tools(log=log)
    directory = image_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    buildah = default_buildah()
    with exclusive_lock(directory / "build.lock", log=True):
        log_path().write_text("")
        started = time.monotonic()
        base = ensure_base(buildah, log=log)
        base_done = time.monotonic()
        remove_abandoned_containers(buildah)
        built = f"{BUILD_REPOSITORY}:{input_digest(context, base=base)}"
        reused = buildah.has_image(built)
        if reused:
            _say(f"{tag} is {built}: its inputs did not change", log=log)
            buildah.output("tag", built, tag)
        else:
            _say(f"buildah bud {DOCKERFILE.relative_to(ROOT)} on {base} as {tag}", log=log)
            _run_logged(
                bud_command(buildah, base=base, tags=(tag, built), context=context),
                log=log,
                what="buildah bud",
            )
        image_id = buildah.image_id(built)
        forget_old_builds(buildah, keep=KEPT_BUILDS)
        made = buildah.from_image(image_id, name=container) if container else None
        finished = time.monotonic()
    return ImageBuild(
        tag=tag,
        image_id=image_id,
        base=base,
        reused=reused,
        base_seconds=round(base_done - started, 1),
        build_seconds=round(finished - started, 1),
        container=made,
    )


def input_digest(context: Path, *, base: str) -> str:
    """A hash of everything `buildah bud` reads: the Dockerfile, its ignore file, the base
    and the files of the context the ignore file lets through (its `!` lines).

    What the Dockerfile fetches (Debian's packages, PyPI's) is not in it, as it is not in
    buildah's or Docker's layer cache either: delete the cache to pick up new releases.
    """
    dockerfile = context / DOCKERFILE.relative_to(ROOT)
    ignorefile = context / IGNOREFILE.relative_to(ROOT)
    digest = hashlib.sha256()
    for part in (base.encode(), dockerfile.read_bytes(), ignorefile.read_bytes()):
        digest.update(len(part).to_bytes(8, "big") + part)
    allowed = [
        line[1:].strip()
        for line in ignorefile.read_text().splitlines()
        if line.startswith("!") and line[1:].strip()
    ]
    for name in sorted(allowed):
        top = context / name
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in files:
            relative = path.relative_to(context)
            if "__pycache__" in relative.parts or path.suffix == ".pyc":
                continue
            mode = b"x" if os.access(path, os.X_OK) else b"-"
            for part in (str(relative).encode(), mode, path.read_bytes()):
                digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()[:16]


def forget_old_builds(buildah: Buildah, *, keep: int) -> None:
    """Untag all but the `keep` newest builds, then drop layers no tag reaches any more
    (each build's own layers are full copies of the image on vfs)."""
    builds = [
        (int(image.get("created") or 0), name)
        for image in buildah.images()
        for name in image.get("names") or []
        if name.startswith(f"{BUILD_REPOSITORY}:")
    ]
    for _, name in sorted(builds, reverse=True)[keep:]:
        # An image a working container still uses cannot go; it goes on a later build.
        subprocess.run(buildah.command("rmi", name), capture_output=True, check=False)
    buildah.output("rmi", "--prune")


def remove_abandoned_containers(buildah: Buildah) -> list[str]:
    """Remove working containers nobody will use again (each is a full copy on vfs).

    Call with the build lock held: then a container that is not ours by name was left by
    an interrupted `buildah bud`, and one of ours whose process is gone by a killed run.
    """
    ours = re.compile(rf"^{re.escape(CONTAINER_PREFIX)}(\d+)-")
    removed = []
    for listed in buildah.containers():
        name = str(listed.get("containername") or "")
        match = ours.match(name)
        if match is None or not process_alive(int(match.group(1))):
            buildah.remove_container(name)
            removed.append(name)
    return removed


def image_sizes(buildah: Buildah, image: str) -> dict[str, int]:
    """The image's bytes as a registry stores them (gzip layers) and unpacked (the layers'
    tar streams), from a push to a temporary OCI layout."""
    compressed = uncompressed = 0
    with tempfile.TemporaryDirectory(prefix="flexinfer-image-size-") as scratch:
        layout = Path(scratch)
        buildah.output("push", "--quiet", image, f"oci:{layout}")
        blobs = layout / "blobs" / "sha256"
        index = json.loads((layout / "index.json").read_text())
        manifest_digest = index["manifests"][0]["digest"].split(":", 1)[1]
        layers = json.loads((blobs / manifest_digest).read_text())["layers"]
        for layer in layers:
            compressed += int(layer["size"])
            with gzip.open(blobs / layer["digest"].split(":", 1)[1]) as stream:
                while chunk := stream.read(1 << 20):
                    uncompressed += len(chunk)
    return {
        "compressed_bytes": compressed,
        "uncompressed_bytes": uncompressed,
        "layers": len(layers),
    }


def log_path() -> Path:
    return image_cache_dir() / "build.log"


def _run_logged(
    command: Sequence[str], *, log: TextIO, what: str, env: Mapping[str, str] | None = None
) -> None:
    """Run `command` with its output appended to build.log; ImageError with the tail."""
    path = log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as sink:
        sink.write(f"== {' '.join(command)}\n")
        sink.flush()
        result = subprocess.run(
            list(command), stdout=sink, stderr=subprocess.STDOUT, env=env, check=False
        )
    if result.returncode != 0:
        lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        raise ImageError(
            f"{what} failed (exit {result.returncode}); last lines of {path}:\n" + "\n".join(lines)
        )


def _stdout(command: Sequence[str]) -> str:
    result = subprocess.run(list(command), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ImageError(f"{' '.join(command)} failed: {result.stderr.strip()}")
    return result.stdout


def _say(message: str, *, log: TextIO) -> None:
    print(f"flexinfer image: {message}", file=log, flush=True)
    if log_path().parent.is_dir():
        with log_path().open("a") as sink:
            sink.write(f"== {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flexinfer_devcluster.image",
        description="Build deploy/Dockerfile with buildah on a debootstrap base (no Docker) "
        "and print what was built as JSON.",
    )
    parser.add_argument("--tag", default=DEFAULT_TAG, help=f"image name (default {DEFAULT_TAG})")
    parser.add_argument(
        "--sizes",
        action="store_true",
        help="also measure the image's compressed and uncompressed bytes (pushes it to a "
        "temporary OCI layout; seconds)",
    )
    args = parser.parse_args(argv)
    try:
        build = build_image(tag=args.tag)
        report: dict[str, Any] = attrs.asdict(build)
        report.pop("container")
        if args.sizes:
            report.update(image_sizes(default_buildah(), build.image_id))
    except ImageError as error:
        print(f"flexinfer image: {error}", file=sys.stderr)
        return 1
    report["storage"] = " ".join(default_buildah().command()[1:])
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
