"""The repository stands alone: every file it cites is in it.

A reader has the repository and nothing else, so a docstring, comment, CRD or page
that cites a file must cite one that exists here: a path from the repository root
(`docs/election.md`, `flexinfer_core/leases.py`) in any .py, .md or .yaml file, and
a Markdown link relative to its page, with its `#anchor` one of the target page's
headings. Citing the design notes the project was specified from (a `spec/…md`, or
anything under `../shared`) is refused outright: what they say belongs in docs/.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".md", ".yaml", ".yml"}
SKIPPED_DIRS = {
    ".git",
    ".venv",
    "node_modules",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "build",
    "dist",
}
# Where a repository path may start; the repository's own top-level entries.
TOP = sorted(p.name for p in ROOT.iterdir() if not p.name.startswith(".") and p.is_dir())
PATH = re.compile(
    r"(?<![\w/.:-])((?:" + "|".join(map(re.escape, TOP)) + r")/[\w./-]*[\w/])(?![\w*<{])"
)
# A path counts as a citation when it names a file by its suffix, or a directory by its
# trailing slash: `deploy/flexinfer-controller` in a kubectl command, or a module
# named without `.py`, is not one.
CITED = re.compile(r"(\.(md|py|yaml|yml|json|toml|txt|sh|cfg)|/)$")
# Files whose paths are made-up data, not citations.
MADE_UP = {"tests/image/test_inputs.py"}  # paths a test feeds to the image's input filter
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`[^`]*`")
# Built from parts, so that this file does not cite them itself.
OUTSIDE = re.compile(r"\bspec/[\w.-]+\.md\b|\.\./shared\b|/work/" + "shared\\b")


def repository_files() -> Iterator[Path]:
    for path in sorted(ROOT.rglob("*")):
        parts = set(path.relative_to(ROOT).parts)
        if (
            path.suffix in SUFFIXES
            and path.is_file()
            and not parts & SKIPPED_DIRS
            and not any(p.endswith(".egg-info") for p in parts)
        ):
            yield path


FILES = list(repository_files())


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    yield from enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    fenced = False
    for _, line in _lines(page):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not re.match(r"#{1,6} ", line):
            continue
        base = slug(line.lstrip("#"))
        seen = counts.get(base, 0)
        counts[base] = seen + 1
        found.add(base if seen == 0 else f"{base}-{seen}")
    return found


def test_the_walk_sees_the_repository() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in FILES}
    assert {"docs/election.md", "crds/ai.flexinfer_models.yaml", "flexinfer_core/election.py"} <= (
        names
    )
    assert not any(name.startswith(".venv/") for name in names)


def test_nothing_cites_the_specification_notes() -> None:
    cited = [
        f"{path.relative_to(ROOT)}:{number}: {match.group(0)}"
        for path in FILES
        if path != Path(__file__).resolve()
        for number, line in _lines(path)
        for match in OUTSIDE.finditer(line)
    ]
    assert cited == [], "cite docs/ instead: " + "; ".join(cited)


def test_every_repository_path_exists() -> None:
    missing = []
    for path in FILES:
        if path.relative_to(ROOT).as_posix() in MADE_UP:
            continue
        for number, line in _lines(path):
            for match in PATH.finditer(line):
                target = match.group(1).rstrip(".")
                if CITED.search(target) and not (ROOT / target).exists():
                    missing.append(f"{path.relative_to(ROOT)}:{number}: {target}")
    assert missing == []


@pytest.mark.parametrize(
    "page", [p for p in FILES if p.suffix == ".md"], ids=lambda p: str(p.relative_to(ROOT))
)
def test_every_markdown_link_resolves(page: Path) -> None:
    broken = []
    fenced = False
    for number, line in _lines(page):
        if line.startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        for match in LINK.finditer(CODE.sub("", line)):
            target = match.group(1)
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            resolved = (page.parent / file_part).resolve() if file_part else page
            if not resolved.exists():
                broken.append(f"{number}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{number}: {target} (no such heading)")
    assert broken == []


SECTION = re.compile(
    r"election\.md`?\)?,? (?:section )?(\d+(?:\.\d+)?)"
    r"(?:\s*(?:–|-|and)\s*(\d+(?:\.\d+)?))?"
)


def test_every_cited_rule_book_section_exists() -> None:
    numbered = {
        match.group(1)
        for _, line in _lines(ROOT / "docs" / "election.md")
        if (match := re.match(r"#{2,3} (\d+(?:\.\d+)?)\.? ", line))
    }
    assert {"1", "1.1", "1.2", "1.3", "1.4", "2", "3", "4"} <= numbered
    unknown = [
        f"{path.relative_to(ROOT)}:{number}: {section}"
        for path in FILES
        for number, line in _lines(path)
        for match in SECTION.finditer(line)
        for section in match.groups()
        if section is not None and section not in numbered
    ]
    assert unknown == []
