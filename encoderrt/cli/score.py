"""`encoderrt score`: (query, document) rows from files -> scores in Parquet shards, as `encoderrt embed` runs."""

from __future__ import annotations

import argparse

from encoderrt.cli.embed import add_job_arguments, run_job_command
from encoderrt.runtime import settings

HELP = "score (query, document) rows from files into Parquet shards (resumable; --ray for Ray Data)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from encoderrt.jobs.outputs import PairScores

    add_job_arguments(parser, ("query_field", "document_field"))
    settings.add_arguments(parser.add_argument_group("scores"), PairScores)


def run(args: argparse.Namespace) -> int:
    from encoderrt.jobs.outputs import PairScores

    return run_job_command(args, settings.from_arguments(PairScores, args))
