"""FLOPs per token of an encoder or decoder, from the shape its manifest records.

Each weight of a matrix multiply costs one multiply and one add per token (2 x weights); attention adds QK^T and AV,
2 x 2 x L x (heads x head width) per layer for a row of L tokens. Compile counts the weights on the family's own
modules (ModelShape.matmul_weights), so GLU feed-forwards, grouped-query and wide-head attention count as they run.
Left out, as small against the GEMMs: embedding lookups, norms, activations, the pooler and the heads that run once a
row, DeBERTa's relative-position terms, and the keys a sliding window skips.
"""

from __future__ import annotations

from encoderrt.runtime.manifest import ModelShape


def flops_per_token(shape: ModelShape, sequence_length: float) -> float:
    return 2 * shape.per_token_weights() + shape.num_layers * 4 * sequence_length * shape.query_width()
