"""The TensorRT target: an ONNX graph TensorRT fuses, optimisation profiles, the engine and its record.

Two graph layouts. Padded (the default): exported with SDPA attention at opset 23, where torch's
exporter emits the standard ONNX `Attention` op (non-causal) that TensorRT 10.14+ parses into its
fused attention layer; onnxruntime's CPU runs the same graph, so its parity is checked on any
machine. Packed (compile/packed.py): padding-free, attention through encoderrt's plugin. Building
the engine needs TensorRT and an NVIDIA GPU; the engine is tied to both, and the record says which.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

from encoderrt.compile.build import Build
from encoderrt.compile.errors import CompileError, FusionError, InputError
from encoderrt.compile.source import SourceModel
from encoderrt.runtime.engine_record import EngineRecord, PackedShapes, Profile, Shapes
from encoderrt.runtime.manifest import Manifest

TENSORRT_OPSET = 23
MODEL_FILE = "model.onnx"
ENGINE_FILE = "engine.plan"
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
PACKED_PRECISIONS = ("fp16", "bf16")
"""The packed attention kernel computes in fp16/bf16 on the tensor cores."""
MIN_SEQUENCE_BUCKET = 32
MAX_PACKED_SEQUENCES = 512
_ATTENTION_LAYER = re.compile(r"attention|mha|plugin", re.IGNORECASE)
"""Layer types of TensorRT's fused attention, and of the packed attention plugin (a plugin layer)."""


def plan_profiles(max_length: int, max_batch_tokens: int) -> tuple[Profile, ...]:
    """Sequence buckets by powers of two up to max_length; each profile's batch fits the token budget.

    A batch of width w runs in the profile whose bucket holds w, so kernels are tuned for shapes
    close to the ones served, and no profile asks for more rows than the budget allows.
    """
    if max_length < 1 or max_batch_tokens < max_length:
        raise ValueError(f"need 1 <= max_length ({max_length}) <= max_batch_tokens ({max_batch_tokens})")
    bounds = []
    upper = MIN_SEQUENCE_BUCKET
    while upper < max_length:
        bounds.append(upper)
        upper *= 2
    bounds.append(max_length)
    profiles, lower = [], 1
    for upper in bounds:
        profiles.append(Profile(lower, upper, max(1, max_batch_tokens // lower), max(1, max_batch_tokens // upper)))
        lower = upper + 1
    return tuple(profiles)


def export_for_tensorrt(source: SourceModel, path: Path) -> None:
    """Dynamo export at opset 23 with SDPA attention: one standard ONNX Attention op per layer."""
    import torch

    from encoderrt.compile.export import example_inputs, load_export_model, output_name

    module = load_export_model(source, "sdpa")
    names = list(source.architecture.input_names)
    batch = torch.export.Dim("batch")
    sequence = torch.export.Dim("sequence", min=2, max=source.max_length)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            module, example_inputs(source), dynamo=True, opset_version=TENSORRT_OPSET,
            input_names=names, output_names=[output_name(source)],
            dynamic_shapes={name: {0: batch, 1: sequence} for name in names}, verbose=False,
        )
    program.save(str(path))


def standard_attention_count(path: Path, num_layers: int, causal: bool = False) -> int:
    """Count ONNX Attention ops, causal for a decoder family and non-causal otherwise; anything but one per layer
    is refused."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    nodes = [n for n in graph.node if n.op_type == "Attention" and n.domain in ("", "ai.onnx")]
    wrong = [n.name for n in nodes if any(a.name == "is_causal" and a.i for a in n.attribute) != causal]
    if wrong:
        kind, family = ("non-causal", "a decoder needs causal") if causal else ("causal", "encoders need non-causal")
        raise FusionError(f"the TensorRT graph has {kind} attention in {wrong}; {family} attention")
    if len(nodes) != num_layers:
        raise FusionError(f"the TensorRT graph has {len(nodes)} standard Attention ops for {num_layers} layers")
    return len(nodes)


def plan_packed(max_batch_tokens: int, max_sequences: int = MAX_PACKED_SEQUENCES) -> PackedShapes:
    """One profile: the token budget's worth of real tokens, in at most max_sequences sequences per engine call."""
    if max_batch_tokens < 1 or max_sequences < 1:
        raise ValueError(f"need positive max_batch_tokens ({max_batch_tokens}) and max_sequences ({max_sequences})")
    return PackedShapes(max_tokens=max_batch_tokens, max_sequences=min(max_sequences, max_batch_tokens))


def check_builder(precision: str, layout: str = "padded") -> None:
    """Fail before any work when the engine cannot be built here."""
    allowed = PACKED_PRECISIONS if layout == "packed" else PRECISIONS
    if precision not in allowed:
        raise InputError(f"--precision {precision} is not available for --target tensorrt --layout {layout}; "
                         f"choose {', '.join(allowed)}")
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        raise InputError("--target tensorrt needs TensorRT and an NVIDIA GPU: pip install 'encoderrt[gpu]'") from None
    import torch

    if not torch.cuda.is_available():
        raise InputError("--target tensorrt needs an NVIDIA GPU; none is visible")


def build_engine(onnx_path: Path, engine_path: Path, precision: str, profiles: tuple[Profile, ...],
                 packed: PackedShapes | None, graph_inputs: tuple[str, ...]) -> EngineRecord:
    """Build for the visible GPU; `packed` set means the graph's attention is encoderrt's plugin."""
    import tensorrt as trt
    import torch

    if packed:
        import encoderrt.kernels.tensorrt_plugin  # noqa: F401 - registers the plugin the graph's attention nodes name

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise CompileError(f"TensorRT could not parse the graph: {errors}")
    config = builder.create_builder_config()
    # int8: the graph's QDQ pairs say which GEMMs run in int8 (explicit quantisation); the rest runs in fp16
    for flag in {"fp32": (), "fp16": ("FP16",), "bf16": ("BF16",), "int8": ("INT8", "FP16")}[precision]:
        config.set_flag(getattr(trt.BuilderFlag, flag))
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    for shapes in optimisation_profiles(profiles, packed, graph_inputs):
        _add_profile(builder, config, shapes)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise CompileError("TensorRT could not build the engine (see its log above)")
    engine_path.write_bytes(bytes(serialized))
    engine = trt.Runtime(logger).deserialize_cuda_engine(serialized)
    layers = json.loads(engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON))
    # by layer type, not name: unfused layers keep names such as ".../attention/output/dense"
    layer_types = [str(layer.get("LayerType", "")) for layer in layers.get("Layers", []) if isinstance(layer, dict)]
    fused = sum(1 for layer_type in layer_types if _ATTENTION_LAYER.search(layer_type))
    major, minor = torch.cuda.get_device_capability()
    return EngineRecord(trt.__version__, f"{major}.{minor}", precision, profiles, fused or None, packed)


def optimisation_profiles(profiles: tuple[Profile, ...], packed: PackedShapes | None,
                          graph_inputs: tuple[str, ...]) -> list[dict[str, Shapes]]:
    """Each profile's (min, opt, max) shape for every graph input, as the builder sets them."""
    if packed:
        return [{name: packed.shapes(name) for name in graph_inputs}]
    return [{name: profile.shapes() for name in graph_inputs} for profile in profiles]


def _add_profile(builder, config, shapes: dict[str, Shapes]) -> None:
    profile = builder.create_optimization_profile()
    for name, (minimum, optimum, maximum) in shapes.items():
        profile.set_shape(name, minimum, optimum, maximum)
    config.add_optimization_profile(profile)


def build(build: Build, folder: Path) -> Manifest:
    """The graph (parity checked on the CPU), then the engine for this GPU (parity checked there)."""
    options, packed = build.options, build.options.layout == "packed"
    manifest, graph_inputs, graph_notes = _graph(build, folder)
    where = "onnx's reference evaluator, the plugin in numpy" if packed else "onnxruntime CPU"
    graph_figures, failures = build.verify(manifest, folder, f"parity of the TensorRT graph on {where}")
    build.require(graph_figures, failures, "parity check of the graph")
    profiles = () if packed else plan_profiles(build.source.max_length, options.max_batch_tokens)
    packed_shapes = plan_packed(options.max_batch_tokens) if packed else None
    detail = f"TensorRT {options.precision}, " + ("one packed profile" if packed else f"{len(profiles)} optimisation profiles")
    with build.reporter.step("build", detail):
        record = build_engine(folder / MODEL_FILE, folder / ENGINE_FILE, options.precision, profiles, packed_shapes,
                              graph_inputs)
    manifest = replace(manifest, precision=options.precision, target="tensorrt",
                       engine={"file": ENGINE_FILE, "record": record.to_dict()})
    figures, failures = build.verify(manifest, folder, "parity of the engine on this GPU")
    build.require(figures, failures, "parity check of the engine")
    return replace(manifest, parity={**figures, "graph": {**graph_figures, **graph_notes}})


def _graph(build: Build, folder: Path) -> tuple[Manifest, tuple[str, ...], dict[str, Any]]:
    """Write the graph TensorRT will build from, and the manifest that runs it on this CPU (for its parity).

    Returns that manifest, the graph's input names, and what quantisation did.
    """
    from encoderrt.compile.packed import export_packed, packed_attention_count
    from encoderrt.compile.parity import artifact_tokenizer
    from encoderrt.compile.qdq import calibration_batches, quantize_qdq, smooth
    from encoderrt.runtime.packing import packed_input_names

    source, options, reporter = build.source, build.options, build.reporter
    final, int8 = folder / MODEL_FILE, options.precision == "int8"
    if options.layout == "packed":
        if not source.architecture.packed_layout:
            raise InputError(f"--layout packed does not cover {source.architecture.name} models yet; use --layout padded")
        if source.dense_folders:
            raise InputError("--layout packed has no Dense modules after pooling; use --layout padded")
        if source.task == "embed" and source.pooling not in ("cls", "mean"):
            raise InputError(f"--layout packed pools with cls or mean, not {source.pooling}; use --layout padded")
        with reporter.step("export", f"{source.architecture.name} {source.task}, packed, attention through the plugin"):
            export_packed(source, final)
            fused_ops = {"PackedAttention": packed_attention_count(final, source.num_layers)}
        graph_target, graph_inputs = "onnx-reference", packed_input_names(source.architecture.uses_token_type_ids)
    else:
        exported = build.work / "exported.onnx" if int8 else final
        with reporter.step("export", f"{source.architecture.name} {source.task}, opset 23 with standard Attention"):
            export_for_tensorrt(source, exported)
            fused_ops = {"Attention": standard_attention_count(exported, source.num_layers, source.architecture.causal)}
        graph_target, graph_inputs = "cpu", source.architecture.input_names
    manifest = build.manifest(folder, fused_ops, precision="int8" if int8 else "fp32", target=graph_target,
                              layout=options.layout, model_file=MODEL_FILE, outputs=(source.output_name,))
    if not int8:
        return manifest, graph_inputs, {}
    with reporter.step("quantise", "static int8 QDQ, SmoothQuant on LayerNorm-fed MatMuls, calibrated on built-in texts"):
        batches = calibration_batches(artifact_tokenizer(manifest, folder), source.task)
        smoothed = smooth(exported, build.work / "smoothed.onnx", batches)
        kept = quantize_qdq(build.work / "smoothed.onnx", final, batches)
    return manifest, graph_inputs, {"smoothed_inputs": smoothed, "half_precision_nodes": kept}
