"""At load: check the manifest against its graph, and pick the token budget (the best throughput whose batch
latency stays under a cap).

CPU GEMM throughput plateaus once a batch holds a few hundred tokens, while latency keeps
growing with the batch; a short measurement on this machine finds the knee instead of a guess.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from encoderrt.runtime.backends import Backend
from encoderrt.runtime.manifest import ManifestError
from encoderrt.runtime.scheduler import Padder
from encoderrt.runtime.tokenizer import Tokens

CANDIDATE_BUDGETS = (256, 512, 1024, 2048, 4096, 8192, 16384)
ROW_LENGTH = 128
"""Calibration rows: a typical passage length, capped by the model's limit."""
WORTH_IT = 1.05
"""A bigger budget must raise throughput by 5% to be worth its latency."""


@dataclass(frozen=True)
class Calibration:
    max_batch_tokens: int
    measurements: tuple[tuple[int, float, float], ...]
    """(budget, tokens per second, batch latency in ms) for each budget tried."""
    tokens_per_second: float
    """At the chosen budget (or the nearest tried): how fast a deep queue drains."""


def calibrate(backend: Backend, pad: Padder, max_length: int, vocab_size: int, latency_cap_ms: float) -> Calibration:
    """Budgets past the backend's own limit (an engine's profiles) are not tried."""
    limit = backend.max_batch_tokens
    candidates = [b for b in CANDIDATE_BUDGETS if limit is None or b <= limit] or [limit]
    measurements: list[tuple[int, float, float]] = []
    for budget in candidates:
        if budget < max_length and measurements:
            continue
        measurements.append(_measure(backend, pad, budget, max_length, vocab_size))
        if measurements[-1][2] > latency_cap_ms:
            break
    within_cap = [m for m in measurements if m[2] <= latency_cap_ms] or measurements[:1]
    chosen = within_cap[0]
    for candidate in within_cap[1:]:
        if candidate[1] >= chosen[1] * WORTH_IT:
            chosen = candidate
    budget = max(chosen[0], max_length)
    return Calibration(budget if limit is None else min(budget, limit), tuple(measurements), chosen[1])


def measure_budget(backend: Backend, pad: Padder, budget: int, max_length: int, vocab_size: int) -> Calibration:
    """A budget the user chose, measured the same way, so admission knows how fast a full queue drains."""
    measurement = _measure(backend, pad, budget, max_length, vocab_size)
    return Calibration(budget, (measurement,), measurement[1])


def _measure(backend: Backend, pad: Padder, budget: int, max_length: int, vocab_size: int) -> tuple[int, float, float]:
    """(budget, tokens per second, batch latency in ms) of a batch of passage-length rows filling `budget`."""
    length = min(ROW_LENGTH, max_length)
    rng = np.random.default_rng(0)
    low = min(100, vocab_size // 2)  # past a vocabulary's special tokens, and inside even a tiny one
    ids = [1] + rng.integers(low, vocab_size, size=length - 2).tolist() + [2]
    rows = max(1, budget // length)
    feeds = pad([Tokens(ids, [0] * length)] * rows)
    backend.run(feeds)  # warm-up: first run of a shape allocates
    latency = min(_timed(backend, feeds) for _ in range(2))
    return budget, rows * length / latency, latency * 1000


def check_graph(backend: Backend, pad: Padder, max_length: int, output_dim: int, vocab_size: int) -> None:
    """The manifest's facts against its graph, with one row of the longest input: a manifest that claims more
    positions than the graph's table, or another output width, is refused at load rather than failing requests."""
    ids = [1] + [min(100, vocab_size - 1)] * (max_length - 2) + [2]
    try:
        outputs = backend.run(pad([Tokens(ids, [0] * max_length)]))
    except Exception as exc:  # noqa: BLE001 - whatever the backend says, the artifact is inconsistent
        raise ManifestError(f"the graph cannot run the manifest's max_length of {max_length} tokens "
                            f"({type(exc).__name__}): the manifest does not match its graph") from None
    if outputs.shape[-1] != output_dim:
        raise ManifestError(f"the graph's output has width {outputs.shape[-1]}, the manifest says {output_dim}: "
                            "the manifest does not match its graph")


def _timed(backend: Backend, feeds: dict[str, np.ndarray]) -> float:
    start = time.perf_counter()
    backend.run(feeds)
    return time.perf_counter() - start
