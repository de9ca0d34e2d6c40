"""The packed attention kernel as a TensorRT plugin (a Quickly Deployable Plugin, TensorRT 10.7+).

Importing this module registers `encoderrt::packed_attention` with TensorRT: inputs q, k, v
[tokens, heads, head_dim] and cu_seqlens [batch + 1] (int32), attributes max_seqlen (an upper
bound, such as the model's limit) and sm_scale; one output shaped like q. The implementation runs
the Triton kernel on the stream TensorRT hands over and writes straight into TensorRT's buffer.
"""

from __future__ import annotations

import tensorrt.plugin as trtp
import torch

from encoderrt.kernels.packed_attention import packed_attention

PLUGIN_ID = "encoderrt::packed_attention"


@trtp.register(PLUGIN_ID)
def packed_attention_description(q: trtp.TensorDesc, k: trtp.TensorDesc, v: trtp.TensorDesc, cu_seqlens: trtp.TensorDesc,
                                 max_seqlen: int, sm_scale: float) -> trtp.TensorDesc:
    return q.like()


@trtp.impl(PLUGIN_ID)
def packed_attention_implementation(q: trtp.Tensor, k: trtp.Tensor, v: trtp.Tensor, cu_seqlens: trtp.Tensor,
                                    max_seqlen: int, sm_scale: float, outputs: tuple[trtp.Tensor], stream: int) -> None:
    tensors = [torch.as_tensor(t, device="cuda") for t in (q, k, v, cu_seqlens, outputs[0])]
    with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
        packed_attention(*tensors[:4], max_seqlen, sm_scale, out=tensors[4])
