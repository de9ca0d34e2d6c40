"""FLOPs per token of an encoder or decoder, from the shape its manifest records.

Each weight of a matrix multiply costs one multiply and one add per token (2 x weights); attention adds QK^T and AV,
2 x 2 x L x (heads x head width) per layer for a row of L tokens. Compile counts the weights on the family's own
modules (ModelShape.matmul_weights), so GLU feed-forwards, grouped-query and wide-head attention count as they run.
Left out, as small against the GEMMs: embedding lookups, norms, activations, the pooler and the heads that run once a
row, DeBERTa's relative-position terms, and the keys a sliding window skips.
"""

from __future__ import annotations

from encoderrt.runtime.manifest import ModelShape


def matmul_weights(shape: ModelShape) -> int:
    """The recorded per-token weights; for a manifest without them, BERT's Q, K, V, output and two FFN matrices."""
    if shape.matmul_weights is not None:
        return shape.matmul_weights
    h, i = shape.hidden_size, shape.intermediate_size
    return shape.num_layers * (4 * h * h + 2 * h * i)


def flops_per_token(shape: ModelShape, sequence_length: float) -> float:
    width = shape.attention_width if shape.attention_width is not None else shape.hidden_size
    return 2 * matmul_weights(shape) + shape.num_layers * 4 * sequence_length * width
