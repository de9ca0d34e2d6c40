"""Step-by-step progress on the terminal (stderr), silent with --quiet."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console


class StepReporter:
    def __init__(self, quiet: bool = False, console: Console | None = None):
        self.quiet = quiet
        self.console = console or Console(stderr=True, highlight=False)
        self.timings: dict[str, float] = {}

    def note(self, message: str) -> None:
        if not self.quiet:
            self.console.print(f"[yellow]note:[/] {message}")

    @contextmanager
    def step(self, name: str, detail: str = "") -> Iterator[None]:
        start = time.perf_counter()
        if self.quiet:
            yield
        else:
            with self.console.status(f"{name} {detail}".strip()):
                yield
        self.timings[name] = time.perf_counter() - start
        if not self.quiet:
            self.console.print(f"[green]✓[/] {name:<9} {self.timings[name]:6.1f} s  {detail}")
