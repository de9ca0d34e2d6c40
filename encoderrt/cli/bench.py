"""`encoderrt bench`: performance reports against sentence-transformers, and regression checks for CI."""

from __future__ import annotations

import argparse
from pathlib import Path

from encoderrt.cli import common
from encoderrt.compile.cache import FolderCompile
from encoderrt.compile.errors import CompileError
from encoderrt.runtime import settings

HELP = "performance report and regression check"


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"concurrency levels must be positive, got '{text}'")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="?", type=Path, default=None, metavar="ARTIFACT_OR_MODEL",
                        help="artifact or model folder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--workload", choices=["queries", "passages", "rerank", "all"], default="all")
    parser.add_argument("--mode", choices=["engine", "http", "grpc", "both", "all"], default="engine",
                        help="the engine in process, the server over HTTP or over TEI's gRPC streams; both: engine "
                             "and http; all: the three")
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
    settings.add_arguments(parser, FolderCompile)
    parser.add_argument("--scale", type=float, default=1.0, help="workload size factor")
    parser.add_argument("--url", default=None, metavar="URL",
                        help="http mode against a server already serving this model at URL (e.g. `encoderrt serve --ray`)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run each measurement in N alternating rounds; figures are medians over them")


def run(args: argparse.Namespace) -> int:
    from encoderrt.bench.command import BenchOptions, run_bench
    from encoderrt.bench.http_client import HttpError
    from encoderrt.bench.references import parse_kinds
    from encoderrt.runtime.manifest import ManifestError

    console = common.console()
    if refusal := _refusal(args):
        common.error(console, refusal)
        return 2
    try:
        references = parse_kinds(args.reference) if args.reference else ()
    except ValueError as exc:
        common.error(console, str(exc))
        return 2
    if references and references[0] != "torch":
        references = ("torch", *(k for k in references if k != "torch"))  # every ratio is against fp32 torch
    common.offline_and_quiet()
    options = BenchOptions(
        target=args.target,
        workloads=("queries", "passages", "rerank") if args.workload == "all" else (args.workload,),
        modes={"both": ("engine", "http"), "all": ("engine", "http", "grpc")}.get(args.mode, (args.mode,)),
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
        url=args.url.rstrip("/") if args.url else None,
        compile_precision=args.compile_precision,
    )
    try:
        return run_bench(options, console)
    except (ValueError, FileNotFoundError, ManifestError, CompileError) as exc:
        common.error(console, str(exc))
        return 2
    except HttpError as exc:  # the server measured failed (or `--url` names none): its reply, in one line
        common.error(console, f"the server under test failed: {exc}")
        return 1
    except KeyboardInterrupt:
        console.print("[red]interrupted[/]")
        return 130


def _refusal(args: argparse.Namespace) -> str | None:
    """The first argument the bench cannot run with, in words (None: none), before anything loads."""
    checks = (
        (args.target is not None and not args.target.is_dir(), f"model or artifact folder not found: {args.target}"),
        (args.texts is not None and not args.texts.is_file(), f"texts file not found: {args.texts}"),
        (args.check is not None and not args.check.is_file(), f"baseline not found: {args.check}"),
        (args.url and args.mode == "http" and args.max_batch_tokens is not None,  # no engine of ours runs
         common.applies_to(["--max-batch-tokens"], "the engine the bench runs itself; the server at --url batches "
                           "under its own budget (its serve flag)")),
        (args.url and args.mode in ("grpc", "all"), "--url measures HTTP only: gRPC runs against the server the bench "
                                                    "starts"),
        (args.repeat < 1, f"--repeat must be at least 1, got {args.repeat}"),
        (args.duration < 0, f"--duration must be at least 0 seconds (0: one pass), got {args.duration:g}"),
        (args.scale <= 0, f"--scale must be above 0, got {args.scale:g}"),
        (not 0 <= args.tolerance < 1, f"--tolerance must be in [0, 1), got {args.tolerance}"),
    )
    return next((message for failed, message in checks if failed), None)
