"""The tiny model is a real llama GGUF, generated, and the same seed gives the same bytes."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from flexinfer_devcluster import tinymodel
from flexinfer_devcluster.tinymodel import write_tiny_model


def test_the_same_seed_writes_the_same_bytes_and_another_seed_other_weights(
    tmp_path: Path,
) -> None:
    first = write_tiny_model(tmp_path / "a.gguf", seed=7).read_bytes()
    again = write_tiny_model(tmp_path / "b.gguf", seed=7).read_bytes()
    other = gguf.GGUFReader(write_tiny_model(tmp_path / "c.gguf", seed=8))
    assert first == again
    mine = gguf.GGUFReader(tmp_path / "a.gguf")
    embeddings = {t.name: t for t in mine.tensors}["token_embd.weight"]
    assert (embeddings.data != {t.name: t for t in other.tensors}["token_embd.weight"].data).any()


def test_it_is_a_two_layer_64_wide_llama_with_a_byte_level_vocabulary(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "tiny.gguf", name="tiny-a")
    reader = gguf.GGUFReader(path)

    def value(key: str) -> object:
        return reader.fields[key].contents()

    assert value("general.architecture") == "llama"
    assert value("general.name") == "tiny-a"
    assert value("llama.block_count") == 2
    assert value("llama.embedding_length") == 64
    assert value("tokenizer.ggml.model") == "llama"
    tokens = value("tokenizer.ggml.tokens")
    assert isinstance(tokens, list) and len(tokens) == 260
    assert [f"<0x{byte:02X}>" for byte in range(256)] == tokens[3:259]
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "output.weight", "blk.1.ffn_down.weight"} <= names
    assert 400_000 < path.stat().st_size < 550_000


def test_a_negative_seed_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"seed must be a non-negative integer, got -1"):
        write_tiny_model(tmp_path / "x.gguf", seed=-1)
    assert not list(tmp_path.iterdir()), "a refused write leaves no file behind"


def test_the_command_writes_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tinymodel.main([str(tmp_path / "m.gguf"), "--seed", "3"]) == 0
    expected = write_tiny_model(tmp_path / "n.gguf", seed=3).read_bytes()
    assert (tmp_path / "m.gguf").read_bytes() == expected
    assert "m.gguf" in capsys.readouterr().out


def test_the_declared_training_context_is_a_bounded_choice(tmp_path: Path) -> None:
    # llama-server caps each slot's context at it (the drain-deadline test needs more).
    default = gguf.GGUFReader(write_tiny_model(tmp_path / "d.gguf"))
    assert default.fields["llama.context_length"].contents() == tinymodel.CONTEXT_LENGTH
    long = gguf.GGUFReader(write_tiny_model(tmp_path / "l.gguf", context_length=131072))
    assert long.fields["llama.context_length"].contents() == 131072
    for bad in (0, tinymodel.MAX_CONTEXT_LENGTH + 1, True):
        with pytest.raises(ValueError, match=rf"context_length must be .*, got {bad!r}"):
            write_tiny_model(tmp_path / "x.gguf", context_length=bad)
    assert not (tmp_path / "x.gguf").exists()
    with pytest.raises(SystemExit):
        tinymodel.main([str(tmp_path / "y.gguf"), "--context-length", "0"])
