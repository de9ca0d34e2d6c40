"""What every command shares: an stderr console, quiet third-party libraries, and how a flag the command would
ignore is refused."""

from __future__ import annotations

import os

from rich.console import Console
from rich.markup import escape


def console() -> Console:
    return Console(stderr=True, highlight=False)


def error(console: Console, message: str) -> None:
    """One `error:` line; the message is text, not markup (rich would swallow `pip install 'encoderrt[ray]'`'s
    `[ray]`, or a bracket in a path)."""
    console.print("[red]error:[/] " + escape(message), soft_wrap=True)


def offline_and_quiet() -> None:
    """Weights come from folders, never from a hub; transformers' per-load progress bars give way to our steps."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        from transformers.utils import logging as transformers_logging
    except ImportError:
        return
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()


def applies_to(flags: list[str], to: str) -> str:
    """'--a applies to X', '--a, --b and --c apply to X': the refusal of flags the command would otherwise ignore."""
    listed = flags[0] if len(flags) == 1 else f"{', '.join(flags[:-1])} and {flags[-1]}"
    return f"{listed} {'applies' if len(flags) == 1 else 'apply'} to {to}"
