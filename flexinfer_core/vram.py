"""VRAM estimates for mlc-llm settings (docs/resources.md, ModelDeployment `mlcllm`).

total ≈ weights + KV cache + temporary buffers, with
KV cache ≈ maxNumSequence × maxTotalSeqLength × bytes-per-token.

The docs quote ≈55 per token for a 7B Qwen; the worked example
(2 × 131072 × 55 ≈ 14.4 GB) only holds with kilobytes, which is also what the
architecture gives (2 × 28 layers × 4 KV heads × 128 dims × 2 bytes ≈ 57 kB), so
bytes-per-token is taken as 55,000 for that model.
"""

from __future__ import annotations

import enum

import attrs

from flexinfer_core.errors import InvalidFieldError

QWEN_7B_KV_BYTES_PER_TOKEN = 55_000
GB = 1_000_000_000


class MlcMode(enum.StrEnum):
    LOCAL = "local"
    INTERACTIVE = "interactive"
    SERVER = "server"


@attrs.frozen
class MlcSettings:
    """Effective engine limits for a mode (the docs' defaults, then overrides)."""

    max_num_sequence: int
    max_total_seq_length: int


def mlc_mode_settings(
    mode: MlcMode | str,
    *,
    context_window: int,
    max_num_sequence: int | None = None,
    max_total_seq_length: int | None = None,
) -> MlcSettings:
    """Mode defaults: local → batch 4, KV ≈ 8k tokens; interactive → batch 1, full
    context; server → batch 128 and the full context (KV as large as fits)."""
    try:
        chosen = MlcMode(mode)
    except ValueError:
        raise InvalidFieldError(
            "spec.mlcllm.mode", mode, "must be one of local, interactive, server"
        ) from None
    _positive("context_window", context_window)
    if chosen is MlcMode.LOCAL:
        seqs, tokens = 4, min(8192, context_window)
    elif chosen is MlcMode.INTERACTIVE:
        seqs, tokens = 1, context_window
    else:
        seqs, tokens = 128, context_window
    if max_num_sequence is not None:
        _positive("spec.mlcllm.overrides.maxNumSequence", max_num_sequence)
        seqs = max_num_sequence
    if max_total_seq_length is not None:
        _positive("spec.mlcllm.overrides.maxTotalSeqLength", max_total_seq_length)
        tokens = max_total_seq_length
    return MlcSettings(seqs, tokens)


@attrs.frozen
class VramEstimate:
    weights_bytes: int
    kv_cache_bytes: int
    temp_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.temp_bytes

    def fits(self, card_bytes: int, *, utilization: float = 1.0) -> bool:
        return self.total_bytes <= card_bytes * utilization


def kv_bytes_per_token(*, layers: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """Keys and values for every layer: 2 × layers × kv_heads × head_dim × dtype bytes."""
    for name, value in (
        ("layers", layers),
        ("kv_heads", kv_heads),
        ("head_dim", head_dim),
        ("dtype_bytes", dtype_bytes),
    ):
        _positive(name, value)
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def kv_cache_bytes(
    *, max_num_sequence: int, max_total_seq_length: int, bytes_per_token: int
) -> int:
    _positive("maxNumSequence", max_num_sequence)
    _positive("maxTotalSeqLength", max_total_seq_length)
    _positive("bytes_per_token", bytes_per_token)
    return max_num_sequence * max_total_seq_length * bytes_per_token


def estimate_vram(
    *,
    weights_bytes: int,
    max_num_sequence: int,
    max_total_seq_length: int,
    bytes_per_token: int,
    temp_bytes: int = 0,
) -> VramEstimate:
    if weights_bytes < 0:
        raise InvalidFieldError("weights_bytes", weights_bytes, "must be zero or more")
    if temp_bytes < 0:
        raise InvalidFieldError("temp_bytes", temp_bytes, "must be zero or more")
    return VramEstimate(
        weights_bytes=weights_bytes,
        kv_cache_bytes=kv_cache_bytes(
            max_num_sequence=max_num_sequence,
            max_total_seq_length=max_total_seq_length,
            bytes_per_token=bytes_per_token,
        ),
        temp_bytes=temp_bytes,
    )


def _positive(field: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidFieldError(field, value, "must be a positive integer")
