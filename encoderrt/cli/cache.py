"""`encoderrt cache list|clear`: what compile-on-first-use has stored, and reclaiming it."""

from __future__ import annotations

import argparse

from encoderrt.cli import common

HELP = "list or clear the compile cache (~/.cache/encoderrt, or $ENCODERRT_CACHE)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="one line per cached artifact: key, model, how it was built, size")
    clear = actions.add_parser("clear", help="remove cached artifacts (all, or those named)")
    clear.add_argument("entries", nargs="*", metavar="KEY_OR_MODEL", help="cache keys or model names (default: all)")


def run(args: argparse.Namespace) -> int:
    from encoderrt.compile import cache

    console = common.console()
    entries = cache.list_entries()
    if args.action == "list":
        print(f"cache {cache.cache_root()}: {len(entries)} artifacts, {_mb(sum(e.size for e in entries))}")
        for entry in entries:
            print(f"{entry.key:<18} {entry.model:<28} {entry.built:<28} {_mb(entry.size):>9}")
        return 0
    chosen = [e for e in entries if not args.entries or e.key in args.entries or e.model in args.entries]
    unknown = sorted(set(args.entries) - {e.key for e in chosen} - {e.model for e in chosen})
    if unknown:
        common.error(console, f"not in the cache: {', '.join(unknown)} (see `encoderrt cache list`)")
        return 2
    reclaimed = cache.clear(chosen, stale_partials=not args.entries)
    print(f"removed {len(chosen)} artifacts, {_mb(reclaimed)} reclaimed")
    return 0


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"
