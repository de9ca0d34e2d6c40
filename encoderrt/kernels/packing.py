"""Pack a padded batch into one token stream (and back) for padding-free attention.

A padded batch [B, S, ...] with an attention mask becomes [T, ...], T the number of real tokens,
plus cumulative sequence offsets `cu_seqlens` [B + 1] (int32, as flash-attention style kernels
take them) and the flat positions of the real tokens, used to scatter results back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Packed:
    tokens: torch.Tensor
    """[T, ...]: the real tokens of every sequence, one after another."""
    cu_seqlens: torch.Tensor
    """[B + 1] int32: sequence b occupies tokens[cu_seqlens[b]:cu_seqlens[b + 1]]."""
    indices: torch.Tensor
    """[T] int64: each packed token's flat position in the padded [B * S] batch."""
    max_seqlen: int
    batch: int
    seqlen: int


def pack(padded: torch.Tensor, attention_mask: torch.Tensor) -> Packed:
    """Keep the tokens whose mask is 1. The mask must be right-padded (real tokens first), as tokenizers produce."""
    if padded.shape[:2] != attention_mask.shape:
        raise ValueError(f"batch {tuple(padded.shape[:2])} and mask {tuple(attention_mask.shape)} differ")
    batch, seqlen = attention_mask.shape
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1, dtype=torch.int32)
    if not torch.equal(mask, torch.arange(seqlen, device=mask.device)[None, :] < lengths[:, None]):
        raise ValueError("attention mask must be right-padded: every row's real tokens first")
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.zeros(batch + 1, dtype=torch.int32, device=padded.device)
    cu_seqlens[1:] = torch.cumsum(lengths, dim=0)
    tokens = padded.reshape(batch * seqlen, *padded.shape[2:]).index_select(0, indices)
    return Packed(tokens, cu_seqlens, indices, int(lengths.max().item()) if batch else 0, batch, seqlen)


def unpack(tokens: torch.Tensor, packed: Packed) -> torch.Tensor:
    """Scatter [T, ...] back to [B, S, ...], zeros at padding."""
    out = torch.zeros(packed.batch * packed.seqlen, *tokens.shape[1:], dtype=tokens.dtype, device=tokens.device)
    out.index_copy_(0, packed.indices, tokens)
    return out.reshape(packed.batch, packed.seqlen, *tokens.shape[1:])
