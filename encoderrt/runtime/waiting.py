"""The rows waiting to run, kept so that cutting the next batch costs about the batch, not the queue.

The scheduler's batch is a run of the waiting rows sorted by length (ties by arrival), cut greedily under the token
budget from the shortest, and the run that holds the oldest row. Sorting every waiting row for every batch cost
O(n log n) a batch: a bulk job's shard of thousands of rows waiting at once made batch forming a third of its time,
so jobs had to feed the queue a few requests at a time, and the shallow queue cut batches from fewer neighbours
in length (padding efficiency 0.976 against 0.998 for the same rows sorted whole). Here rows wait in a bucket
per length, in arrival order, so the cut walks the distinct lengths (at most the model's limit) and takes a
prefix or a suffix of each bucket it spans: the same batches, whatever the depth.

A row counts at the width its backend pads it to (Capabilities.width_multiple): the budget holds for the batch the
backend runs, and the full batches of one width share one shape, which OpenVINO prepares its nodes for once rather
than on every change (runtime/backends/openvino.py, WIDTH_BUCKET).
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Hashable

from encoderrt.runtime.backends.base import padded_width
from encoderrt.runtime.tokenizer import Tokens


class WaitingRow:
    """A distinct token sequence waiting to run, and every (ticket, index) that wants its output."""

    __slots__ = ("tokens", "key", "consumers", "enqueued")

    def __init__(self, tokens: Tokens, key: Hashable):
        self.tokens = tokens
        self.key = key
        self.consumers: list[tuple[object, int]] = []
        self.enqueued = time.perf_counter()

    def prune(self) -> int:
        """Forget callers that went away (their Future is done: cancelled or failed); returns how many."""
        before = len(self.consumers)
        self.consumers = [(t, i) for t, i in self.consumers if not t.future.done()]  # type: ignore[attr-defined]
        return before - len(self.consumers)


class WaitingRows:
    """Identical rows once (by key), the oldest first, and each length's rows in arrival order."""

    def __init__(self, width_multiple: int = 1) -> None:
        """`width_multiple`: a batch's width is padded up to a multiple of this before it runs."""
        self._width_multiple = width_multiple
        self._by_key: dict[Hashable, WaitingRow] = {}  # arrival order
        self._by_length: dict[int, deque[WaitingRow]] = {}
        self._lengths: list[int] = []  # the lengths that have rows, ascending
        self.tokens = 0
        """Tokens of the waiting rows, each distinct row once."""

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, key: Hashable) -> WaitingRow | None:
        return self._by_key.get(key)

    def add(self, tokens: Tokens, key: Hashable) -> WaitingRow:
        row = self._by_key[key] = WaitingRow(tokens, key)
        length = len(tokens.ids)
        bucket = self._by_length.get(length)
        if bucket is None:
            bucket = self._by_length[length] = deque()
            bisect.insort(self._lengths, length)
        bucket.append(row)
        self.tokens += length
        return row

    def oldest(self) -> WaitingRow:
        return next(iter(self._by_key.values()))

    def take(self, budget: int) -> list[WaitingRow]:
        """Remove and return the run holding the oldest row, shortest first: rows are added to a run while the run's
        rows x its longest row's padded width stay within `budget` (a row longer than the budget runs on its own)."""
        target = len(self.oldest().tokens.ids)  # the oldest row leads its bucket: a bucket is in arrival order
        run: list[tuple[int, int, int]] = []  # (length, first index in its bucket, rows)
        rows, holds_oldest = 0, False
        for length in self._lengths:
            size, offset = len(self._by_length[length]), 0
            width = padded_width(length, self._width_multiple)
            while offset < size:
                room = budget // width - rows if rows else max(1, budget // width)
                if room <= 0:  # the run is full
                    if holds_oldest:
                        return self._remove(run)
                    run, rows = [], 0
                    continue
                count = min(room, size - offset)
                holds_oldest = holds_oldest or (length == target and offset == 0)
                run.append((length, offset, count))
                rows += count
                offset += count
        return self._remove(run)  # the last run: it holds the oldest row, as no earlier one did

    def _remove(self, run: list[tuple[int, int, int]]) -> list[WaitingRow]:
        taken: list[WaitingRow] = []
        for length, first, count in run:
            bucket = self._by_length[length]
            if first == 0:  # the run ends in this bucket (or holds it whole): its oldest rows
                part = [bucket.popleft() for _ in range(count)]
            else:  # the run started in this bucket and went on: its newest rows
                part = [bucket.pop() for _ in range(count)][::-1]
            taken.extend(part)
            if not bucket:
                del self._by_length[length]
                self._lengths.pop(bisect.bisect_left(self._lengths, length))
        for row in taken:
            del self._by_key[row.key]
            self.tokens -= len(row.tokens.ids)
        return taken

    def clear(self) -> list[WaitingRow]:
        rows = list(self._by_key.values())
        self._by_key.clear()
        self._by_length.clear()
        self._lengths.clear()
        self.tokens = 0
        return rows

