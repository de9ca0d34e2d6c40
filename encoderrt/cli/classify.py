"""`encoderrt classify`: texts from files -> each one's label and label scores in Parquet shards, as `encoderrt
embed` runs."""

from __future__ import annotations

import argparse

from encoderrt.cli.embed import add_job_arguments, run_job_command
from encoderrt.runtime import settings

HELP = "classify texts from files into Parquet shards: label and per-label scores (resumable; --ray for Ray Data)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from encoderrt.jobs.outputs import Labels

    add_job_arguments(parser, ("text_field",))
    settings.add_arguments(parser.add_argument_group("labels"), Labels)


def run(args: argparse.Namespace) -> int:
    from encoderrt.jobs.outputs import Labels

    return run_job_command(args, settings.from_arguments(Labels, args))
