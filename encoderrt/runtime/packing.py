"""Token rows -> packed token stream, for graphs whose attention takes packed sequences.

The rows' real tokens go end to end, with cu_seqlens marking where each starts, so no attention, GEMM or LayerNorm
work is spent on padding, and nothing is padded first (runtime/backends/base.py's Batch.packed).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from encoderrt.runtime.tokenizer import Tokens

PACKED_ATTENTION_DOMAIN = "encoderrt"
PACKED_ATTENTION_OP = "packed_attention"
"""The graph node the TensorRT plugin implements: `{domain}::{op}` is also the plugin's id."""


def packed_input_names(uses_token_type_ids: bool) -> tuple[str, ...]:
    return ("input_ids", "cu_seqlens", "token_type_ids") if uses_token_type_ids else ("input_ids", "cu_seqlens")


def pack_rows(rows: Sequence[Tokens]) -> dict[str, np.ndarray]:
    """input_ids and token_type_ids [tokens] int64, and cu_seqlens [rows + 1] int32."""
    cu_seqlens = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum([len(row.ids) for row in rows], out=cu_seqlens[1:])
    return {"input_ids": np.fromiter((i for row in rows for i in row.ids), np.int64, int(cu_seqlens[-1])),
            "cu_seqlens": cu_seqlens,
            "token_type_ids": np.fromiter((t for row in rows for t in row.type_ids), np.int64, int(cu_seqlens[-1]))}
