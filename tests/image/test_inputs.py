"""When `make image` may reuse an image: the digest of its inputs (no root, no buildah).

A reused image whose inputs did change would ship old code, so the digest must move
with every file the build copies and stay put for files it never sees.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from flexinfer_devcluster.image import DOCKERFILE, IGNOREFILE, ROOT, input_digest

BASE = "localhost/flexinfer-base:0123456789abcdef"


@pytest.fixture
def context(tmp_path: Path) -> Path:
    """A copy of the parts of the repository the digest may read, plus some it must not."""
    for path in (DOCKERFILE, IGNOREFILE, ROOT / "pyproject.toml", ROOT / "README.md"):
        (tmp_path / path.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, tmp_path / path.relative_to(ROOT))
    for package in ("flexinfer_core", "flexinfer_kube", "flexinfer_k8s", "flexinfer_proxy"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(f'"""{package}"""\n')
    (tmp_path / "flexinfer_cli" / "sub").mkdir(parents=True)
    (tmp_path / "flexinfer_cli" / "sub" / "deep.py").write_text("VALUE = 1\n")
    (tmp_path / "flexinfer_devcluster").mkdir()
    (tmp_path / "flexinfer_devcluster" / "__init__.py").write_text("")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("")
    return tmp_path


@pytest.mark.parametrize(
    "changed",
    [
        "flexinfer_cli/sub/deep.py",
        "flexinfer_k8s/__init__.py",
        "flexinfer_k8s/new_module.py",
        "pyproject.toml",
        "README.md",
        "deploy/Dockerfile",
        "deploy/Dockerfile.dockerignore",
    ],
)
def test_a_change_to_what_the_build_copies_or_reads_changes_the_digest(
    context: Path, changed: str
) -> None:
    before = input_digest(context, base=BASE)
    path = context / changed
    path.write_text((path.read_text() if path.exists() else "") + "\n# changed\n")
    assert input_digest(context, base=BASE) != before


def test_a_new_base_changes_the_digest(context: Path) -> None:
    assert input_digest(context, base=BASE) != input_digest(context, base=BASE + "0")


def test_an_executable_bit_changes_the_digest(context: Path) -> None:
    before = input_digest(context, base=BASE)
    (context / "flexinfer_cli" / "sub" / "deep.py").chmod(0o755)
    assert input_digest(context, base=BASE) != before


@pytest.mark.parametrize(
    "changed",
    [
        "flexinfer_devcluster/__init__.py",
        "tests/test_x.py",
        "docs/new.md",
        "flexinfer_k8s/__pycache__/x.cpython-311.pyc",
        "flexinfer_k8s/stale.pyc",
    ],
)
def test_files_the_build_never_sees_leave_the_digest_alone(context: Path, changed: str) -> None:
    before = input_digest(context, base=BASE)
    path = context / changed
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("anything\n")
    assert input_digest(context, base=BASE) == before
