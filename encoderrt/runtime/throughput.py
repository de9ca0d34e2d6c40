"""A backend's raw speed on given batches, with as many batches in flight as it runs at once, and on a lone query.

No tokenising, queueing or Futures: what the backend alone can do. Compile's choice of target and
precision compares candidates with it, and the bench divides the engine's served throughput by it
(engine efficiency).
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Sequence

from encoderrt.runtime.backends import Backend
from encoderrt.runtime.backends.base import Batch, Padder, padded_width
from encoderrt.runtime.tokenizer import Tokens


def token_batches(rows: Sequence[Tokens], pad: Padder, budget: int, width_multiple: int = 1) -> list[Batch]:
    """The rows in their order cut into consecutive batches of at most `budget` padded tokens, a batch's width
    counted up to a multiple of `width_multiple` (a row longer than the budget alone)."""
    batches, start, widest = [], 0, 0
    for end, row in enumerate(rows):
        width = padded_width(len(row.ids), width_multiple)
        widest = max(widest, width)
        if end > start and (end + 1 - start) * widest > budget:
            batches.append(Batch(rows[start:end], pad))
            start, widest = end, width
    return batches + [Batch(rows[start:], pad)] if rows else []


def length_sorted_batches(rows: Sequence[Tokens], pad: Padder, budget: int, width_multiple: int = 1) -> list[Batch]:
    """The rows sorted by length and cut into batches of at most `budget` padded tokens, as the scheduler
    forms them from a deep queue (each batch made ready in its backend's layout before any timing)."""
    return token_batches(sorted(rows, key=lambda r: len(r.ids)), pad, budget, width_multiple)


def real_tokens(batches: Sequence[Batch]) -> int:
    return sum(batch.real_tokens for batch in batches)


def pass_seconds(backend: Backend, batches: Sequence[Batch]) -> float:
    """Wall time of one pass over `batches`, `backend.parallel_runs` of them running at a time."""
    for batch in batches:  # the layout is made outside the timing, as the scheduler's threads make it outside a run
        batch.ready(backend.capabilities)
    order = itertools.count()  # next() on a count is atomic: each batch is taken once
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            while not errors and (index := next(order)) < len(batches):
                backend.run(batches[index])
        except Exception as exc:  # noqa: BLE001 - re-raised in the caller's thread below
            errors.append(exc)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, backend.parallel_runs) - 1)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    worker()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - start


def tokens_per_second(backend: Backend, batches: Sequence[Batch], rounds: int = 3) -> float:
    """Best of `rounds` passes after one warm-up pass (the first run of each shape allocates)."""
    pass_seconds(backend, batches)
    return real_tokens(batches) / min(pass_seconds(backend, batches) for _ in range(rounds))


def lone_seconds(backends: Sequence[Backend], rows: Sequence[Tokens], pad: Padder, rounds: int = 5) -> list[float]:
    """Each backend's median wall time of one row run as a lone query runs: a batch of its own, on every core where
    the backend runs batches alone (the scheduler marks an idle engine's only batch so). Each row runs once on each
    before the timing (the first run of a shape prepares it), then `rounds` times, the backends in turn in each round
    so that the machine's drift hits them alike."""
    batches = [[Batch([row], pad, alone=True).ready(backend.capabilities) for row in rows] for backend in backends]
    for backend, own in zip(backends, batches):
        for batch in own:
            backend.run(batch)
    seconds: list[list[float]] = [[] for _ in backends]
    for _ in range(rounds):
        for backend, own, times in zip(backends, batches, seconds):
            for batch in own:
                start = time.perf_counter()
                backend.run(batch)
                times.append(time.perf_counter() - start)
    return [statistics.median(times) for times in seconds]
