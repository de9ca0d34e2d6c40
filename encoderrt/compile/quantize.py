"""Dynamic int8 quantisation: int8 weights per output channel, activations quantised per batch.

onnxruntime turns the result into DynamicQuantizeMatMul / QAttention, which run on the VNNI and
AMX int8 units of recent x86 CPUs. The embedding tables stay fp32: they are lookups, not GEMMs,
and quantising them costs accuracy for no speed.
"""

from __future__ import annotations

import logging
from pathlib import Path

QUANTIZED_OPS = ["MatMul", "Attention"]


def quantize_int8(optimized: Path, quantized: Path) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)  # the quantizer warns on the root logger about pre-processing
    quantize_dynamic(
        str(optimized),
        str(quantized),
        per_channel=True,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=QUANTIZED_OPS,
        # shape inference cannot type the outputs of com.microsoft fused ops
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
