"""Dynamic int8 quantisation: int8 weights per output channel, activations quantised per batch.

onnxruntime turns the result into DynamicQuantizeMatMul / QAttention, which run on the VNNI and
AMX int8 units of recent x86 CPUs. The embedding tables stay fp32: they are lookups, not GEMMs,
and quantising them costs accuracy for no speed.

The FFN down projections are the most sensitive matrices: their input is the GELU output, whose
outliers a per-tensor uint8 range handles badly (all-MiniLM-L6-v2: keeping those six fp32 raises
the min cosine from 0.984 to 0.995). They cost a third of the GEMM work, so they are quantised
first and kept in fp32 only when the parity check asks for it; where that is not enough (all-MiniLM-L6-v2 on
probes of tables, code and many scripts: mean cosine 0.99500 against 0.995), the attention's Q/K/V projections
stay fp32 too (0.9971), as OpenVINO's int8 keeps attention in bf16.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

QUANTIZED_OPS = ["MatMul", "Attention"]
_GELU_OPS = {"Gelu", "FastGelu", "BiasGelu"}


@contextmanager
def quiet_quantizer_logs() -> Iterator[None]:
    """The quantizer warns on the root logger about pre-processing that does not apply to fused graphs."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def ffn_down_projections(model_path: Path) -> list[str]:
    """Names of each layer's FFN down projection: the MatMuls fed by a GELU, or by a gated FFN's product (SwiGLU,
    GeGLU: a Mul of the up projection and the activated gate, SiLU being x * Sigmoid(x))."""
    graph = _graph(model_path)
    made_by = {out: node for node in graph.node for out in node.output}

    def op(name: str) -> str:
        return made_by[name].op_type if name in made_by else ""

    def activated(name: str) -> bool:
        return op(name) in _GELU_OPS or (op(name) == "Mul" and any(op(i) == "Sigmoid" for i in made_by[name].input))

    def feeds_down_projection(name: str) -> bool:
        if op(name) in _GELU_OPS:
            return True
        inputs = made_by[name].input if op(name) == "Mul" else ()
        return any(op(i) == "MatMul" for i in inputs) and any(activated(i) for i in inputs)

    return [node.name for node in graph.node if node.op_type == "MatMul" and feeds_down_projection(node.input[0])]


def int8_attempts(model_path: Path) -> Iterator[tuple[tuple[str, ...], str]]:
    """What each int8 attempt keeps fp32 (node names) and how to say so, in order: nothing; the FFN down
    projections; those and the fused attention ops. The graph is read only where an earlier attempt missed the
    floor."""
    yield (), ""
    down = tuple(ffn_down_projections(model_path))
    if down:
        yield down, f", {len(down)} FFN down projections kept fp32"
    attention = tuple(node.name for node in _graph(model_path).node if node.op_type == "Attention")
    if attention:  # (the rotary families' MultiHeadAttention is not quantised: nothing more to keep)
        yield down + attention, (f", {len(down)} FFN down projections and " if down else ", ") + "attention kept fp32"


def _graph(model_path: Path):
    import onnx

    return onnx.load(str(model_path), load_external_data=False).graph


def quantize_int8(optimized: Path, quantized: Path, keep_fp32: Sequence[str] = (), unsigned_weights: bool = False) -> None:
    """`unsigned_weights`: u8 x u8 products, which onnxruntime's kernels for CPUs without int8 dot products
    (runtime/cpu.py) compute without saturating; u8 x s8 is faster where VNNI or AMX is there."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with quiet_quantizer_logs():
        quantize_dynamic(
            str(optimized),
            str(quantized),
            per_channel=True,
            weight_type=QuantType.QUInt8 if unsigned_weights else QuantType.QInt8,
            op_types_to_quantize=QUANTIZED_OPS,
            nodes_to_exclude=list(keep_fp32),
            # shape inference cannot type the outputs of com.microsoft fused ops
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            use_external_data_format=True,  # an int8 graph with fp32 embeddings can pass 2 GB too (Qwen3-4B)
        )
