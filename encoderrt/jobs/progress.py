"""Progress for people: a bar with rows, tokens/s and the time left on a terminal, one line per shard elsewhere (a
log, CI), and the job's summary at the end."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from encoderrt.jobs.shards import ShardRecord


@dataclass(frozen=True)
class Summary:
    """A job's figures: this run's seconds and tokens/s, the whole output's row counts."""

    rows: int
    written: int
    rejected: int
    tokens: int
    """Tokens this run computed (a resumed run counts only its own shards)."""
    seconds: float
    padding_efficiency: float | None
    """Real tokens over padded tokens in the engine's batches this run (None: the engines ran elsewhere)."""
    output: Path
    rejected_files: tuple[Path, ...] = ()

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @classmethod
    def of(cls, shards: Iterable[ShardRecord], seconds: float, output: Path, tokens: int,
           padding_efficiency: float | None) -> "Summary":
        shards = sorted(shards, key=lambda r: r.index)
        rejected = tuple(output / name for r in shards for name in r.files if name.endswith(".rejected.jsonl"))
        return cls(sum(r.rows for r in shards), sum(r.written for r in shards), sum(r.rejected for r in shards),
                   tokens, seconds, padding_efficiency, output, rejected)

    def line(self) -> str:
        text = (f"{self.rows:,} rows ({self.written:,} written, {self.rejected:,} rejected) in {self.seconds:.1f} s: "
                f"{self.tokens:,} tokens, {self.tokens_per_second:,.0f} tokens/s")
        if self.padding_efficiency is not None:
            text += f", padding efficiency {self.padding_efficiency:.0%}"
        text += f"; output in {self.output}"
        if self.rejected_files:
            text += f"; rejected rows listed in {len(self.rejected_files)} .rejected.jsonl file(s)"
        return text


class Progress:
    def __init__(self, console: Console | None = None, enabled: bool = True):
        self.console = console or Console(stderr=True, highlight=False)
        self.enabled = enabled
        self._bar = None
        self._task = None
        self._tokens, self._started, self._total = 0, time.perf_counter(), 0

    def start(self, total_rows: int, done_rows: int) -> None:
        self._total, self._started = total_rows, time.perf_counter()
        if not self.enabled:
            return
        if done_rows:
            self.console.print(f"resuming: {done_rows:,} of {total_rows:,} rows already written")
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(TextColumn("rows"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), console=self.console,
                            transient=True)
            self._task = self._bar.add_task("rows", total=total_rows, completed=done_rows, rate="")
            self._bar.start()

    def shard(self, record: ShardRecord) -> None:
        self._tokens += record.tokens
        rate = self._tokens / max(time.perf_counter() - self._started, 1e-9)
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, advance=record.rows, rate=f"{rate:,.0f} tokens/s")
            return
        rejected = f", {record.rejected} rejected" if record.rejected else ""
        self.console.print(f"shard {record.index}: rows {record.start.row:,}-{record.end.row - 1:,} of "
                           f"{self._total:,} ({record.written:,} written{rejected}) in {record.seconds:.1f} s; "
                           f"{rate:,.0f} tokens/s", soft_wrap=True)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def finish(self, summary: Summary) -> None:
        self.stop()
        if self.enabled:
            self.console.print(summary.line(), soft_wrap=True)
