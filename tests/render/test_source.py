"""The one parser of source URLs."""

from __future__ import annotations

import pytest

from flexinfer_core import InvalidFieldError
from flexinfer_k8s.render.source import Scheme, Source, parse_source


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("HF://org/name", Source(Scheme.HUGGINGFACE, "org/name", "", "HF://org/name")),
        ("huggingface://org/name/sub/model.gguf",
         Source(Scheme.HUGGINGFACE, "org/name", "sub/model.gguf",
                "huggingface://org/name/sub/model.gguf")),
        ("file:///srv/models/../models/x.gguf",
         Source(Scheme.FILE, "", "/srv/models/x.gguf", "file:///srv/models/../models/x.gguf")),
        ("pvc://claim", Source(Scheme.PVC, "claim", "", "pvc://claim")),
        ("pvc://claim/a/b/", Source(Scheme.PVC, "claim", "a/b", "pvc://claim/a/b/")),
        ("ollama://llama3.2:1b", Source(Scheme.OLLAMA, "llama3.2:1b", "", "ollama://llama3.2:1b")),
    ],
)
def test_sources_parse(text: str, expected: Source) -> None:
    assert parse_source(text, field="spec.source") == expected


@pytest.mark.parametrize("text", ["", "s3://bucket/x", "HF://noslash", "file://relative",
                                  "pvc://Bad_Claim", "ollama://"])
def test_a_bad_source_names_the_field_and_the_value(text: str) -> None:
    with pytest.raises(InvalidFieldError) as error:
        parse_source(text, field="spec.source")
    assert str(error.value).startswith(f"spec.source: {text!r} is not a source")


def test_ollama_tags() -> None:
    assert parse_source("HF://org/repo", field="f").ollama_tag == "hf.co/org/repo"
    assert parse_source("ollama://qwen2.5:7b", field="f").ollama_tag == "qwen2.5:7b"
