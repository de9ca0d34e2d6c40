"""The one interface every backend implements: padded numpy feeds in, the graph's output array out.

`run` (and `run_with_tokens`) must be safe to call from `parallel_runs` threads at once. A backend whose
parallel runs split the cores between them may also have `run_alone(feeds)`, which runs one batch on every
core: the scheduler calls it for a batch that is the only work, and starts nothing else until it returns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from encoderrt.runtime.errors import BackendUnavailable

__all__ = ["Backend", "BackendOptions", "BackendUnavailable"]


@dataclass(frozen=True)
class BackendOptions:
    intra_op_threads: int = 0
    """0 means one thread per core the process may use."""

    def resolved_threads(self) -> int:
        if self.intra_op_threads > 0:
            return self.intra_op_threads
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class Backend(Protocol):
    input_names: tuple[str, ...]
    max_batch_tokens: int | None
    """The largest padded batch (rows x width) it can run, where an engine was built for one; None: no limit."""
    parallel_runs: int
    """How many `run` calls it serves at once (OpenVINO's streams); the scheduler keeps that many batches in flight."""
    execution: str
    """What really runs, for EngineInfo and reports: runtime and precision, and any fallback the hardware forced."""

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Run one padded batch; returns the graph's first output ([rows, dim])."""
        ...

    def run_with_tokens(self, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The first output and the token states ([rows, width, hidden]); called only for artifacts whose manifest
        lists the token_embeddings output, so a backend that never serves one need not define it."""
        ...
