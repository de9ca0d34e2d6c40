"""Non-causal attention over packed sequences, in Triton (flash-attention style, online softmax).

q, k, v are [T, heads, head_dim] with the tokens of every sequence concatenated; `cu_seqlens`
says where each sequence starts. Each program handles one block of queries of one sequence and
one head, and only ever reads that sequence's keys: no padding is computed and no mask is needed.
Inputs in fp16/bf16 (fp32 is accepted for the interpreter), accumulation in fp32.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

HEAD_DIMS = (32, 64)
# Triton's CPU interpreter computes bf16 tl.dot wrongly (fp16 and fp32 are right); there the kernel
# multiplies bf16 tiles in fp32. On a GPU the tiles go to the tensor cores in bf16.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _packed_attention_kernel(
    Q, K, V, O, cu_seqlens, qk_scale,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr,
):
    block = tl.program_id(0)
    sequence = tl.program_id(1)
    head = tl.program_id(2)
    start = tl.load(cu_seqlens + sequence)
    length = tl.load(cu_seqlens + sequence + 1) - start
    if block * BLOCK_M < length:
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, HEAD_DIM)
        row_ok = rows < length
        q = tl.load(Q + (start + rows)[:, None] * stride_qt + head * stride_qh + dims[None, :], mask=row_ok[:, None], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        running_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        running_sum = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for first in range(0, length, BLOCK_N):
            cols = first + tl.arange(0, BLOCK_N)
            col_ok = cols < length
            k = tl.load(K + (start + cols)[:, None] * stride_kt + head * stride_kh + dims[None, :], mask=col_ok[:, None], other=0.0)
            v = tl.load(V + (start + cols)[:, None] * stride_vt + head * stride_vh + dims[None, :], mask=col_ok[:, None], other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            scores = tl.dot(q, tl.trans(k)) * qk_scale  # log2 units: exp2 below is exp of the scaled scores
            scores = tl.where(col_ok[None, :], scores, float("-inf"))
            new_max = tl.maximum(running_max, tl.max(scores, 1))
            p = tl.math.exp2(scores - new_max[:, None])
            correction = tl.math.exp2(running_max - new_max)
            running_sum = running_sum * correction + tl.sum(p, 1)
            acc = acc * correction[:, None] + tl.dot(p.to(v.dtype), v)
            running_max = new_max
        out = acc / running_sum[:, None]
        tl.store(O + (start + rows)[:, None] * stride_ot + head * stride_oh + dims[None, :], out.to(O.dtype.element_ty),
                 mask=row_ok[:, None])


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                     sm_scale: float | None = None, block_m: int = 64, block_n: int = 64,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v for each sequence on its own; returns [T, heads, head_dim] like q.

    `max_seqlen` may be an upper bound (query blocks past a sequence's end return at once); `out`
    lets a caller that owns the output buffer (a TensorRT plugin) receive the result in place.
    """
    if q.ndim != 3 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must share one [tokens, heads, head_dim] shape; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    head_dim = q.shape[2]
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} is not supported; the kernel is built for {HEAD_DIMS}")
    if q.stride(2) != 1 or k.stride(2) != 1 or v.stride(2) != 1:
        raise ValueError("the head dimension must be contiguous")
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.ndim != 1:
        raise ValueError("cu_seqlens must be a 1-D int32 tensor")
    batch = cu_seqlens.numel() - 1
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(2) != 1:
        raise ValueError(f"out must match q: {tuple(q.shape)} {q.dtype} with a contiguous head dimension")
    if batch == 0 or q.shape[0] == 0:
        return out
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    grid = (triton.cdiv(max_seqlen, block_m), batch, q.shape[1])
    _packed_attention_kernel[grid](
        q, k, v, out, cu_seqlens, scale * 1.4426950408889634,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim, UPCAST=_INTERPRETED and q.dtype == torch.bfloat16,
    )
    return out


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                        sm_scale: float | None = None) -> torch.Tensor:
    """Plain PyTorch, one sequence at a time, in fp32: what the kernel must reproduce."""
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[2])
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        qs, ks, vs = (t[start:end].float().transpose(0, 1) for t in (q, k, v))  # [heads, n, d]
        weights = torch.softmax(qs @ ks.transpose(1, 2) * scale, dim=-1)
        out[start:end] = (weights @ vs).transpose(0, 1).to(q.dtype)
    return out
