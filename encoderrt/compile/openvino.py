"""The openvino target: an OpenVINO IR converted from the PyTorch module, int8 through NNCF.

Conversion starts from the module with SDPA attention, which OpenVINO's frontend turns into one
ScaledDotProductAttention op per layer (the ONNX route keeps eager attention as MatMul/Softmax
chains; on all-MiniLM-L6-v2 both reached the same bf16 speed within noise, the IR from PyTorch
being the simpler graph). Weights stay fp32 in the IR: bf16 is the runtime's inference-precision
hint (runtime/backends/openvino.py), so one IR serves f32 exactly and bf16 where the CPU has it.

int8 is NNCF's post-training quantisation with its transformer preset: per-channel symmetric
weights, activations calibrated on built-in texts that are not the parity probes. The attention
itself stays in bf16: quantising its Q/K/V took all-MiniLM-L6-v2's min cosine to 0.85 on long
passages. Every GEMM else runs in int8 behind SmoothQuant at alpha 0.75 (SMOOTHING_ALPHA); where that
misses the floor, the FFN down projections stay in bf16 too, at the cost of most of the int8 speed-up on a
model this small. A CPU without int8 dot products gets 7-bit weights (NNCF's overflow fix), keeps the FFN
down projections from the start and smooths at alpha 0.5 (SMOOTHING_ALPHA_7BIT).
"""

from __future__ import annotations

import collections
import logging
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from encoderrt.compile import qdq
from encoderrt.compile.build import Build
from encoderrt.compile.errors import CompileError
from encoderrt.compile.optimize import check_fusion
from encoderrt.compile.source import SourceModel
from encoderrt.compile.unpad import UNPADDED, scored_unattended, unpad_openvino
from encoderrt.runtime import texts
from encoderrt.runtime.backends.base import BackendUnavailable
from encoderrt.runtime.backends.openvino import (
    MODEL_FILE,
    gated_product,
    import_openvino,
    keep_gated_ffns_unfused,
    native_bf16,
    without_usage_telemetry,
)
from encoderrt.runtime.cpu import int8_dot_products
from encoderrt.runtime.manifest import Manifest
from encoderrt.runtime.tokenizer import ADAPTER, TextTokenizer

PRECISIONS = ("fp32", "bf16", "int8")
SMOOTHING_ALPHA = 0.75
"""SmoothQuant's alpha for the int8 MatMuls, in place of NNCF's transformer default of 0.95.

all-MiniLM-L6-v2 with every GEMM but the attention in int8, 320 texts neither calibration nor probes, on an
avx512_vnni EPYC (min / mean cosine against sentence-transformers): 0.95 gave 0.976 / 0.9925, under the
0.98 / 0.995 floor; 0.9 0.978 / 0.9942; 0.85 0.985 / 0.9969; 0.75 0.988 / 0.9965; 0.6 0.990 / 0.9953;
0.5 0.971 / 0.9888; off 0.977 / 0.9915. With the FFN down projections in int8 too the backend ran 1.24x
the graph that keeps them in bf16 (19.2k against 15.5k tokens/s; bf16 alone 12.2k).
"""
SMOOTHING_ALPHA_7BIT = 0.5
"""SmoothQuant's alpha where the weights are 7-bit (a CPU without int8 dot products: the overflow fix in
quantize_openvino). Alpha moves activation outliers into the weights, and 7-bit weights hold less of them.

all-MiniLM-L6-v2 on an AVX2 EPYC, FFN down projections kept, the 30 parity probes (min / mean cosine):
0.95 0.973 / 0.9934; 0.85 0.978 / 0.9954; 0.75 0.982 / 0.9966 (under the 0.985 floor); 0.6 0.992 / 0.9975;
0.5 0.994 / 0.9978; 0.4 0.994 / 0.9976. With every GEMM but the attention int8, no alpha reached the floor
(0.75 0.960, 0.5 0.973, 0.4 0.974).
"""


_COUNTED_OPS = ("ScaledDotProductAttention", "MVN", "Gelu", "FakeQuantize")


def _openvino():
    try:
        return import_openvino()
    except BackendUnavailable:
        raise CompileError("--target openvino needs OpenVINO: pip install openvino") from None


PADDED_FILE = "padded.xml"
"""Beside the exported IR, the same IR before compile/unpad.py's rewrite: the one int8 quantises. NNCF's int8 graph of
the unpadded tiny Qwen3 ran wrong on AMX in bf16 (min cosine -0.24 against sentence-transformers; rows of the first
layer's k-norm at -0.68 against the same graph in f32, which met the floor at 0.995), while the padded graph,
quantised the same way, met it in bf16 (0.988): a fault of OpenVINO's bf16 path for that graph, found on a 2-core
Sapphire Rapids. int8 is never the default, so its artifacts keep the padding rather than that risk."""


def export_openvino(source: SourceModel, path: Path) -> dict[str, int]:
    """Convert the PyTorch module to an IR at `path` (model.xml + model.bin), its token-wise ops on the real tokens
    only (compile/unpad.py), and the IR before that rewrite beside it (PADDED_FILE); returns the fused-op counts."""
    import torch

    from encoderrt.compile.export import GraphInputs, example_inputs, load_export_model

    ov = _openvino()
    from openvino.frontend.pytorch.ts_decoder import TorchScriptPythonDecoder

    module = GraphInputs(load_export_model(source, "sdpa", padding_masks=True), source)
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        # convert_model's own decoder, without torch.jit.trace's check (a second run and a second trace to compare
        # them, a quarter of a small model's conversion): parity checks the IR against PyTorch on every probe
        decoder = TorchScriptPythonDecoder(module, example_input=example_inputs(source), trace_kwargs={"check_trace": False})
        model = ov.convert_model(decoder)
    for port, name in zip(model.inputs, source.graph_inputs):
        port.get_tensor().set_names({name})
    for port, name in zip(model.outputs, source.graph_outputs):
        port.get_tensor().set_names({name})
    keep_gated_ffns_unfused(model)
    counts = op_counts(model)
    if source.architecture.rms_norm:  # the CPU plugin fuses RMSNorm as it compiles; the IR holds its pieces
        runtime = ov.Core().compile_model(model, "CPU").get_runtime_model()
        counts["RMS"] = sum(op.get_rt_info()["layerType"].astype(str) == "RMS" for op in runtime.get_ops())
    check_fusion(counts, source.num_layers, source.architecture.expected_gelus(source.head_task, source.config))
    ov.save_model(model, str(path.with_name(PADDED_FILE)), compress_to_fp16=False)
    if unpadded := unpad_openvino(model, scored_unattended(source)):
        counts[UNPADDED] = unpadded
    ov.save_model(model, str(path), compress_to_fp16=False)
    return counts


def op_counts(model) -> dict[str, int]:
    counted = collections.Counter(op.get_type_name() for op in model.get_ops())
    return {op: counted[op] for op in _COUNTED_OPS if counted[op]}


def ffn_down_projections(path: Path) -> list[str]:
    """Names of each layer's FFN down projection in the IR at `path`: the MatMuls fed by a GELU, or by a gated
    FFN's product (SwiGLU, GeGLU: Multiply with a Swish or a GELU beside the up projection)."""
    model = _openvino().Core().read_model(str(path))

    def after_activation(op) -> bool:
        source = op.input_value(0).get_node()
        return gated_product(source) or source.get_type_name() == "Gelu"

    return [op.get_friendly_name() for op in model.get_ops() if op.get_type_name() == "MatMul" and after_activation(op)]


_WEIGHT_PATH_OPS = ("Convert", "Transpose", "Reshape", "Unsqueeze", "Squeeze")


def computed_weight_matmuls(model) -> list[str]:
    """Names of the MatMuls whose weight is computed rather than stored: the task adapters' LoRA products, their
    low-rank matrices gathered per row (compile/lora.py). NNCF would quantise that weight as an activation, in
    8 bits where the CPU's int8 kernels saturate (no VNNI: the tiny jina-v3 with its adapters fell to min cosine
    0.946 on an AVX2 EPYC); at rank 4-64 they are no GEMM work worth quantising."""

    def stored(node) -> bool:
        while node.get_type_name() in _WEIGHT_PATH_OPS:
            node = node.input_value(0).get_node()
        return node.get_type_name() == "Constant"

    return [op.get_friendly_name() for op in model.get_ops()
            if op.get_type_name() == "MatMul" and not stored(op.input_value(1).get_node())]


def quantize_openvino(path: Path, quantized: Path, batches: list[dict[str, np.ndarray]], keep: list[str],
                      smoothing: float | None = None, seven_bit_weights: bool = False) -> dict[str, int]:
    """NNCF post-training int8 of the IR at `path`, calibrated on `batches`, leaving the MatMuls named in `keep`
    and the attention itself in bf16; `smoothing` is SmoothQuant's alpha (None: NNCF's default);
    `seven_bit_weights` for a CPU without int8 dot products (runtime/cpu.py), whose kernels would saturate on
    8-bit ones (NNCF's overflow fix on every layer; by default, on the first). Returns the new op counts."""
    ov = _openvino()
    try:
        with without_usage_telemetry():
            import nncf
    except ImportError:
        raise CompileError("--target openvino --precision int8 needs NNCF: pip install 'encoderrt[compile]'") from None
    nncf.set_log_level(logging.ERROR)
    model = ov.Core().read_model(str(path))
    ignored = nncf.IgnoredScope(names=[*keep, *computed_weight_matmuls(model)], types=["ScaledDotProductAttention"],
                                validate=False)
    overflow = nncf.OverflowFix.ENABLE if seven_bit_weights else nncf.OverflowFix.FIRST_LAYER
    advanced = nncf.AdvancedQuantizationParameters(overflow_fix=overflow)
    if smoothing is not None:
        advanced.smooth_quant_alphas = nncf.AdvancedSmoothQuantParameters(matmul=smoothing)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = nncf.quantize(model, nncf.Dataset(batches), subset_size=len(batches), model_type=nncf.ModelType.TRANSFORMER,
                               ignored_scope=ignored, advanced_parameters=advanced)
    ov.save_model(result, str(quantized), compress_to_fp16=False)
    return op_counts(result)


def calibration_batches(tokenizer: TextTokenizer, task: str, adapters: int = 0) -> list[dict[str, np.ndarray]]:
    """The TensorRT path's calibration texts, plus very short and long texts: activation ranges depend on length,
    and a static int8 graph meets every length the probes (and users) send. With task adapters, the rows take
    turns through them and none: ranges calibrated on adapter 0 alone (zeros) wiped the tasks out (min cosine 0.09)."""
    batches = qdq.calibration_batches(tokenizer, task)
    if task != "score":
        longs = texts.word_windows()
        batches += [tokenizer.pad(tokenizer.encode(list(rows))) for rows in (texts.SHORT_TEXTS, longs[:6], longs[6:])]
    for turn, feeds in enumerate(batches):
        if ADAPTER in feeds:
            feeds[ADAPTER] = (np.arange(len(feeds[ADAPTER])) + turn) % (adapters + 1)
    return batches


def build(build: Build, folder: Path) -> Manifest:
    """fp32 and bf16 candidates share one IR (bf16 is a hint at load); int8 quantises it."""
    source, precision, reporter = build.source, build.options.precision, build.reporter
    exported = build.work / "openvino" / MODEL_FILE
    if "openvino_fused_ops" not in build.shared:
        exported.parent.mkdir(exist_ok=True)
        with reporter.step("export", f"{source.architecture.name} {source.task} to OpenVINO IR (SDPA attention)"):
            build.shared["openvino_fused_ops"] = export_openvino(source, exported)
    fused_ops = build.shared["openvino_fused_ops"]
    if precision == "bf16" and not native_bf16():
        reporter.note("this CPU has no bf16 instructions (AMX or avx512_bf16): the bf16 artifact runs in f32 here, "
                      "in bf16 on CPUs that have them")
    manifest = build.manifest(folder, fused_ops, model_file=MODEL_FILE)
    if precision == "int8":
        return _quantized(build, folder, exported.with_name(PADDED_FILE), manifest)
    for suffix in (".xml", ".bin"):
        shutil.copyfile(exported.with_suffix(suffix), (folder / MODEL_FILE).with_suffix(suffix))
    figures, failures = build.verify(manifest, folder)
    build.require(figures, failures)
    return replace(manifest, parity=figures)


def _int8_settings(exported: Path, seven_bit_weights: bool) -> Iterator[dict[str, Any]]:
    """What each int8 attempt leaves in bf16 and how it smooths, in order; the fallback's names are read from the
    IR only if the first attempt misses the floor.

    A CPU without int8 dot products (7-bit weights) keeps the FFN down projections from the start: on an AVX2 EPYC
    all-MiniLM-L6-v2 without them missed the floor at every alpha (min cosine 0.960-0.974), and the tiny NomicBERT
    met it on the probes (0.991) but not on held-out text (0.975; 0.992 and 0.98+ with them kept)."""
    if seven_bit_weights:
        yield {"kept_nodes": ffn_down_projections(exported), "smooth_quant_alpha": SMOOTHING_ALPHA_7BIT}
        return
    yield {"kept_nodes": [], "smooth_quant_alpha": SMOOTHING_ALPHA}
    # measured on all-MiniLM-L6-v2, text neither calibration nor probes hold: min cosine 0.984 with SmoothQuant
    # beside the kept projections, 0.963 without
    yield {"kept_nodes": ffn_down_projections(exported), "smooth_quant_alpha": SMOOTHING_ALPHA}


def _quantized(build: Build, folder: Path, exported: Path, manifest: Manifest) -> Manifest:
    """int8 with the attention in bf16 and SmoothQuant at this CPU's alpha; where that misses the floor, the FFN
    down projections stay in bf16 too (their GELU outliers defeat one per-tensor scale), as the onnxruntime int8
    path does. Every attempt is recorded."""
    from encoderrt.compile.parity import artifact_tokenizer

    batches = calibration_batches(artifact_tokenizer(manifest, folder), build.source.task, len(manifest.adapters))
    attempts: list[dict[str, Any]] = []
    seven_bit = not int8_dot_products()
    for settings in _int8_settings(exported, seven_bit):
        keep, smoothing = settings["kept_nodes"], settings["smooth_quant_alpha"]
        detail = "NNCF static int8, attention in bf16" + (f", {len(keep)} FFN down projections kept" if keep else
                                                          f", SmoothQuant alpha {smoothing}")
        with build.reporter.step("quantise", detail):
            fused_ops = quantize_openvino(exported, folder / MODEL_FILE, batches, keep, smoothing, seven_bit)
        figures, failures = build.verify(manifest, folder)
        attempts.append({**settings, "parity": figures, "failures": failures})
        if not failures:
            break
    build.require(figures, failures)
    return replace(manifest, fused_ops=fused_ops, parity={**figures, **settings, "attempts": attempts[:-1]})
