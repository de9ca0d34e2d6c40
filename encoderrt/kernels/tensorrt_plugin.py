"""The packed attention kernel as a TensorRT plugin (a Quickly Deployable Plugin, ahead-of-time form).

Importing this module registers `encoderrt::packed_attention` with TensorRT: inputs q, k, v
[tokens, heads, head_dim] (fp16 or bf16) and cu_seqlens [batch + 1] (int32); attributes
max_seqlen (an upper bound, such as the model's limit), sm_scale, num_heads and head_dim; one
output shaped like q. The ahead-of-time form compiles the Triton kernel to PTX while the engine is
built and embeds it in the engine, so serving the engine needs neither Python nor torch nor Triton.
"""

from __future__ import annotations

import tensorrt as trt
import tensorrt.plugin as trtp

PLUGIN_NAMESPACE = "encoderrt"
PLUGIN_NAME = "packed_attention"
PLUGIN_ID = f"{PLUGIN_NAMESPACE}::{PLUGIN_NAME}"


@trtp.register(PLUGIN_ID)
def packed_attention_description(q: trtp.TensorDesc, k: trtp.TensorDesc, v: trtp.TensorDesc, cu_seqlens: trtp.TensorDesc,
                                 max_seqlen: int, sm_scale: float, num_heads: int, head_dim: int) -> trtp.TensorDesc:
    return q.like()


@trtp.autotune(PLUGIN_ID)
def packed_attention_formats(q: trtp.TensorDesc, k: trtp.TensorDesc, v: trtp.TensorDesc, cu_seqlens: trtp.TensorDesc,
                             max_seqlen: int, sm_scale: float, num_heads: int, head_dim: int,
                             outputs: tuple[trtp.TensorDesc]) -> list[trtp.AutoTuneCombination]:
    return [trtp.AutoTuneCombination("FP16|BF16, FP16|BF16, FP16|BF16, INT32, FP16|BF16", "LINEAR")]


@trtp.aot_impl(PLUGIN_ID)
def packed_attention_kernel(q: trtp.TensorDesc, k: trtp.TensorDesc, v: trtp.TensorDesc, cu_seqlens: trtp.TensorDesc,
                            max_seqlen: int, sm_scale: float, num_heads: int, head_dim: int,
                            outputs: tuple[trtp.TensorDesc], tactic: int):
    from encoderrt.kernels.aot import compile_packed_attention

    dtype = "bf16" if q.dtype == trt.bfloat16 else "fp16"
    compiled = compile_packed_attention(dtype, num_heads, head_dim, sm_scale)
    launch = trtp.KernelLaunchParams()
    launch.grid_x = -(-max_seqlen // compiled.block_m)
    launch.grid_y = cu_seqlens.shape_expr[0] - 1
    launch.grid_z = num_heads
    launch.block_x = compiled.num_warps * 32
    launch.shared_mem = compiled.shared_bytes
    return compiled.name, compiled.ptx, launch, trtp.SymIntExprs(0)
