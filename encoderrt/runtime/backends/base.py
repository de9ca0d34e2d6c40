"""The one interface every backend implements: `run(batch) -> Outputs`, and what it declares at load.

A `Batch` holds token rows and makes the layout a backend asks for, once: `padded()` (right-padded [rows, width]
feeds, exactly the graph's inputs) or `packed()` (the real tokens end to end with cu_seqlens, no padding at all).
It also says what the scheduler wants of this run: which of the graph's outputs, by name (the first, every row's
pooled vector or logits, unless it names others: token states, a multi-vector model's vectors, bge-m3's lexical
weights), and whether it may take the whole machine, being the only work. A backend declares which of those it can do in `capabilities`, so the scheduler
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

__all__ = ["Backend", "BackendOptions", "BackendUnavailable", "Batch", "Capabilities", "Feeds", "Outputs", "first_output"]

Feeds = dict[str, np.ndarray]
Padder = Callable[[Sequence[Tokens]], Feeds]


@dataclass(frozen=True)
class BackendOptions:
    intra_op_threads: int = 0
    """0 means one thread per core the process may use."""
    lone_runs: bool = True
    """Also build the every-core session that runs a batch alone (Capabilities.runs_alone): a second copy of the
    prepared weights, which runs that never leave the streams do without (STREAMS_ONLY)."""

    def resolved_threads(self) -> int:
        if self.intra_op_threads > 0:
            return self.intra_op_threads
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


STREAMS_ONLY = BackendOptions(lone_runs=False)
"""For runs that never put a batch alone on every core: compile's parity check and measurement of its candidates,
the bench's backend alone. Without the every-core copy of the weights, the default compile of Qwen3-Embedding-0.6B's
configuration peaked at 11.4 GB against 18.6, and the bench's backend alone held its bf16 artifact in 3.02 GiB
against 4.08."""


@dataclass(frozen=True)
class Capabilities:
    runs_alone: bool = False
    """A batch marked `alone` runs on every core, where the backend's parallel runs otherwise split the cores
    between them (OpenVINO's streams): the scheduler marks a batch so only when it is the only work."""
    packed_input: bool = False
    """Runs `Batch.packed()`: its graph's attention takes packed sequences, so no work is spent on padding."""
    width_multiple: int = 1
    """Pads a batch's width up to a multiple of this (OpenVINO's WIDTH_BUCKET): the scheduler counts rows at that
    width when it cuts batches (runtime/waiting.py)."""
    empty_rows: bool = False
    """Answers a text with no tokens (a row of one token that nothing attends to): a static embedding table's mean
    of nothing, zeros, as sentence-transformers' StaticEmbedding gives. Elsewhere such a row is refused by name."""


def padded_width(length: int, multiple: int) -> int:
    """`length` up to a multiple of `multiple`: the width a backend with that `Capabilities.width_multiple` runs."""
    return -(-length // multiple) * multiple


class Batch:
    """One backend run over token rows; each layout is made on first use and kept."""

    __slots__ = ("rows", "outputs", "alone", "_pad", "_padded", "_packed")

    def __init__(self, rows: Sequence[Tokens], pad: Padder | None = None, *, padded: Feeds | None = None,
                 outputs: tuple[str, ...] = (), alone: bool = False):
        """`pad` makes the padded feeds from the rows (the tokenizer's); `padded` gives them outright, for a graph
        that is not a token model (the bench's GEMM ceiling)."""
        self.rows = rows
        self.outputs = outputs
        """The graph outputs to return, by name; (): the first alone."""
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

    def wanted(self, output_names: tuple[str, ...]) -> tuple[str, ...]:
        """The outputs to return from a graph with these outputs; one it lacks is a ValueError."""
        missing = [name for name in self.outputs if name not in output_names]
        if missing:
            raise ValueError(f"the graph has no output {', '.join(missing)} (it has {', '.join(output_names)})")
        return self.outputs or output_names[:1]

    def ready(self, capabilities: Capabilities) -> "Batch":
        """Make the layout a backend with these capabilities runs, now (before a timing starts, say)."""
        self.packed() if capabilities.packed_input else self.padded()
        return self

    def split(self, rows: int) -> list["Batch"]:
        """Consecutive batches of at most `rows` rows (for an engine built for fewer rows than the budget allows)."""
        if len(self.rows) <= rows:
            return [self]
        return [Batch(self.rows[start:start + rows], self._pad, outputs=self.outputs, alone=self.alone)
                for start in range(0, len(self.rows), rows)]


Outputs = dict[str, np.ndarray]
"""The outputs a batch asked for, by name, each with one entry per row ([rows, ...]; per-token outputs
[rows, width, ...] with the padding's positions in)."""


def first_output(backend: "Backend", batch: Batch) -> np.ndarray:
    """Run a batch for its first output alone: every row's result (the pooled vector, the logits)."""
    return backend.run(batch)[backend.output_names[0]]


class Backend(Protocol):
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    """The outputs it can return; the first is every row's result (pooled vector, logits, token vectors)."""
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
