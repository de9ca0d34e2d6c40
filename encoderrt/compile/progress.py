"""compile's steps as a person follows them: on the terminal (stderr), as log lines (`serve`), or silent (--quiet)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console


class StepReporter:
    """`logger` turns the terminal spinner into log lines; `on_step` hears each step's name as it starts (serve shows
    it on /health, and stops a cancelled compile there by raising)."""

    def __init__(self, quiet: bool = False, console: Console | None = None, logger: logging.Logger | None = None,
                 on_step: Callable[[str], None] | None = None, prefix: str = ""):
        self.quiet = quiet
        self.console = console or Console(stderr=True, highlight=False)
        self.logger = logger
        self.on_step = on_step
        self.prefix = prefix
        self.timings: dict[str, float] = {}

    def note(self, message: str) -> None:
        if self.logger is not None:
            self.logger.info("%snote: %s", self.prefix, message)
        elif not self.quiet:
            self.console.print(f"[yellow]note:[/] {message}")

    @contextmanager
    def step(self, name: str, detail: str = "") -> Iterator[None]:
        if self.on_step is not None:
            self.on_step(name)
        start = time.perf_counter()
        if self.logger is not None:
            self.logger.info("%s%s: %s", self.prefix, name, detail)
        if self.quiet or self.logger is not None:
            yield
        else:
            with self.console.status(f"{name} {detail}".strip()):
                yield
        self.timings[name] = time.perf_counter() - start
        if self.logger is not None:
            self.logger.info("%s✓ %s %.1f s", self.prefix, name, self.timings[name])
        elif not self.quiet:
            self.console.print(f"[green]✓[/] {name:<9} {self.timings[name]:6.1f} s  {detail}")
