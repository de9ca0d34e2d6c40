"""Gemma (bge-reranker-v2-gemma's kind of causal-LM reranker, Gemma-based embedders): a decoder (models/decoder.py)
whose feed-forward gates with tanh GELU (GeGLU), whose RMSNorm scales by 1 + weight and whose embeddings are scaled
by the square root of the hidden size (transformers' class does both in the graph).

transformers' Gemma can also run bidirectionally (`use_bidirectional_attention`); such a folder is an encoder this
file does not describe, and is refused by name rather than served causal."""

from __future__ import annotations

from typing import Any, Mapping

from encoderrt.models.decoder import decoder


def _unsupported(config: Mapping[str, Any]) -> str | None:
    if config.get("use_bidirectional_attention"):
        return ("bidirectional attention (use_bidirectional_attention): encoderrt runs Gemma as a decoder, each token "
                "attending to those before it")
    return None


ARCHITECTURE = decoder("gemma", layer_gelus=1, unsupported=_unsupported)
