"""At load: check the manifest against its graph, and pick the token budget (the best throughput whose batch
latency stays under a cap).

CPU GEMM throughput plateaus once a batch holds a few hundred tokens, while latency keeps
growing with the batch; a short measurement on this machine finds the knee instead of a guess.
Every budget is timed with all the backend's streams busy, as the scheduler runs them, in rounds that
alternate budgets: two runs of one stream per budget read noise as a knee, and the choice flipped
between 256, 512 and 1,024 tokens from one load to the next on the same machine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import numpy as np

from encoderrt.runtime.backends import Backend
from encoderrt.runtime.backends.base import Batch, Padder, first_output
from encoderrt.runtime.manifest import ManifestError
from encoderrt.runtime.throughput import pass_seconds
from encoderrt.runtime.tokenizer import Tokens

CANDIDATE_BUDGETS = (256, 512, 1024, 2048, 4096, 8192, 16384)
ROW_LENGTH = 128
"""Calibration rows: a typical passage length, capped by the model's limit."""
NEAR_BEST = 0.90
"""The smallest budget within 10% of the best throughput on these equal-length rows wins: served rows differ in
length, and a bigger batch spans more of them (padding efficiency 0.97, 0.92 and 0.85 at 256, 512 and 1,024
tokens serving passages to 8 clients, all-MiniLM-L6-v2 on OpenVINO int8), besides taking longer."""
NEAR_BEST_FOR_THROUGHPUT = 0.97
"""Calibrating for throughput (bulk jobs), the largest budget within 3% of the best wins: every batch pays the
engine's fixed cost (feeds, dispatch, delivering its rows) once, and a job's queue is deep and sorted, so a bigger
batch spans no wider a range of lengths. all-MiniLM-L6-v2 bf16, AMX, 20,000 passages: the backend alone drained
39.7k tokens/s at both 512 and 2,048 tokens, a job 0.89x of that at 512 and 0.94x at 2,048."""
ROUNDS = 3
"""Alternating rounds per budget; each budget's figure is their median."""
PLATEAU_GAIN = 1.10
PLATEAU_STEPS = 2
"""Bigger budgets stop being tried once two doublings in a row stay within 10% of the throughput the last real gain
reached: past that knee a batch only adds latency. A curve still climbing 8% a doubling is followed to its end."""
CONTENDER = 0.80
"""Only budgets within 80% of the first round's best are timed again: one further from it cannot come within
NEAR_BEST of the best on a second look. With the knee, all-MiniLM-L6-v2 loads in 1.3 s instead of 1.8 (onnxruntime
fp32, one AVX-512 EPYC core) and the families' tiny models in 0.3-0.4 s instead of 0.8, with the same budgets."""
ROUND_SECONDS = 0.03
"""Each budget runs whole passes (one batch per stream) for at least this long in each round."""


@dataclass(frozen=True)
class Calibration:
    max_batch_tokens: int
    measurements: tuple[tuple[int, float, float], ...]
    """(budget, tokens per second, batch latency in ms) for each budget tried."""
    tokens_per_second: float
    """At the chosen budget (or the nearest tried): how fast a deep queue drains."""


def calibrate(backend: Backend, pad: Padder, max_length: int, vocab_size: int, latency_cap_ms: float,
              goal: Literal["latency", "throughput"] = "latency") -> Calibration:
    """Budgets past the backend's own limit (an engine's profiles) are not tried. `goal`: the smallest budget near
    the best throughput (NEAR_BEST), or the largest (NEAR_BEST_FOR_THROUGHPUT)."""
    limit = backend.max_batch_tokens
    candidates = [b for b in CANDIDATE_BUDGETS if limit is None or b <= limit] or [limit]
    batches: dict[int, list[Batch]] = {}
    timed: dict[int, list[tuple[float, float]]] = {}
    gained, flat = 0.0, 0
    for budget in candidates:  # the first round finds the budgets under the latency cap, up to the knee
        if budget < max_length and timed:
            continue
        batches[budget] = _batches(backend, pad, budget, max_length, vocab_size)
        timed[budget] = [_measure(backend, batches[budget], warm=True)]
        tokens_per_second, latency_ms = timed[budget][0]
        gained, flat = (tokens_per_second, 0) if tokens_per_second >= gained * PLATEAU_GAIN else (gained, flat + 1)
        if latency_ms > latency_cap_ms or flat == PLATEAU_STEPS:
            break
    under_cap = {b: runs[0][0] for b, runs in timed.items() if runs[0][1] <= latency_cap_ms}
    again = [b for b, t in under_cap.items() if t >= CONTENDER * max(under_cap.values())] if under_cap else list(timed)[:1]
    for _ in range(ROUNDS - 1):
        for budget in again:
            timed[budget].append(_measure(backend, batches[budget], warm=False))
    measurements = [_summary(budget, runs) for budget, runs in timed.items()]
    within_cap = [m for m in measurements if m[2] <= latency_cap_ms] or measurements[:1]
    best = max(tokens_per_second for _, tokens_per_second, _ in within_cap)
    if goal == "throughput":
        chosen = [m for m in within_cap if m[1] >= best * NEAR_BEST_FOR_THROUGHPUT][-1]
    else:
        chosen = next(m for m in within_cap if m[1] >= best * NEAR_BEST)
    budget = max(chosen[0], max_length)
    return Calibration(budget if limit is None else min(budget, limit), tuple(measurements), chosen[1])


def measure_budget(backend: Backend, pad: Padder, budget: int, max_length: int, vocab_size: int) -> Calibration:
    """A budget the user chose, measured the same way, so admission knows how fast a full queue drains."""
    batches = _batches(backend, pad, budget, max_length, vocab_size)
    measurement = _summary(budget, [_measure(backend, batches, warm=i == 0) for i in range(ROUNDS)])
    return Calibration(budget, (measurement,), measurement[1])


def _batches(backend: Backend, pad: Padder, budget: int, max_length: int, vocab_size: int) -> list[Batch]:
    """One batch per stream of passage-length rows filling `budget`."""
    length = min(ROW_LENGTH, max_length)
    row = _probe_row(length, vocab_size)
    return [Batch([row] * max(1, budget // length), pad)] * max(1, backend.parallel_runs)


def _probe_row(length: int, vocab_size: int) -> Tokens:
    """A row of `length` tokens between two specials, its ids past a vocabulary's special tokens (and inside even a
    tiny one): the same row on every load."""
    low = min(100, vocab_size // 2)
    ids = [1] + np.random.default_rng(0).integers(low, vocab_size, size=length - 2).tolist() + [2]
    return Tokens(ids, [0] * length)


def _measure(backend: Backend, batches: list[Batch], warm: bool) -> tuple[float, float]:
    """(tokens per second, batch latency in ms) of whole passes over `batches` for ROUND_SECONDS; `warm`: one pass
    first (the first run of a shape allocates)."""
    if warm:
        pass_seconds(backend, batches)
    passes, elapsed, fastest = 0, 0.0, float("inf")
    while passes == 0 or elapsed < ROUND_SECONDS:
        seconds = pass_seconds(backend, batches)
        passes, elapsed, fastest = passes + 1, elapsed + seconds, min(fastest, seconds)
    tokens = sum(batch.real_tokens for batch in batches)  # rows of one length: no padding
    return passes * tokens / elapsed, fastest * 1000


def _summary(budget: int, runs: list[tuple[float, float]]) -> tuple[int, float, float]:
    """(budget, tokens per second, batch latency in ms): the medians over rounds."""
    return budget, float(np.median([t for t, _ in runs])), float(np.median([ms for _, ms in runs]))


SMALL_WORK_ROWS = (1, 4, 16)
"""Small work as timed at load: batches of this many 16-token queries, each alone and on one stream."""
QUERY_TOKENS = 16
LONE_SPEEDUP_WORTH = 1.5
"""Small work runs alone whatever else arrives (the scheduler's SMALL_WORK_TOKENS) only at the sizes where every core
runs it at least this much faster than one stream does; elsewhere a lone run under load leaves a core's worth of
capacity unused, and the scheduler's SMALL_ALONE_WHILE_COMPANY_BELOW applies (its figures). bf16 all-MiniLM-L6-v2
on OpenVINO, 2-core Sapphire Rapids: a lone run was 1.37-1.49x one stream at 1-16 queries of 16 tokens; onnxruntime
fp32 on the same machine 1.71-1.82x, and on a 2-core AVX2 EPYC such batches ran better alone at 4-16 clients."""
SPEEDUP_RUNS = 5


def small_work_alone_from(backend: Backend, pad: Padder, vocab_size: int) -> int | None:
    """The fewest padded tokens of a small batch that runs alone under load (LONE_SPEEDUP_WORTH), among the
    SMALL_WORK_ROWS sizes (0 if from the smallest); None: at none of them. Only for a backend that runs batches
    alone."""
    if not backend.capabilities.runs_alone:
        return None
    query = _probe_row(QUERY_TOKENS, vocab_size)
    for probe, rows in enumerate(SMALL_WORK_ROWS):
        batches = {alone: Batch([query] * rows, pad, alone=alone) for alone in (True, False)}
        seconds: dict[bool, list[float]] = {True: [], False: []}
        for batch in batches.values():
            batch.ready(backend.capabilities)
            backend.run(batch)  # the first run of a shape prepares it
        for _ in range(SPEEDUP_RUNS):  # alternating, so that a slow moment weighs on both
            for alone, batch in batches.items():
                start = time.perf_counter()
                backend.run(batch)
                seconds[alone].append(time.perf_counter() - start)
        if np.median(seconds[False]) >= LONE_SPEEDUP_WORTH * np.median(seconds[True]):
            return rows * QUERY_TOKENS if probe else 0  # below the smallest size timed, as at it
    return None


def check_graph(backend: Backend, pad: Padder, max_length: int, output_dim: int, vocab_size: int) -> None:
    """The manifest's facts against its graph, with one row of the longest input: a manifest that claims more
    positions than the graph's table, or another output width, is refused at load rather than failing requests."""
    ids = [1] + [min(100, vocab_size - 1)] * (max_length - 2) + [2]
    try:
        outputs = first_output(backend, Batch([Tokens(ids, [0] * max_length)], pad))
    except Exception as exc:  # noqa: BLE001 - whatever the backend says, the artifact is inconsistent
        raise ManifestError(f"the graph cannot run the manifest's max_length of {max_length} tokens "
                            f"({type(exc).__name__}): the manifest does not match its graph") from None
    if outputs.shape[-1] != output_dim:
        raise ManifestError(f"the graph's output has width {outputs.shape[-1]}, the manifest says {output_dim}: "
                            "the manifest does not match its graph")
