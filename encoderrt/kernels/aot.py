"""Ahead-of-time compilation of the packed attention kernel to PTX, for TensorRT's AOT plugins.

Kept apart from the plugin registration so that it runs, and is tested, without TensorRT or a GPU:
Triton lowers to PTX for a named GPU generation on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.jit import JITFunction

from encoderrt.kernels.packed_attention import BLOCK_M, BLOCK_N, LOG2E, check_head_dim, packed_attention_kernel

NUM_WARPS = 4
NUM_STAGES = 2
DTYPES = ("fp16", "bf16")


@dataclass(frozen=True)
class CompiledKernel:
    name: str
    ptx: str
    num_warps: int
    shared_bytes: int
    block_m: int


def compile_packed_attention(dtype: str, heads: int, head_dim: int, sm_scale: float,
                             compute_capability: tuple[int, int] | None = None) -> CompiledKernel:
    """PTX for one model's attention shape; `compute_capability` None means the visible GPU's."""
    if dtype not in DTYPES:
        raise ValueError(f"packed attention compiles for {DTYPES}, not {dtype}")
    check_head_dim(head_dim)
    if not isinstance(packed_attention_kernel, JITFunction):
        raise RuntimeError("compiling to PTX needs Triton's compiler; unset TRITON_INTERPRET")
    pointer = f"*{dtype}"
    constants = {"QK_SCALE": sm_scale * LOG2E, "HEADS": heads, "HEAD_DIM": head_dim, "BLOCK_M": BLOCK_M,
                 "BLOCK_N": BLOCK_N, "UPCAST": False}
    signature = {"Q": pointer, "K": pointer, "V": pointer, "cu_seqlens": "*i32", "O": pointer,
                 **{name: "constexpr" for name in constants}}
    source = triton.compiler.ASTSource(fn=packed_attention_kernel, signature=signature, constexprs=constants)
    target = GPUTarget("cuda", compute_capability[0] * 10 + compute_capability[1], 32) if compute_capability else None
    compiled = triton.compile(source, target=target, options={"num_warps": NUM_WARPS, "num_stages": NUM_STAGES})
    metadata = compiled.metadata
    if getattr(metadata, "global_scratch_size", 0) or getattr(metadata, "profile_scratch_size", 0):
        raise RuntimeError("the compiled kernel needs scratch memory, which TensorRT's AOT launch does not provide")
    return CompiledKernel(metadata.name, compiled.asm["ptx"], metadata.num_warps, metadata.shared, BLOCK_M)
