"""Padded batch -> packed token stream, for graphs whose attention takes packed sequences.

The scheduler forms padded [rows, width] batches (the one batching loop); a backend whose graph
is packed drops the padding here, so no attention, GEMM or LayerNorm work is spent on it. The
tokenizer pads on the right, so each row's real tokens come first.
"""

from __future__ import annotations

import numpy as np

PACKED_ATTENTION_DOMAIN = "encoderrt"
PACKED_ATTENTION_OP = "packed_attention"
"""The graph node the TensorRT plugin implements: `{domain}::{op}` is also the plugin's id."""


def packed_input_names(uses_token_type_ids: bool) -> tuple[str, ...]:
    return ("input_ids", "cu_seqlens", "token_type_ids") if uses_token_type_ids else ("input_ids", "cu_seqlens")


def pack_feeds(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """input_ids (and token_type_ids) [rows, width] with attention_mask -> [tokens] plus cu_seqlens [rows + 1] int32."""
    mask = feeds["attention_mask"].astype(bool)
    cu_seqlens = np.zeros(mask.shape[0] + 1, dtype=np.int32)
    np.cumsum(mask.sum(axis=1), out=cu_seqlens[1:])
    packed = {"input_ids": np.ascontiguousarray(feeds["input_ids"][mask]), "cu_seqlens": cu_seqlens}
    if "token_type_ids" in feeds:
        packed["token_type_ids"] = np.ascontiguousarray(feeds["token_type_ids"][mask])
    return packed
