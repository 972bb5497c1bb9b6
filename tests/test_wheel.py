"""The wheel carries the runtime only: installed without extras into a fresh venv, the
controller and the proxy start, and neither the dev control plane nor `cryptography`
(which only the dev cluster's PKI needs) is importable."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(list(args), capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(work), str(ROOT))
    assert built.returncode == 0, built.stderr
    wheels = list(work.glob("flexinfer-*.whl"))
    assert len(wheels) == 1, wheels
    env_dir = work / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    installed = run(str(python), "-m", "pip", "install", "-q", str(wheels[0]))
    assert installed.returncode == 0, installed.stderr
    return python


def test_the_wheel_holds_no_dev_control_plane(fresh: Path) -> None:
    import zipfile

    wheel = next(fresh.parents[2].glob("flexinfer-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("flexinfer_kube/") for n in names)
    assert not [n for n in names if n.startswith("flexinfer_devcluster/")]


@pytest.mark.parametrize("module", ["flexinfer_k8s", "flexinfer_proxy"])
def test_controller_and_proxy_start_without_extras(fresh: Path, module: str) -> None:
    # Run outside the checkout, so only the installed wheel can be imported.
    result = run(str(fresh), "-m", module, "--help", cwd=fresh.parent)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


@pytest.mark.parametrize("module", ["cryptography", "flexinfer_devcluster"])
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
    """The wheel carries the CRDs (and jsonschema comes with it): `explain -f` refuses a
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
