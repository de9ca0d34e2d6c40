"""The one interface every backend implements: `run(batch) -> Outputs`, and what it declares at load.

A `Batch` holds token rows and makes the layout a backend asks for, once: `padded()` (right-padded [rows, width]
feeds, exactly the graph's inputs) or `packed()` (the real tokens end to end with cu_seqlens, no padding at all).
It also says what the scheduler wants of this run: token states beside the pooled output, or the whole machine
for a batch that is the only work. A backend declares which of those it can do in `capabilities`, so the scheduler
never probes for methods. `run` must be safe to call from `parallel_runs` threads at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from encoderrt.runtime.errors import BackendUnavailable
from encoderrt.runtime.packing import pack_rows
from encoderrt.runtime.tokenizer import Tokens

__all__ = ["Backend", "BackendOptions", "BackendUnavailable", "Batch", "Capabilities", "Feeds", "Outputs"]

Feeds = dict[str, np.ndarray]
Padder = Callable[[Sequence[Tokens]], Feeds]


@dataclass(frozen=True)
class BackendOptions:
    intra_op_threads: int = 0
    """0 means one thread per core the process may use."""

    def resolved_threads(self) -> int:
        if self.intra_op_threads > 0:
            return self.intra_op_threads
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass(frozen=True)
class Capabilities:
    runs_alone: bool = False
    """A batch marked `alone` runs on every core, where the backend's parallel runs otherwise split the cores
    between them (OpenVINO's streams): the scheduler marks a batch so only when it is the only work."""
    token_states: bool = False
    """Returns each row's token states when a batch asks (artifacts compiled with the token_embeddings output)."""
    packed_input: bool = False
    """Runs `Batch.packed()`: its graph's attention takes packed sequences, so no work is spent on padding."""


class Batch:
    """One backend run over token rows; each layout is made on first use and kept."""

    __slots__ = ("rows", "token_states", "alone", "_pad", "_padded", "_packed")

    def __init__(self, rows: Sequence[Tokens], pad: Padder | None = None, *, padded: Feeds | None = None,
                 token_states: bool = False, alone: bool = False):
        """`pad` makes the padded feeds from the rows (the tokenizer's); `padded` gives them outright, for a graph
        that is not a token model (the bench's GEMM ceiling)."""
        self.rows = rows
        self.token_states = token_states
        """Return each row's token states ([rows, width, hidden]) beside the pooled output."""
        self.alone = alone
        """It is the only work: run it on every core (backends whose capabilities say runs_alone)."""
        self._pad = pad
        self._padded = padded
        self._packed: Feeds | None = None

    @property
    def width(self) -> int:
        return max((len(row.ids) for row in self.rows), default=0)

    @property
    def real_tokens(self) -> int:
        return sum(len(row.ids) for row in self.rows)

    @property
    def padded_tokens(self) -> int:
        return len(self.rows) * self.width

    def padded(self) -> Feeds:
        if self._padded is None:
            assert self._pad is not None, "a batch built from feeds has no rows to pad"
            self._padded = self._pad(self.rows)
        return self._padded

    def packed(self) -> Feeds:
        """input_ids and token_type_ids [tokens] and cu_seqlens [rows + 1] int32, straight from the rows."""
        if self._packed is None:
            self._packed = pack_rows(self.rows)
        return self._packed

    def ready(self, capabilities: Capabilities) -> "Batch":
        """Make the layout a backend with these capabilities runs, now (before a timing starts, say)."""
        self.packed() if capabilities.packed_input else self.padded()
        return self

    def split(self, rows: int) -> list["Batch"]:
        """Consecutive batches of at most `rows` rows (for an engine built for fewer rows than the budget allows)."""
        if len(self.rows) <= rows:
            return [self]
        return [Batch(self.rows[start:start + rows], self._pad, token_states=self.token_states, alone=self.alone)
                for start in range(0, len(self.rows), rows)]


@dataclass(frozen=True)
class Outputs:
    pooled: np.ndarray
    """The graph's first output, one row per batch row ([rows, dim])."""
    token_states: np.ndarray | None = None
    """[rows, width, hidden], where the batch asked for them."""


class Backend(Protocol):
    input_names: tuple[str, ...]
    max_batch_tokens: int | None
    """The largest padded batch (rows x width) it can run, where an engine was built for one; None: no limit."""
    parallel_runs: int
    """How many `run` calls it serves at once (OpenVINO's streams); the scheduler keeps that many batches in flight."""
    execution: str
    """What really runs, for EngineInfo and reports: runtime and precision, and any fallback the hardware forced."""
    capabilities: Capabilities

    def run(self, batch: Batch) -> Outputs:
        """Run one batch in the layout the backend takes."""
        ...
