"""Command line: `encoderrt compile|serve|embed|score|classify|bench|cache` and the `compile-model` shortcut; one
module per command, each with HELP, add_arguments(parser) and run(args) -> exit code."""

from __future__ import annotations

import argparse
import sys

from encoderrt.cli import bench, cache, classify, compile, embed, score, serve

COMMANDS = {"compile": compile, "serve": serve, "embed": embed, "score": score, "classify": classify, "bench": bench,
            "cache": cache}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="encoderrt", description="Compile and serve encoder models.")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        sub = commands.add_parser(name, help=command.HELP)
        command.add_arguments(sub)
        sub.set_defaults(handler=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


def compile_model_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="compile-model", description="Compile a model folder into an encoderrt artifact.")
    compile.add_arguments(parser)
    return compile.run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
