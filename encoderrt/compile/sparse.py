"""Sparse (SPLADE) models from sentence-transformers SparseEncoder folders: an MLM head, then SpladePooling.

The graph computes log(1 + relu(logits)) over the MLM logits of the real tokens (log1p once more for the
`log1p_relu` activation of OpenSearch's models) and pools it (max or sum) to
one [vocab] row per text, so the [batch, tokens, vocab] activation never leaves the graph; the runtime keeps
the weights above zero (runtime/postprocess.py sparse_rows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from encoderrt.compile.errors import InputError


def splade_pooling(path: Path, config: dict[str, Any]) -> str:
    """The manifest's pooling for a SpladePooling module's config.json at `path`."""
    strategy = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if strategy not in ("max", "sum"):
        raise InputError(f"SpladePooling strategy '{strategy}' in {path} is not supported; encoderrt supports max and sum")
    if activation not in ("relu", "log1p_relu"):
        raise InputError(f"SpladePooling activation '{activation}' in {path} is not supported; encoderrt supports relu "
                         "and log1p_relu")
    return f"splade_{strategy}" + ("_log1p_relu" if activation == "log1p_relu" else "")


def splade_module(model: Any, pooling: str) -> Any:
    """The MLM model wrapped to return pooled SPLADE weights [B, vocab]."""
    import torch

    class SpladeEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mlm = model

        def forward(self, input_ids, attention_mask, token_type_ids=None):
            from encoderrt.compile.export import _feeds

            logits = self.mlm(**_feeds(input_ids, attention_mask, token_type_ids)).logits
            weights = torch.log1p(torch.relu(logits * attention_mask.unsqueeze(-1).to(logits.dtype)))
            if pooling.endswith("_log1p_relu"):
                weights = torch.log1p(weights)
            return weights.max(dim=1).values if pooling.startswith("splade_max") else weights.sum(dim=1)

    return SpladeEncoder().eval()


def sparse_reference(folder: Path, max_length: int, texts: list[str]) -> np.ndarray:
    """SparseEncoder.encode's vectors, dense [texts, vocab]."""
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(folder), device="cpu", local_files_only=True)
    model.max_seq_length = max_length
    vectors = model.encode(texts, batch_size=8, convert_to_tensor=True, show_progress_bar=False)
    return vectors.to_dense().numpy().astype(np.float32)
