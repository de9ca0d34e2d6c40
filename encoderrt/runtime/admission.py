"""Admission: new work is refused at once (Overloaded, saying when to retry) while the queue already holds more
than `max_queue_seconds` of work, so latency stays bounded under overload and is back to normal within that time
once the load ends. An item count alone cannot do this: 8,192 short queries are a second of work, 8,192 long
passages half a minute.

Queue wait = queued tokens / throughput. Throughput starts at the load-time calibration and then follows the
measured rate of full batches: a deep queue runs full batches, and the rate of a lone short query (mostly fixed
cost) says nothing about how fast a queue drains.
"""

from __future__ import annotations

import math
import threading

from encoderrt.runtime.errors import Overloaded

FULL_BATCH = 0.5
"""A batch of at least this share of the token budget measures the draining rate."""
SMOOTHING = 0.2


class Admission:
    def __init__(self, max_items: int, max_seconds: float, budget: int, workers: int, tokens_per_second: float | None):
        self.max_items = max_items
        self.max_seconds = max_seconds
        self._budget = budget
        self._workers = workers
        self._rate = tokens_per_second
        """Real tokens per second, every worker together; None until calibrated or measured."""
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

    def observe(self, real_tokens: int, padded_tokens: int, seconds: float) -> None:
        """One batch's run by one worker."""
        if seconds <= 0 or padded_tokens < FULL_BATCH * self._budget:
            return
        sample = real_tokens / seconds * self._workers
        with self._lock:
            self._rate = sample if self._rate is None else (1 - SMOOTHING) * self._rate + SMOOTHING * sample

    def _retry_after(self, wait: float | None) -> int:
        """Whole seconds until the queue is back under its limit (at least 1)."""
        if wait is None:
            return 1
        return max(1, math.ceil(wait - min(wait, self.max_seconds)))
