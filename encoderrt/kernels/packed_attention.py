"""Non-causal attention over packed sequences, in Triton (flash-attention style, online softmax).

q, k, v are [T, heads, head_dim] with the tokens of every sequence concatenated; `cu_seqlens`
says where each sequence starts. Each program handles one block of queries of one sequence and
one head, and only ever reads that sequence's keys: no padding is computed and no mask is needed.
Inputs in fp16/bf16 (fp32 is accepted for the interpreter), accumulation in fp32. The plain
PyTorch reference it must match is `encoderrt.kernels.reference.reference_attention`.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from encoderrt.kernels import PACKED_HEAD_DIMS

# Triton's CPU interpreter computes bf16 tl.dot wrongly (fp16 and fp32 are right); there the kernel
# multiplies bf16 tiles in fp32. On a GPU the tiles go to the tensor cores in bf16.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
LOG2E = 1.4426950408889634
BLOCK_M = 64
BLOCK_N = 64


@triton.jit
def packed_attention_kernel(
    Q, K, V, cu_seqlens, O,
    QK_SCALE: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
):
    """Tensors are contiguous [tokens, HEADS, HEAD_DIM]; grid (query blocks, sequences, heads).

    Parameters come as inputs, then outputs, with everything else constexpr: the calling
    convention of TensorRT's ahead-of-time plugins, so the same kernel serves both launchers.
    QK_SCALE is the softmax scale times log2(e): exp2 below is then exp of the scaled scores.
    """
    block = tl.program_id(0)
    sequence = tl.program_id(1)
    head = tl.program_id(2)
    start = tl.load(cu_seqlens + sequence)
    length = tl.load(cu_seqlens + sequence + 1) - start
    if block * BLOCK_M < length:
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, HEAD_DIM)
        row_ok = rows < length
        token_stride = HEADS * HEAD_DIM
        q = tl.load(Q + (start + rows)[:, None] * token_stride + head * HEAD_DIM + dims[None, :], mask=row_ok[:, None], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        running_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
        running_sum = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for first in range(0, length, BLOCK_N):
            cols = first + tl.arange(0, BLOCK_N)
            col_ok = cols < length
            offsets = (start + cols)[:, None] * token_stride + head * HEAD_DIM + dims[None, :]
            k = tl.load(K + offsets, mask=col_ok[:, None], other=0.0)
            v = tl.load(V + offsets, mask=col_ok[:, None], other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            scores = tl.dot(q, tl.trans(k)) * QK_SCALE
            scores = tl.where(col_ok[None, :], scores, float("-inf"))
            new_max = tl.maximum(running_max, tl.max(scores, 1))
            p = tl.math.exp2(scores - new_max[:, None])
            correction = tl.math.exp2(running_max - new_max)
            running_sum = running_sum * correction + tl.sum(p, 1)
            acc = acc * correction[:, None] + tl.dot(p.to(v.dtype), v)
            running_max = new_max
        out = acc / running_sum[:, None]
        tl.store(O + (start + rows)[:, None] * token_stride + head * HEAD_DIM + dims[None, :], out.to(O.dtype.element_ty),
                 mask=row_ok[:, None])


def check_head_dim(head_dim: int) -> None:
    if head_dim not in PACKED_HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} is not supported; the kernel is built for {PACKED_HEAD_DIMS}")


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                     sm_scale: float | None = None, block_m: int = BLOCK_M, block_n: int = BLOCK_N,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v for each sequence on its own; returns [T, heads, head_dim] like q.

    `max_seqlen` may be an upper bound (query blocks past a sequence's end return at once); `out`
    lets a caller that owns the output buffer receive the result in place.
    """
    if q.ndim != 3 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must share one [tokens, heads, head_dim] shape; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    tokens, heads, head_dim = q.shape
    check_head_dim(head_dim)
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.ndim != 1:
        raise ValueError("cu_seqlens must be a 1-D int32 tensor")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    batch = cu_seqlens.numel() - 1
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {tuple(q.shape)} {q.dtype} tensor")
    if batch == 0 or tokens == 0:
        return out
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim)
    grid = (triton.cdiv(max_seqlen, block_m), batch, heads)
    packed_attention_kernel[grid](
        q, k, v, cu_seqlens, out,
        QK_SCALE=scale * LOG2E, HEADS=heads, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
        UPCAST=_INTERPRETED and q.dtype == torch.bfloat16,
    )
    return out
