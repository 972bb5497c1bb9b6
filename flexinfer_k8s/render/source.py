"""Where a model's weights come from: the one parser of source strings.

The CRDs' patterns are the contract (`HF://org/name[:quant][/file]`,
`huggingface://org/name[:quant][/file]`, `file:///path`, `pvc://claim[/path]`,
`ollama://name[:tag]`); every other module asks this one. A `:quant` tag names one
quantisation of a GGUF repository, the way llama.cpp's `--hf-repo` and Ollama's
`hf.co/` names take it. Pure: no I/O.
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
    quant: str = ""
    """A Hugging Face GGUF repository's quantisation tag (`HF://org/repo:Q8_0`)."""

    @property
    def file_name(self) -> str:
        """The last path element ("" when the source names no file or directory)."""
        return posixpath.basename(self.path.rstrip("/"))

    @property
    def is_gguf(self) -> bool:
        return self.path.lower().endswith(".gguf")

    @property
    def gguf_quant(self) -> str:
        """The quantisation this source names: its `:quant` tag, else the one a GGUF
        file's name ends with (`model-Q8_0.gguf` → `Q8_0`); "" when neither says."""
        if self.quant:
            return self.quant
        match = _QUANT_IN_FILE_NAME.search(self.file_name) if self.is_gguf else None
        return match[1] if match else ""

    @property
    def ollama_tag(self) -> str:
        """The tag Ollama serves the model under (and pulls it by)."""
        if self.scheme is Scheme.OLLAMA:
            return self.repo
        if self.scheme is Scheme.HUGGINGFACE:
            # Ollama pulls GGUF repositories from the Hub as hf.co/<org>/<name>[:quant];
            # without a quant it picks one itself.
            quant = self.gguf_quant
            return f"hf.co/{self.repo}:{quant}" if quant else f"hf.co/{self.repo}"
        return ""


_HF = re.compile(
    r"^(?:HF|huggingface)://([A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9._-]+)"
    r"(?::([A-Za-z0-9][A-Za-z0-9._-]*))?(/\S*)?$"
)
_QUANT_IN_FILE_NAME = re.compile(
    r"[-._]((?:UD-)?(?:I?Q[0-9][A-Za-z0-9_]*|BF16|F16|F32))\.gguf$", re.IGNORECASE
)
"""The quantisation at the end of a GGUF file's name, as the Hub's GGUF repositories
name their files (`…-Q4_K_M.gguf`, `….IQ4_XS.gguf`, `…-f16.gguf`)."""
_FILE = re.compile(r"^file://(/\S+)$")
_PVC = re.compile(r"^pvc://([a-z0-9](?:[-a-z0-9.]*[a-z0-9])?)(/\S*)?$")
_OLLAMA = re.compile(r"^ollama://([A-Za-z0-9][A-Za-z0-9._/-]*(?::[A-Za-z0-9._-]+)?)$")


def parse_source(text: str, *, field: str) -> Source:
    """Parse a source string; `InvalidFieldError` names `field` and the value."""
    value = str(text or "").strip()
    if match := _HF.match(value):
        return Source(
            Scheme.HUGGINGFACE, match[1], (match[3] or "").strip("/"), value, match[2] or ""
        )
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
        "is not a source: use HF://org/name[:quant][/file], huggingface://org/name[/file], "
        "file:///path, pvc://claim[/path] or ollama://name[:tag]",
    )
