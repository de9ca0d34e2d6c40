"""What every command shares: an stderr console and quiet third-party libraries."""

from __future__ import annotations

import os

from rich.console import Console


def console() -> Console:
    return Console(stderr=True, highlight=False)


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
