"""A tiny llama-architecture GGUF with random weights, generated on demand, never downloaded.

`write_tiny_model(path, seed=...)` writes a 2-layer, 64-wide llama model (about 470 KB)
that the real `llama-server` loads in well under a second, so tests and the demo can
serve real tokens without fetching weights. The same seed gives the same bytes.

The vocabulary is byte-level: `<unk>`, `<s>`, `</s>`, the 256 byte tokens `<0x00>` …
`<0xFF>` and `▁` (SentencePiece's space), 260 tokens in all, with the `llama` (SPM)
tokenizer, so any text tokenizes through byte fallback. The weights are random, so the
answers are nonsense; the output layer holds every token but the lowercase letters and
`▁` far below them, so the nonsense comes out as words (never control bytes, invalid
UTF-8 or an early end of sequence) and a completion runs to its `max_tokens`.

This module writes files only; it starts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

ARCHITECTURE = "llama"
LAYERS = 2
WIDTH = 64
HEADS = 4
FEED_FORWARD = 128
CONTEXT_LENGTH = 2048
"""The context it says it was trained with. llama-server caps each slot's context at
it, whatever `-c` says, so no answer runs past it (an answer that must run longer, as
the drain-deadline test's, asks for a model with a longer one)."""
MAX_CONTEXT_LENGTH = 1 << 20
SPACE_PIECE = "▁"
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
UNKNOWN_ID, BOS_ID, EOS_ID = 0, 1, 2
FIRST_BYTE_ID = len(SPECIAL_TOKENS)
SPACE_ID = FIRST_BYTE_ID + 256
VOCAB_SIZE = SPACE_ID + 1
SPOKEN_BYTES = b"abcdefghijklmnopqrstuvwxyz"
CONSTANT_DIMENSION = 0
UNSPOKEN_BIAS = -30.0
"""Logit offset of every token that is not a letter or the space: never sampled."""
LETTER_SCALE = 0.08
"""Spread of the letters' logits (std ≈ LETTER_SCALE·√WIDTH ≈ 0.6): flat enough that no
letter follows another by habit (a steeper spread loops, "lllll")."""
SPACE_BIAS = 2.5
"""Logit offset of the space: the larger, the shorter the words."""

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
"""A plain template, so the server needs none of its built-in guesses."""

Weights = npt.NDArray[np.float32]


def vocabulary() -> tuple[list[str], list[gguf.TokenType]]:
    """The token texts and types, in id order."""
    tokens = [*SPECIAL_TOKENS, *(f"<0x{value:02X}>" for value in range(256)), SPACE_PIECE]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL]
    return tokens, types


def _tensors(seed: int) -> dict[str, Weights]:
    """Every tensor, by GGUF name, in numpy's row-major shape (rows = output features).

    Hidden dimension 0 is a constant that no layer writes to (its row of `attn_output`
    and `ffn_down` is zero), so after the final norm it is positive at every position:
    the output layer's column 0 then works as a bias, far below zero for every token
    but the letters and the space, which never get sampled.
    """
    generator = np.random.default_rng(seed)

    def random(*shape: int, scale: float) -> Weights:
        return (generator.standard_normal(shape) * scale).astype(np.float32)

    def ones(size: int) -> Weights:
        return np.ones(size, dtype=np.float32)

    embeddings = random(VOCAB_SIZE, WIDTH, scale=1.0)
    embeddings[:, CONSTANT_DIMENSION] = 1.0
    tensors: dict[str, Weights] = {"token_embd.weight": embeddings}
    projection = 1.0 / np.sqrt(WIDTH)
    for layer in range(LAYERS):
        block = f"blk.{layer}"
        tensors[f"{block}.attn_norm.weight"] = ones(WIDTH)
        for name in ("attn_q", "attn_k", "attn_v"):
            tensors[f"{block}.{name}.weight"] = random(WIDTH, WIDTH, scale=projection)
        attention_out = random(WIDTH, WIDTH, scale=projection)
        attention_out[CONSTANT_DIMENSION] = 0.0
        tensors[f"{block}.attn_output.weight"] = attention_out
        tensors[f"{block}.ffn_norm.weight"] = ones(WIDTH)
        tensors[f"{block}.ffn_gate.weight"] = random(FEED_FORWARD, WIDTH, scale=projection)
        tensors[f"{block}.ffn_up.weight"] = random(FEED_FORWARD, WIDTH, scale=projection)
        feed_forward_out = random(WIDTH, FEED_FORWARD, scale=1.0 / np.sqrt(FEED_FORWARD))
        feed_forward_out[CONSTANT_DIMENSION] = 0.0
        tensors[f"{block}.ffn_down.weight"] = feed_forward_out
    tensors["output_norm.weight"] = ones(WIDTH)
    output = np.zeros((VOCAB_SIZE, WIDTH), dtype=np.float32)
    output[:, CONSTANT_DIMENSION] = UNSPOKEN_BIAS
    for token in [FIRST_BYTE_ID + value for value in SPOKEN_BYTES] + [SPACE_ID]:
        output[token] = random(WIDTH, scale=LETTER_SCALE)
        output[token, CONSTANT_DIMENSION] = SPACE_BIAS if token == SPACE_ID else 0.0
    tensors["output.weight"] = output
    return tensors


def write_tiny_model(
    path: Path | str, *, seed: int = 0, name: str = "tiny", context_length: int = CONTEXT_LENGTH
) -> Path:
    """Write the model to `path` (atomically: a reader never sees half a file)."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if (
        not isinstance(context_length, int)
        or isinstance(context_length, bool)
        or not 1 <= context_length <= MAX_CONTEXT_LENGTH
    ):
        raise ValueError(
            f"context_length must be an integer from 1 to {MAX_CONTEXT_LENGTH}, "
            f"got {context_length!r}"
        )
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    descriptor, staging_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(descriptor)
    staging = Path(staging_name)
    try:
        writer = gguf.GGUFWriter(staging, ARCHITECTURE)
        writer.add_name(name)
        writer.add_description(f"random weights from seed {seed}; answers are nonsense")
        writer.add_context_length(context_length)
        writer.add_embedding_length(WIDTH)
        writer.add_block_count(LAYERS)
        writer.add_feed_forward_length(FEED_FORWARD)
        writer.add_head_count(HEADS)
        writer.add_head_count_kv(HEADS)
        writer.add_rope_dimension_count(WIDTH // HEADS)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_vocab_size(VOCAB_SIZE)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)

        tokens, types = vocabulary()
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_scores([0.0] * VOCAB_SIZE)
        writer.add_unk_token_id(UNKNOWN_ID)
        writer.add_bos_token_id(BOS_ID)
        writer.add_eos_token_id(EOS_ID)
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)
        writer.add_chat_template(CHAT_TEMPLATE)

        for tensor_name, data in _tensors(seed).items():
            writer.add_tensor(tensor_name, data)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        staging.chmod(0o644)
        staging.replace(target)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flexinfer_devcluster.tinymodel",
        description="Write a tiny random-weight llama GGUF (about 470 KB) for local serving.",
    )
    parser.add_argument("path", type=Path, help="where to write the .gguf file")
    parser.add_argument("--seed", type=int, default=0, help="same seed, same bytes (default 0)")
    parser.add_argument("--name", default="tiny", help="general.name in the file")
    parser.add_argument(
        "--context-length",
        type=int,
        default=CONTEXT_LENGTH,
        help="the training context it declares; llama-server caps each slot's context "
        f"at it (default %(default)s, 1 to {MAX_CONTEXT_LENGTH})",
    )
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error(f"--seed must be a non-negative integer, got {args.seed}")
    if not 1 <= args.context_length <= MAX_CONTEXT_LENGTH:
        parser.error(
            f"--context-length must be from 1 to {MAX_CONTEXT_LENGTH}, got {args.context_length}"
        )
    written = write_tiny_model(
        args.path, seed=args.seed, name=args.name, context_length=args.context_length
    )
    print(f"{written} ({written.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
