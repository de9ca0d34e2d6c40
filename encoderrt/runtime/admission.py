"""Admission: new work is refused at once (Overloaded, saying when to retry) while the queue already holds more
than `max_queue_seconds` of work, so latency stays bounded under overload and is back to normal within that time
once the load ends. An item count alone cannot do this: 8,192 short queries are a second of work, 8,192 long
passages half a minute.

Queue wait = queued tokens / drain rate. The rate starts at the load-time measurement of the backend alone, then
follows what the queue really drains: tokens of full batches over the wall time between batch completions while the
workers are busy (Python's share of the cores, tokenising and replying included, which a backend-only figure misses
by half on two cores). Only full batches count: a deep queue runs full batches, and a lone short query (mostly
fixed cost) says nothing about how fast a queue drains.
"""

from __future__ import annotations

import math
import threading

from encoderrt.runtime.errors import Overloaded

FULL_BATCH = 0.5
"""A batch of at least this share of the token budget measures the draining rate."""
SMOOTHING = 0.2


class Admission:
    def __init__(self, max_items: int, max_seconds: float, budget: int, tokens_per_second: float | None):
        self.max_items = max_items
        self.max_seconds = max_seconds
        self._budget = budget
        self._rate = tokens_per_second
        """Real tokens per second, every worker together; None until calibrated or measured."""
        self._tokens: float | None = None
        self._gap = 0.0
        self._last_finish: float | None = None
        self._last_busy = False
        self._lock = threading.Lock()

    def wait_seconds(self, queued_tokens: int) -> float | None:
        """How long the queue takes to drain at the measured rate; None before any measurement."""
        rate = self._rate
        return None if not rate else queued_tokens / rate

    def check(self, queued_items: int, queued_tokens: int, new_items: int) -> None:
        """Raise Overloaded if this work should not join the queue; a queue of one request's work always admits."""
        wait = self.wait_seconds(queued_tokens)
        if queued_items + new_items > self.max_items:
            raise Overloaded(f"the engine's queue is full ({queued_items} items waiting); retry later",
                             retry_after_s=self._retry_after(wait))
        if wait is not None and wait > self.max_seconds:
            raise Overloaded(f"the engine's queue holds {wait:.1f} s of work, above its limit of {self.max_seconds:g} s "
                             "(--max-queue-seconds); retry later", retry_after_s=self._retry_after(wait))

    def observe(self, real_tokens: int, padded_tokens: int, finished_at: float, more_queued: bool) -> None:
        """One batch done at `finished_at` (perf_counter); `more_queued`: rows were still waiting then."""
        with self._lock:
            gap = finished_at - self._last_finish if self._last_finish is not None else 0.0
            busy_since_last, self._last_finish, self._last_busy = self._last_busy, finished_at, more_queued
            # only a gap the workers spent busy (work was waiting at its start) is a drain interval
            if not busy_since_last or gap <= 0 or padded_tokens < FULL_BATCH * self._budget:
                return
            if self._tokens is None:
                self._tokens, self._gap = float(real_tokens), gap
            else:  # tokens and gaps smoothed apart: a mean of ratios would let one short gap dominate
                self._tokens = (1 - SMOOTHING) * self._tokens + SMOOTHING * real_tokens
                self._gap = (1 - SMOOTHING) * self._gap + SMOOTHING * gap
            self._rate = self._tokens / self._gap

    def _retry_after(self, wait: float | None) -> int:
        """Whole seconds until the queue is back under its limit (at least 1)."""
        if wait is None:
            return 1
        return max(1, math.ceil(wait - min(wait, self.max_seconds)))
