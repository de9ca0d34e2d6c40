"""export -> fuse -> quantise -> verify -> artifact, as one call."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from encoderrt.compile.artifact import ArtifactWriter, check_output_dir
from encoderrt.compile.errors import CompileError, InputError, ParityError
from encoderrt.compile.options import CompileOptions
from encoderrt.compile.progress import StepReporter
from encoderrt.compile.source import SourceModel, inspect_source
from encoderrt.runtime.manifest import Manifest, ModelShape
from encoderrt.runtime.tokenizer import TOKENIZER_FILE
from encoderrt.versions import package_versions

MODEL_FILE = "model.onnx"
_RECORDED_PACKAGES = ("encoderrt", "torch", "transformers", "sentence-transformers", "onnx", "onnxruntime", "tokenizers")


@dataclass(frozen=True)
class CompileResult:
    path: Path
    manifest: Manifest
    timings: dict[str, float]


def _save_tokenizer(source: SourceModel, folder: Path) -> int:
    """Copy the tokenizer as a fast-tokenizer file set; returns the pad token id."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source.weights_folder, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot load the tokenizer from {source.weights_folder}: {exc}") from None
    if not tokenizer.is_fast:
        raise InputError(f"the tokenizer in {source.weights_folder} has no fast (tokenizers) version")
    tokenizer.save_pretrained(folder)
    if not (folder / TOKENIZER_FILE).is_file():
        raise InputError(f"the tokenizer in {source.weights_folder} could not be saved as {TOKENIZER_FILE}")
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else source.config.get("pad_token_id") or 0)


def _manifest(source: SourceModel, options: CompileOptions, pad_token_id: int, fused_ops: dict[str, int]) -> Manifest:
    config = source.config
    return Manifest(
        task=source.task,
        architecture=source.architecture.name,
        model_type=str(config["model_type"]),
        max_length=source.max_length,
        pad_token_id=pad_token_id,
        inputs=source.architecture.input_names,
        outputs=("embeddings" if source.task == "embed" else "logits",),
        precision=options.precision,
        target="cpu",
        model_file=MODEL_FILE,
        shape=ModelShape(
            hidden_size=source.hidden_size,
            num_layers=source.num_layers,
            num_heads=source.num_heads,
            intermediate_size=int(config.get("intermediate_size", 4 * source.hidden_size)),
            vocab_size=int(config["vocab_size"]),
            output_dim=source.hidden_size if source.task == "embed" else len(source.labels),
        ),
        pooling=source.pooling,
        normalize=source.normalize,
        activation=source.activation,
        labels=source.labels,
        source={
            "name": options.name or source.folder.absolute().name,
            "path": str(source.folder.absolute()),
            "kind": source.kind,
            "base_model": config.get("_name_or_path"),
        },
        fused_ops=fused_ops,
        versions=package_versions(_RECORDED_PACKAGES),
    )


def compile_model(options: CompileOptions, reporter: StepReporter | None = None) -> CompileResult:
    reporter = reporter or StepReporter(quiet=options.quiet)
    source = inspect_source(options)
    check_output_dir(options.output_dir, options.force)
    _check_target(options, source)
    for note in source.notes:
        reporter.note(note)

    try:
        from encoderrt.compile.export import export_onnx, load_torch_model
        from encoderrt.compile.optimize import fuse
        from encoderrt.compile.parity import build_probes, check_parity
        from encoderrt.compile.quantize import ffn_down_projections, quantize_int8
    except ImportError as exc:
        raise CompileError(f"compiling needs the compile extra ({exc.name} is missing): pip install 'encoderrt[compile]'") from None

    with tempfile.TemporaryDirectory(prefix="encoderrt-compile-") as work, ArtifactWriter(options.output_dir, options.force) as writer:
        assert writer.staging is not None
        exported, optimized, final = Path(work) / "exported.onnx", Path(work) / "optimized.onnx", writer.staging / MODEL_FILE
        if options.target == "tensorrt":
            return _compile_tensorrt(source, options, reporter, writer, Path(work))
        with reporter.step("export", f"{source.architecture.name} {source.task} from {source.kind} folder"):
            export_onnx(source, load_torch_model(source), exported)
        with reporter.step("optimise", "fusing attention, LayerNorm and GELU"):
            fused_ops = fuse(source, exported, optimized)
        if options.precision == "int8":
            plans: list[tuple[str, ...]] = [(), tuple(ffn_down_projections(optimized))]
        else:
            plans = [()]
            shutil.copyfile(optimized, final)
        pad_token_id = _save_tokenizer(source, writer.staging)
        manifest = _manifest(source, options, pad_token_id, fused_ops)
        with reporter.step("reference", "PyTorch on the probe set"):
            probes = build_probes(source, manifest, writer.staging)
        attempts = []
        for keep_fp32 in plans:
            if options.precision == "int8":
                detail = "dynamic int8, per channel" + (f", {len(keep_fp32)} FFN down projections kept fp32" if keep_fp32 else "")
                with reporter.step("quantise", detail):
                    quantize_int8(optimized, final, keep_fp32)
            with reporter.step("verify", f"parity against PyTorch ({options.precision})"):
                figures, failures = check_parity(manifest, writer.staging, probes)
            attempts.append({"fp32_nodes": list(keep_fp32), "parity": figures, "failures": failures})
            if not failures:
                break
        if failures:
            raise ParityError(f"parity check failed: {'; '.join(failures)}; figures: {figures}")
        if options.precision == "int8":
            figures = {**figures, "fp32_nodes": list(keep_fp32), "attempts": attempts[:-1]}
        manifest = writer.commit(replace(manifest, parity=figures, target=options.target))
    return CompileResult(path=options.output_dir, manifest=manifest, timings=reporter.timings)


def _check_target(options: CompileOptions, source: SourceModel) -> None:
    if options.layout == "packed" and options.target != "tensorrt":
        raise InputError(f"--layout packed needs --target tensorrt (its attention is a TensorRT plugin), not {options.target}")
    if options.layout == "packed":
        from encoderrt.kernels import PACKED_HEAD_DIMS

        head_dim = source.hidden_size // source.num_heads
        if head_dim not in PACKED_HEAD_DIMS:
            raise InputError(f"--layout packed supports head sizes {PACKED_HEAD_DIMS}; this model's is {head_dim}")
    if options.target == "tensorrt":
        from encoderrt.compile.tensorrt import check_builder

        check_builder(options.precision, options.layout)
        return
    allowed = {"cpu": ("fp32", "int8"), "cuda": ("fp32",)}[options.target]
    if options.precision not in allowed:
        raise InputError(f"--precision {options.precision} is not available for --target {options.target}; "
                         f"choose {', '.join(allowed)}")


def _compile_tensorrt(source: SourceModel, options: CompileOptions, reporter: StepReporter, writer: ArtifactWriter,
                      work: Path) -> CompileResult:
    """The graph (parity checked on the CPU), then the engine for this GPU (parity checked there)."""
    from encoderrt.compile.parity import build_probes, check_parity
    from encoderrt.compile.tensorrt import ENGINE_FILE, build_engine, plan_packed, plan_profiles

    assert writer.staging is not None
    packed = options.layout == "packed"
    manifest, graph_inputs, graph_notes = _tensorrt_graph(source, options, reporter, writer.staging, work)
    probes = build_probes(source, manifest, writer.staging)
    where = "onnx's reference evaluator, the plugin in numpy" if packed else "onnxruntime CPU"
    with reporter.step("verify", f"parity of the TensorRT graph on {where} ({manifest.precision})"):
        graph_figures, failures = check_parity(manifest, writer.staging, probes)
    if failures:
        raise ParityError(f"parity check of the graph failed: {'; '.join(failures)}; figures: {graph_figures}")
    profiles = () if packed else plan_profiles(source.max_length, options.max_batch_tokens)
    packed_shapes = plan_packed(options.max_batch_tokens) if packed else None
    with reporter.step("build", f"TensorRT {options.precision}, " + ("one packed profile" if packed else f"{len(profiles)} optimisation profiles")):
        record = build_engine(writer.staging / MODEL_FILE, writer.staging / ENGINE_FILE, options.precision, profiles,
                              packed_shapes, graph_inputs)
    manifest = replace(manifest, precision=options.precision, target="tensorrt",
                       engine={"file": ENGINE_FILE, "record": record.to_dict()})
    with reporter.step("verify", f"parity of the engine on this GPU ({options.precision})"):
        figures, failures = check_parity(manifest, writer.staging, probes)
    if failures:
        raise ParityError(f"parity check of the engine failed: {'; '.join(failures)}; figures: {figures}")
    manifest = writer.commit(replace(manifest, parity={**figures, "graph": {**graph_figures, **graph_notes}}))
    return CompileResult(path=options.output_dir, manifest=manifest, timings=reporter.timings)


def _tensorrt_graph(source: SourceModel, options: CompileOptions, reporter: StepReporter, staging: Path,
                    work: Path) -> tuple[Manifest, tuple[str, ...], dict[str, Any]]:
    """Write the graph TensorRT will build from, and the manifest that runs it on this CPU (for its parity).

    Returns that manifest, the graph's input names, and what quantisation did.
    """
    from encoderrt.compile.packed import export_packed, packed_attention_count
    from encoderrt.compile.parity import artifact_tokenizer
    from encoderrt.compile.qdq import calibration_batches, quantize_qdq, smooth
    from encoderrt.compile.tensorrt import export_for_tensorrt, standard_attention_count
    from encoderrt.runtime.packing import packed_input_names

    final, int8 = staging / MODEL_FILE, options.precision == "int8"
    if options.layout == "packed":
        with reporter.step("export", f"{source.architecture.name} {source.task}, packed, attention through the plugin"):
            export_packed(source, final)
            fused_ops = {"PackedAttention": packed_attention_count(final, source.num_layers)}
        graph_target, graph_inputs = "onnx-reference", packed_input_names(source.architecture.uses_token_type_ids)
    else:
        exported = work / "exported.onnx" if int8 else final
        with reporter.step("export", f"{source.architecture.name} {source.task}, opset 23 with standard Attention"):
            export_for_tensorrt(source, exported)
            fused_ops = {"Attention": standard_attention_count(exported, source.num_layers)}
        graph_target, graph_inputs = "cpu", source.architecture.input_names
    pad_token_id = _save_tokenizer(source, staging)
    manifest = replace(_manifest(source, options, pad_token_id, fused_ops), precision="int8" if int8 else "fp32",
                       target=graph_target, layout=options.layout)
    if not int8:
        return manifest, graph_inputs, {}
    with reporter.step("quantise", "static int8 QDQ, SmoothQuant on LayerNorm-fed MatMuls, calibrated on built-in texts"):
        batches = calibration_batches(artifact_tokenizer(manifest, staging), source.task)
        smoothed = smooth(exported, work / "smoothed.onnx", batches)
        kept = quantize_qdq(work / "smoothed.onnx", final, batches)
    return manifest, graph_inputs, {"smoothed_inputs": smoothed, "half_precision_nodes": kept}
