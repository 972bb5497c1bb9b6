"""The wheel, installed as users install it.

Bare (`pip install flexinfer`): the pure core and attrs, nothing else. It imports and
decides a group; kubernetes, PyYAML and hypothesis are not there; every entry point
says which extra to install instead of a traceback. The bare venv is installed with
`--no-index` from a wheelhouse holding only our wheel and attrs, so nothing else can
come in.

With the `controller`, `proxy` and `cli` extras (what the image installs): the
controller and the proxy start, and neither the dev control plane nor `cryptography`
(which only the dev cluster's PKI needs) is importable.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from flexinfer_kube.extras import EXTRA_MODULES

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_EXTRAS = "controller,proxy,cli"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(list(args), capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Our wheel, and attrs's at the version this checkout runs (pip's cache has it)."""
    work = tmp_path_factory.mktemp("wheelhouse")
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work), str(ROOT))
    assert built.returncode == 0, built.stderr
    attrs_version = metadata.version("attrs")
    fetched = run(
        sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
        "-d", str(work), f"attrs=={attrs_version}",
    )  # fmt: skip
    assert fetched.returncode == 0, fetched.stderr
    assert len(list(work.glob("flexinfer-*.whl"))) == 1
    return work


def new_venv(where: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(where)
    return where / "bin" / "python"


@pytest.fixture(scope="module")
def bare(wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    python = new_venv(tmp_path_factory.mktemp("bare") / "venv")
    installed = run(
        str(python), "-m", "pip", "install", "-q", "--no-index",
        "--find-links", str(wheelhouse), "flexinfer",
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    return python


@pytest.fixture(scope="module")
def fresh(wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel with the extras the image installs, their dependencies from the index."""
    python = new_venv(tmp_path_factory.mktemp("full") / "venv")
    wheel = next(wheelhouse.glob("flexinfer-*.whl"))
    installed = run(str(python), "-m", "pip", "install", "-q", f"{wheel}[{RUNTIME_EXTRAS}]")
    assert installed.returncode == 0, installed.stderr
    return python


# --- bare: the core alone ------------------------------------------------------------

DECIDE = """
from datetime import UTC, datetime, timedelta
from flexinfer_core import ModelState, decide_group
now = datetime(2026, 1, 1, tzinfo=UTC)
decision = decide_group(
    [ModelState(name="chat", group="gpu", last_active=now - timedelta(seconds=30)),
     ModelState(name="coder", group="gpu", priority=500)],
    now=now,
)
print(decision.leader, decision.reason)
"""


def test_the_bare_install_holds_the_core_and_attrs_only(bare: Path) -> None:
    listed = run(str(bare), "-m", "pip", "list", "--format=freeze", cwd=bare.parent)
    names = {line.split("==")[0].lower() for line in listed.stdout.split()}
    # (pip and setuptools come with every new venv.)
    assert names - {"pip", "setuptools"} == {"attrs", "flexinfer"}, names


def test_the_bare_install_decides_a_group(bare: Path) -> None:
    result = run(str(bare), "-c", DECIDE, cwd=bare.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["chat", "RecentDemand"]


@pytest.mark.parametrize("module", ["kubernetes", "yaml", "hypothesis", "aiohttp"])
def test_the_bare_install_has_no_extras(bare: Path, module: str) -> None:
    result = run(str(bare), "-c", f"import {module}", cwd=bare.parent)
    assert result.returncode != 0
    assert f"No module named '{module}'" in result.stderr


@pytest.mark.parametrize(
    ("command", "extra"),
    [
        (["bin/flexinfer", "status"], "cli"),
        (["bin/kubectl-flexinfer", "--help"], "cli"),
        (["bin/python", "-m", "flexinfer_k8s", "--help"], "controller"),
        (["bin/python", "-m", "flexinfer_proxy", "--help"], "proxy"),
    ],
)
def test_entry_points_say_which_extra_to_install(
    bare: Path, command: list[str], extra: str
) -> None:
    home = bare.parents[1]
    result = run(str(home / command[0]), *command[1:], cwd=home)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert f"needs the `{extra}` extra" in result.stderr
    assert f"pip install 'flexinfer[{extra}]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_testing_harness_says_which_extra_to_install(bare: Path) -> None:
    result = run(str(bare), "-c", "import flexinfer_core.testing", cwd=bare.parent)
    assert result.returncode != 0
    assert "pip install 'flexinfer[testing]'" in result.stderr


def test_extra_modules_match_pyproject() -> None:
    """What the entry points check is what pyproject.toml's extras install."""
    import_names = {
        "kubernetes": "kubernetes",
        "prometheus-client": "prometheus_client",
        "pyyaml": "yaml",
        "aiohttp": "aiohttp",
        "httptools": "httptools",
        "jsonschema": "jsonschema",
    }
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra, modules in EXTRA_MODULES.items():
        required = {
            import_names[req.split(">")[0].split(";")[0].strip().lower()]
            for req in extras[extra]
            if not req.startswith("uvloop")
        }
        assert set(modules) == required, extra


# --- with the runtime extras ---------------------------------------------------------


def test_the_wheel_holds_no_dev_control_plane(wheelhouse: Path) -> None:
    wheel = next(wheelhouse.glob("flexinfer-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("flexinfer_kube/") for n in names)
    assert any(n.startswith("flexinfer_core/testing/") for n in names)
    assert not [n for n in names if n.startswith("flexinfer_devcluster/")]


def test_the_wheel_holds_the_live_page(wheelhouse: Path) -> None:
    # Package data, not a module: the proxy's `/ui` reads it from the installed package
    # (and the image installs this wheel).
    wheel = next(wheelhouse.glob("flexinfer-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        page = archive.read("flexinfer_proxy/live_page.html")
    assert b'fetch("status.json"' in page


@pytest.mark.parametrize("module", ["flexinfer_k8s", "flexinfer_proxy"])
def test_controller_and_proxy_start_with_their_extras(fresh: Path, module: str) -> None:
    # Run outside the checkout, so only the installed wheel can be imported.
    result = run(str(fresh), "-m", module, "--help", cwd=fresh.parent)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


@pytest.mark.parametrize("module", ["cryptography", "flexinfer_devcluster", "hypothesis"])
def test_dev_packages_are_not_importable(fresh: Path, module: str) -> None:
    result = run(str(fresh), "-c", f"import {module}", cwd=fresh.parent)
    assert result.returncode != 0
    assert f"No module named '{module}'" in result.stderr


@pytest.mark.parametrize("verb", [["demo"], ["dev", "cluster", "up"]])
def test_the_dev_verbs_say_what_to_install(fresh: Path, verb: list[str]) -> None:
    command = fresh.parent / "flexinfer"
    result = run(str(command), *verb, cwd=fresh.parent)
    assert result.returncode == 2, result.stderr
    assert "the local control plane is not installed" in result.stderr
    assert "pip install -e '.[dev]'" in result.stderr


def test_the_command_checks_manifests_with_the_packaged_crds(fresh: Path) -> None:
    """The wheel carries the CRDs (and the cli extra jsonschema): `explain -f` refuses a
    bad manifest naming the field, outside any checkout."""
    bad = fresh.parent / "bad.yaml"
    bad.write_text(
        "kind: Model\napiVersion: ai.flexinfer/v1alpha2\nmetadata: {name: x}\n"
        "spec: {backend: vllm, source: 'HF://a/b', gpu: {priority: 5000}}\n"
    )
    result = run(
        str(fresh.parent / "flexinfer"), "explain", "model/x", "-f", str(bad), cwd=fresh.parent
    )
    assert result.returncode == 2, result.stderr
    assert "spec.gpu.priority: 5000 is greater than the maximum of 1000" in result.stderr


def test_kubectl_plugin_and_plot_extra(fresh: Path) -> None:
    """`kubectl-flexinfer` is installed beside `flexinfer`; without the `plot` extra,
    `simulate --plot` says what to install."""
    plugin = run(str(fresh.parent / "kubectl-flexinfer"), "--help", cwd=fresh.parent)
    assert plugin.returncode == 0 and "usage: kubectl flexinfer" in plugin.stdout
    scenario = fresh.parent / "one.yaml"
    scenario.write_text("models: [{name: a}]\n")
    result = run(
        str(fresh.parent / "flexinfer"),
        "simulate",
        str(scenario),
        "--plot",
        "x.png",
        cwd=fresh.parent,
    )
    assert result.returncode == 2
    assert "pip install 'flexinfer[plot]'" in result.stderr
