"""`encoderrt embed`: a corpus in files -> vectors in Parquet (or .npy) shards, resumable; `--ray` on Ray Data.

`encoderrt score` (cli/score.py) is the same job over query/document pairs; both take their flags from the
declarations of JobSettings, the output kinds (jobs/outputs.py) and EngineConfig.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from encoderrt.cli import common
from encoderrt.runtime import settings
from encoderrt.runtime.config import EngineConfig

HELP = "embed a corpus from JSONL, CSV, Parquet or text files into Parquet shards (resumable; --ray for Ray Data)"
ENGINE_SETTINGS = ("max_batch_tokens", "sessions", "intra_op_threads")
"""The engine's settings that mean something to a job (its queue limits are the job's own)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_job_arguments(parser, ("text_field",))
    what = parser.add_argument_group("what to compute (default: dense embeddings)")
    kinds = what.add_mutually_exclusive_group()
    kinds.add_argument("--sparse", action="store_true", help="sparse (SPLADE, bge-m3 lexical) weights")
    kinds.add_argument("--multi-vector", action="store_true", help="token vectors (ColBERT, bge-m3)")
    added: set[str] = set()  # a flag several kinds take (--prompt-name): once
    for kind in reversed(_output_kinds()):  # the default kind's flags first
        own = [item.name for item in settings.declared(kind) if item.name not in added]
        settings.add_arguments(what, kind, only=own)
        added.update(own)


def add_job_arguments(parser: argparse.ArgumentParser, value_fields: tuple[str, ...]) -> None:
    """The flags every job command takes; `value_fields`: the settings naming its input's value fields."""
    from encoderrt.jobs.job import JobSettings
    from encoderrt.jobs.placement import RayPlacement

    pair_or_text = {"text_field", "query_field", "document_field"}

    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="files, folders (their .jsonl/.json/.csv/.tsv/.parquet/.txt files) or globs, in order")
    parser.add_argument("-o", "--output", required=True, type=Path,
                        help="the output folder: shards and job.json; rerun the same command to resume")
    parser.add_argument("--model", type=Path, default=None,
                        help="an artifact or model folder (default: the bundled all-MiniLM-L6-v2)")
    settings.add_arguments(parser.add_argument_group("input and output"), JobSettings,
                           only=[item.name for item in settings.declared(JobSettings)
                                 if item.name not in pair_or_text or item.name in value_fields])
    settings.add_arguments(parser.add_argument_group("engine"), EngineConfig, only=ENGINE_SETTINGS)
    ray = parser.add_argument_group("on a Ray cluster (pip install 'encoderrt[ray]')")
    ray.add_argument("--ray", action="store_true",
                     help="run on Ray Data: the cluster at --ray-address or RAY_ADDRESS, else a local one")
    ray.add_argument("--ray-address", default=None, metavar="ADDRESS",
                     help="the cluster to join (default: RAY_ADDRESS)")
    ray.add_argument("--ray-actors", type=int, default=None, metavar="N",
                     help="engines (Ray actors) at once, each on --ray-cpus-per-actor CPUs (default: the cluster's "
                          "CPUs / that)")
    ray.add_argument("--ray-cpus-per-actor", type=int, default=RayPlacement().cpus_per_actor, metavar="N",
                     help="CPUs each engine runs on")


def run(args: argparse.Namespace) -> int:
    kinds = _output_kinds()
    kind_class = next(kind for kind, (_, chosen) in kinds.items() if chosen(args))
    if refusal := _flags_it_ignores(kind_class, kinds, args):
        return _refuse(refusal)
    try:
        kind = settings.from_arguments(kind_class, args)
    except ValueError as exc:  # a value the kind cannot take (--pool-factor 0.5)
        return _refuse(str(exc))
    return run_job_command(args, kind)


Kinds = dict[type, tuple[str, Callable[[argparse.Namespace], bool]]]
"""Output kinds: what each is called on the command line, and whether the parsed flags ask for it."""


def _output_kinds() -> Kinds:
    """The output kinds `embed` writes; the first one the flags ask for is the job's."""
    from encoderrt.jobs.outputs import Embeddings, SparseWeights, TokenVectors

    return {SparseWeights: ("sparse weights (--sparse)", lambda args: args.sparse),
            TokenVectors: ("token vectors (--multi-vector)", lambda args: args.multi_vector),
            Embeddings: ("dense embeddings (the default)", lambda args: True)}


def _flags_it_ignores(kind_class: type, kinds: Kinds, args: argparse.Namespace) -> str | None:
    """A refusal naming the flags given (set away from their defaults) that only other output kinds declare: the
    job would ignore them. Read from the kinds' declarations, so a flag added to one kind is refused with the
    others without a check written for it."""
    own = {item.name for item in settings.declared(kind_class)}
    owners: dict[str, list[str]] = {}  # flag -> the kinds that take it
    for kind, (called, _) in kinds.items():
        for item in settings.declared(kind):
            if item.name not in own and getattr(args, item.name, item.default) != item.default:
                owners.setdefault(item.given_as(), []).append(called)
    if not owners:
        return None
    by_owners: dict[str, list[str]] = {}
    for flag, called in owners.items():
        by_owners.setdefault(" and ".join(called), []).append(flag)
    return "; ".join(common.applies_to(flags, f"{called}, not to {kinds[kind_class][0]}")
                     for called, flags in by_owners.items())


def run_job_command(args: argparse.Namespace, kind) -> int:
    """The job the parsed flags describe, with `kind` as its output; exit 0, 1 (the job stopped: a bad row under
    --on-error fail, or a refused shard) or 2 (bad arguments)."""
    from encoderrt.jobs import JobFailed, JobSettings
    from encoderrt.jobs.job import load_engine, open_inputs, run_job
    from encoderrt.jobs.placement import RayPlacement
    from encoderrt.jobs.progress import Progress

    console = common.console()
    on_ray = args.ray or args.ray_address
    default = RayPlacement()
    placed = [flag for flag, given in (("--ray-actors", args.ray_actors != default.actors),
                                       ("--ray-cpus-per-actor", args.ray_cpus_per_actor != default.cpus_per_actor))
              if given]
    if placed and not on_ray:  # a job here would ignore them
        return _refuse(common.applies_to(placed, "a job on Ray (--ray or --ray-address)"))
    try:
        job = settings.from_arguments(JobSettings, args)
        config = settings.from_arguments(EngineConfig, args)
        corpus = open_inputs(args.inputs, kind, job)  # a missing file is told before a compile, not after it
        progress = Progress(console)
        if on_ray:
            from encoderrt.jobs.on_ray import run_on_ray

            address = args.ray_address or os.environ.get("RAY_ADDRESS")
            placement = RayPlacement(args.ray_actors, args.ray_cpus_per_actor, address)
            common.offline_and_quiet()
            run_on_ray(corpus, args.output, kind, args.model, job, config, placement, progress)
            return 0
        common.offline_and_quiet()
        engine, artifact = load_engine(args.model, job, config)
        with engine:
            run_job(corpus, args.output, kind, engine, artifact, job, progress)
        return 0
    except JobFailed as exc:
        common.error(console, str(exc))
        return 1
    except ValueError as exc:
        common.error(console, str(exc))
        return 2
    except KeyboardInterrupt:
        console.print("[red]interrupted[/]: finished shards are kept; rerun the same command to resume")
        return 130


def _refuse(message: str) -> int:
    common.error(common.console(), message)
    return 2
