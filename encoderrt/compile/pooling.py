"""sentence-transformers' pooling modes, inside the exported graph, as sentence-transformers computes them.

Rows are right-padded (encoderrt's tokenizer pads on the right), so the first real token is position 0
and sentence-transformers' left-padding corrections fall away. Each mode is written with ops every
exporter keeps (masked sums, a masked max, a gather), so pooling stays one small tail of the graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from encoderrt.runtime.manifest import POOLINGS

if TYPE_CHECKING:
    import torch

LEGACY_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
"""sentence-transformers < 5 writes one boolean per mode instead of `pooling_mode`."""
assert set(LEGACY_FLAGS.values()) == set(POOLINGS)


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str,
         pooling_start: torch.Tensor | None = None) -> torch.Tensor:
    """[B, S, H] token states and the [B, S] mask to [B, H] by `mode`.

    `pooling_start` [B] (include_prompt: false) leaves each row's first positions, its prompt, out of the
    pooling mask, as sentence-transformers zeroes them; a row that is all prompt pools as its mask then says.
    """
    import torch

    lengths = attention_mask.to(torch.int64).sum(dim=1) if pooling_start is not None or mode == "lasttoken" else None
    if pooling_start is not None:
        positions = torch.arange(hidden.shape[1], device=hidden.device).view(1, -1)
        attention_mask = attention_mask * (positions >= pooling_start.view(-1, 1)).to(attention_mask.dtype)
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    rows = torch.arange(hidden.shape[0], device=hidden.device) if lengths is not None else None
    if mode == "cls":
        if pooling_start is None:
            return hidden[:, 0]
        # the first pooled position (sentence-transformers' argmax of the mask): 0 when none is left
        return hidden[rows, torch.where(pooling_start < lengths, pooling_start, torch.zeros_like(pooling_start))]
    if mode == "max":
        return hidden.masked_fill(mask == 0, float("-inf")).max(dim=1).values
    if mode in ("mean", "mean_sqrt_len_tokens"):
        counts = mask.sum(dim=1).clamp(min=1e-9)
        return (hidden * mask).sum(dim=1) / (counts if mode == "mean" else counts.sqrt())
    if mode == "weightedmean":  # token i weighs i + 1
        weights = mask * torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=hidden.dtype).view(1, -1, 1)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
    if mode == "lasttoken":
        last = (lengths - 1).clamp(min=0)  # right padding: the last real token, zero if pooling left it out
        return hidden[rows, last] * (mask[rows, last] if pooling_start is not None else 1)
    raise ValueError(f"pooling mode {mode!r} is not one of {POOLINGS}")
