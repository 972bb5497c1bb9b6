"""Where a model's weights come from: the one parser of source strings.

The CRDs' patterns are the contract (`HF://org/name[/file]`,
`huggingface://org/name[/file]`, `file:///path`, `pvc://claim[/path]`,
`ollama://name[:tag]`); every other module asks this one. Pure: no I/O.
"""

from __future__ import annotations

import enum
import posixpath
import re

import attrs

from flexinfer_core import InvalidFieldError


class Scheme(enum.StrEnum):
    HUGGINGFACE = "huggingface"
    FILE = "file"
    PVC = "pvc"
    OLLAMA = "ollama"


@attrs.frozen
class Source:
    """A parsed source. `repo` is `org/name` (Hugging Face), the claim (pvc) or the
    model tag (ollama); `path` is the file or directory inside it ("" for all of it)."""

    scheme: Scheme
    repo: str
    path: str = ""
    text: str = ""

    @property
    def file_name(self) -> str:
        """The last path element ("" when the source names no file or directory)."""
        return posixpath.basename(self.path.rstrip("/"))

    @property
    def is_gguf(self) -> bool:
        return self.path.lower().endswith(".gguf")

    @property
    def ollama_tag(self) -> str:
        """The tag Ollama serves the model under (and pulls it by)."""
        if self.scheme is Scheme.OLLAMA:
            return self.repo
        if self.scheme is Scheme.HUGGINGFACE:
            # Ollama pulls GGUF repositories from the Hub as hf.co/<org>/<name>.
            return f"hf.co/{self.repo}"
        return ""


_HF = re.compile(r"^(?:HF|huggingface)://([A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+)(/\S*)?$")
_FILE = re.compile(r"^file://(/\S+)$")
_PVC = re.compile(r"^pvc://([a-z0-9](?:[-a-z0-9.]*[a-z0-9])?)(/\S*)?$")
_OLLAMA = re.compile(r"^ollama://([A-Za-z0-9][A-Za-z0-9._/-]*(?::[A-Za-z0-9._-]+)?)$")


def parse_source(text: str, *, field: str) -> Source:
    """Parse a source string; `InvalidFieldError` names `field` and the value."""
    value = str(text or "").strip()
    if match := _HF.match(value):
        return Source(Scheme.HUGGINGFACE, match[1], (match[2] or "").strip("/"), value)
    if match := _FILE.match(value):
        path = posixpath.normpath(match[1])
        return Source(Scheme.FILE, "", path, value)
    if match := _PVC.match(value):
        return Source(Scheme.PVC, match[1], (match[2] or "").strip("/"), value)
    if match := _OLLAMA.match(value):
        return Source(Scheme.OLLAMA, match[1], "", value)
    raise InvalidFieldError(
        field,
        value,
        "is not a source: use HF://org/name[/file], huggingface://org/name[/file], "
        "file:///path, pvc://claim[/path] or ollama://name[:tag]",
    )
