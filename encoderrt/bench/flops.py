"""FLOPs per token of a BERT-style encoder, from its shape.

Each weight of a matrix multiply costs one multiply and one add per token (2 x weights); attention
adds QK^T and AV, 2 x 2 x L x hidden per layer for a row of L tokens. Embedding lookups, LayerNorm,
GELU and the pooling/classifier head are left out: they are small against the GEMMs.
"""

from __future__ import annotations

from encoderrt.runtime.manifest import ModelShape


def matmul_weights(shape: ModelShape) -> int:
    """Non-embedding matrix weights: Q, K, V, output projection and the two FFN matrices, per layer."""
    h, i = shape.hidden_size, shape.intermediate_size
    return shape.num_layers * (4 * h * h + 2 * h * i)


def flops_per_token(shape: ModelShape, sequence_length: float) -> float:
    attention = shape.num_layers * 4 * sequence_length * shape.hidden_size
    return 2 * matmul_weights(shape) + attention
