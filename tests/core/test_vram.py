"""docs/resources.md: the mlc-llm VRAM estimate and mode defaults."""

from __future__ import annotations

import pytest

from flexinfer_core import (
    InvalidFieldError,
    MlcMode,
    estimate_vram,
    kv_bytes_per_token,
    kv_cache_bytes,
    mlc_mode_settings,
)
from flexinfer_core.vram import GB, QWEN_7B_KV_BYTES_PER_TOKEN


def test_docs_example_two_sequences_of_128k_is_14_4_gb() -> None:
    kv = kv_cache_bytes(
        max_num_sequence=2, max_total_seq_length=131072, bytes_per_token=QWEN_7B_KV_BYTES_PER_TOKEN
    )
    assert round(kv / GB, 1) == 14.4


def test_qwen_7b_architecture_gives_about_55_kb_per_token() -> None:
    per_token = kv_bytes_per_token(layers=28, kv_heads=4, head_dim=128, dtype_bytes=2)
    assert per_token == 57_344
    assert abs(per_token - QWEN_7B_KV_BYTES_PER_TOKEN) / per_token < 0.05


def test_total_is_weights_plus_kv_plus_temp() -> None:
    est = estimate_vram(
        weights_bytes=4 * GB,
        max_num_sequence=2,
        max_total_seq_length=131072,
        bytes_per_token=QWEN_7B_KV_BYTES_PER_TOKEN,
        temp_bytes=GB // 2,
    )
    assert est.total_bytes == 4 * GB + est.kv_cache_bytes + GB // 2
    assert not est.fits(16 * GB)
    assert est.fits(24 * GB)
    assert not est.fits(24 * GB, utilization=0.75)


@pytest.mark.parametrize(
    ("mode", "seqs", "tokens"),
    [("local", 4, 8192), ("interactive", 1, 32768), ("server", 128, 32768)],
)
def test_mode_defaults(mode: str, seqs: int, tokens: int) -> None:
    settings = mlc_mode_settings(mode, context_window=32768)
    assert (settings.max_num_sequence, settings.max_total_seq_length) == (seqs, tokens)


def test_overrides_win_over_mode_defaults() -> None:
    settings = mlc_mode_settings(
        MlcMode.SERVER, context_window=32768, max_num_sequence=2, max_total_seq_length=131072
    )
    assert (settings.max_num_sequence, settings.max_total_seq_length) == (2, 131072)


def test_bad_values_name_the_field() -> None:
    with pytest.raises(InvalidFieldError, match="maxNumSequence: 0"):
        mlc_mode_settings("server", context_window=4096, max_num_sequence=0)
    with pytest.raises(InvalidFieldError, match=r"spec\.mlcllm\.mode: 'turbo'"):
        mlc_mode_settings("turbo", context_window=4096)
