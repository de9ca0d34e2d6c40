"""Packed attention in plain PyTorch, one sequence at a time: what every other implementation must reproduce.

It needs torch only (no triton), so compile's export and the tests use it on any machine.
"""

from __future__ import annotations

import math

import torch


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                        sm_scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v per sequence, in fp32; q, k, v are [tokens, heads, head_dim], returns q's dtype."""
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[2])
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        qs, ks, vs = (t[start:end].float().transpose(0, 1) for t in (q, k, v))  # [heads, n, d]
        weights = torch.softmax(qs @ ks.transpose(1, 2) * scale, dim=-1)
        out[start:end] = (weights @ vs).transpose(0, 1).to(q.dtype)
    return out
