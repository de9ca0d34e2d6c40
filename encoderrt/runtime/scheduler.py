"""The one batching loop: rows from every caller -> token-budget batches -> backend runs.

Callers `submit` tokenised rows and get a Future. Worker threads (one per backend session, or per stream of a
backend that runs several batches at once) form batches under a padded-token budget (bigger while the queue is deep:
EngineConfig.deep_batch_tokens); a free worker takes what is waiting at once (where max_wait is set, it waits up to
that for company, but only while requests arrive faster than that), sorting the waiting rows by length so that rows
of similar length run together, and always running the batch that holds the oldest row so that nothing starves.
A batch that is the only work (nothing else running or waiting) is marked to run alone, on every core, where the
backend declares it can (Capabilities.runs_alone), and no other batch starts until it ends; but only while work
seldom arrives during such batches (ALONE_WHILE_COMPANY_BELOW), since a stream idle beside a lone run is capacity
lost under load, or while the work is too small to split (SMALL_WORK_TOKENS) and every core runs it much faster
than one stream (measured at load). Identical rows are computed once, whoever asked for them, and where a result
cache is given, a row run before is answered from it without queueing (runtime/result_cache.py). A row whose every
caller has gone (cancelled or failed Future) is dropped before it runs. Whether new work may queue at all is
runtime/admission.py's call (items waiting, and seconds of work at the measured throughput).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass

import numpy as np

from encoderrt.runtime.admission import Admission
from encoderrt.runtime.backends import Backend
from encoderrt.runtime.backends.base import Batch, Padder
from encoderrt.runtime.errors import EngineClosed, InferenceFailed, InvalidRequest, Overloaded
from encoderrt.runtime.manifest import PER_TOKEN_OUTPUTS
from encoderrt.runtime.result_cache import ResultCache, row_key
from encoderrt.runtime.stats import EngineStats
from encoderrt.runtime.tokenizer import Tokens
from encoderrt.runtime.waiting import WaitingRow, WaitingRows

log = logging.getLogger("encoderrt.runtime")

DEEP_BATCH_TOKENS = 1024
"""While this many padded tokens are waiting, a calibrated budget below it gives way to batches this big
(EngineConfig.deep_batch_tokens). Engine, closed-loop clients of 16 passages, alternating rounds (2-core Sapphire
Rapids), budget 512 / fixed 1,024 / 512 with this rule: bf16 all-MiniLM-L6-v2 at 8 clients 30,670 / 32,840 / 32,480
tokens/s, at 32 clients 31,560 / 34,670 / 34,690; EmbeddingGemma's base-sized layout in bf16 at 8 clients 4,270 /
4,580 / 4,580. Single queries at 32 clients never queue that deep: 17,430 / 17,050 / 17,790, within the rounds'
spread. Bigger batches lose, whatever the budget: a fixed 2,048 was 0.92x 512's at 8 clients (it took 8 clients'
queue in one cut and left a stream idle), a calibrated 1,024 doubled to 2,048 gave CI's 8-client check 4.1x against
4.6x, and 2,048 doubled to 4,096 was 0.93x 2,048's at 32 clients."""
SMALL_WORK_TOKENS = 256
"""A batch of at most this many padded tokens that is the only work runs alone even under load, at the sizes where
running it on every core pays (measured at load: calibration.LONE_SPEEDUP_WORTH): split across single-threaded
streams, such batches are smaller still, each paying a batch's fixed cost on one core. Closed-loop
single queries of all-MiniLM-L6-v2 fp32 on onnxruntime's streams, 2-core AVX2 EPYC: at 4 / 8 / 16 clients
2,800-3,100 / 3,450-3,570 / 3,860-3,950 tokens/s on streams against 3,440-3,500 / 3,880-3,910 / 4,250 on one
two-threaded session; at 32 clients (batches of ~320 tokens) streams were ahead, 4,460 against 3,970."""
SMALL_ALONE_WHILE_COMPANY_BELOW = 0.6
"""The company limit of small work that every core runs not much faster than one stream (calibration's
LONE_SPEEDUP_WORTH): under a light load it still runs alone, under a steady one on the streams. bf16
all-MiniLM-L6-v2 on OpenVINO, 2-core Sapphire Rapids, single queries, three rounds in one process, against running
such work always alone: closed loop at 4 / 8 / 16 clients 5,540 / 7,790 / 10,870 tokens/s against 5,250 / 6,940 /
9,090 (with the general 0.3: 5,520 / 8,300 / 10,960); open-loop p50 at 100 queries/s 5.99 ms against 5.72 (0.3:
6.57), at 300/s 7.43 against 7.61."""
ALONE_WHILE_COMPANY_BELOW = 0.3
"""A batch that starts with the engine idle runs alone while fewer than this share of such batches (smoothed) saw
new work arrive before they ended. Single queries, bf16 MiniLM, 2-core EPYC, open loop: running every such batch
alone raised p50 at 300 requests/s from 10.8-15.2 to 17.6-19.4 ms (work arrived during most of them and waited,
with a stream idle); with this rule it is 10.9-12.6 ms, and at 50/s p50 is 6.8-7.6 ms against 8.1-9.5."""


UNEXPECTED = "the engine failed on this request; the server log has the cause"
"""What the callers of rows hear when the batching loop itself fails on them (not the backend: InferenceFailed's own
message names that)."""


@dataclass(frozen=True)
class Completed:
    outputs: list[np.ndarray] | list[dict[str, np.ndarray]]
    """One output row per submitted row, in submission order: the graph's first output's row, or, where the
    submission named outputs, each of them by name (a per-token one cut to the row's own tokens)."""
    queue_seconds: float
    inference_seconds: float


class _Ticket:
    """One submission: its result slots and the Future its caller waits on (the loop's own, where the caller awaits
    it on a loop: `Scheduler.submit_on_loop`)."""

    __slots__ = ("future", "loop", "outputs", "remaining", "submitted", "started", "lock", "named")

    def __init__(self, size: int, named: tuple[str, ...] = (), loop: asyncio.AbstractEventLoop | None = None):
        self.named = named
        """The graph outputs it wants by name, instead of the first one."""
        self.loop = loop
        self.future: Future[Completed] | asyncio.Future[Completed] = loop.create_future() if loop else Future()
        self.outputs: list[np.ndarray | dict[str, np.ndarray] | None] = [None] * size
        self.remaining = size
        self.submitted = time.perf_counter()
        self.started: float | None = None
        self.lock = threading.Lock()

    def deliver(self, index: int, output: np.ndarray | dict[str, np.ndarray]) -> Completed | None:
        """Fill one slot; once every slot is filled, the answer, for the caller to settle (`_settle_all`)."""
        with self.lock:
            self.outputs[index] = output
            self.remaining -= 1
            if self.remaining:
                return None
        now = time.perf_counter()
        started = self.started if self.started is not None else now
        return Completed(self.outputs, started - self.submitted, now - started)  # type: ignore[arg-type]


Outcome = tuple[_Ticket, Completed | None, BaseException | None]
"""A ticket and what it gets: an answer, or an error."""
_Settling = list[tuple[asyncio.Future[Completed], Completed | None, BaseException | None]]


def _settle_all(outcomes: Sequence[Outcome]) -> None:
    """Complete the tickets' Futures, from any thread, with one call into each loop that awaits some of them (an
    asyncio Future is completed on its loop) rather than one a ticket: each call_soon_threadsafe writes to the
    loop's self-pipe and wakes it, and those writes were nearly all of a batcher's own work on one-query requests
    (a backend that answers at once, 32 clients in process)."""
    by_loop: dict[asyncio.AbstractEventLoop, _Settling] = {}
    for ticket, result, error in outcomes:
        if ticket.loop is None:
            _settle(ticket.future, result, error)
        else:
            by_loop.setdefault(ticket.loop, []).append((ticket.future, result, error))  # type: ignore[arg-type]
    for loop, settled in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle_each, settled)
        except RuntimeError:  # the loop is closed: nobody waits for these answers any more
            pass


def _settle_each(settled: _Settling) -> None:
    for future, result, error in settled:
        _settle(future, result, error)


def _settle(future: Future | asyncio.Future, result: Completed | None = None,
            error: BaseException | None = None) -> None:
    """Complete a Future unless its caller already cancelled it."""
    if future.done():  # cancelled: an asyncio Future would raise its own InvalidStateError
        return
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:  # cancelled in between, from another thread
        pass


def _named_outputs(rows: Sequence[WaitingRow]) -> set[str]:
    """The outputs the rows' callers name (a batch that returns any runs on a stream, never alone)."""
    return {name for row in rows for ticket, _ in row.consumers for name in ticket.named}


def _row_outputs(outputs: dict[str, np.ndarray], names: tuple[str, ...], row: int, tokens: int) -> dict[str, np.ndarray]:
    """One row's named outputs: a per-token one cut to the row's own tokens (the padding's are not the caller's)."""
    return {name: outputs[name][row, :tokens].copy() if name in PER_TOKEN_OUTPUTS else outputs[name][row]
            for name in names}


class Scheduler:
    def __init__(
        self,
        backends: Sequence[Backend],
        pad: Padder,
        max_batch_tokens: int,
        max_wait_ms: float,
        admission: Admission,
        stats: EngineStats,
        small_alone_from: int | None = None,
        deep_batch_tokens: int | None = None,
        result_cache: ResultCache | None = None,
    ):
        """`small_alone_from`: the fewest padded tokens of small work (SMALL_WORK_TOKENS) that runs alone even while
        other work arrives, as measured at load (calibration.small_work_alone_from); None: none does.
        `deep_batch_tokens`: the budget while at least that many tokens wait (None: the budget).
        `result_cache`: where rows' answers are kept, and repeated rows answered from, without running."""
        self._cache = result_cache
        self.max_batch_tokens = max_batch_tokens
        self._deep_budget = deep_batch_tokens or max_batch_tokens
        self._small_alone_from = small_alone_from
        self._pad = pad
        self._max_wait = max_wait_ms / 1000
        self.admission = admission
        self._stats = stats
        self._rows = WaitingRows(max(backend.capabilities.width_multiple for backend in backends))
        self._empty_rows = all(backend.capabilities.empty_rows for backend in backends)
        self._pending_items = 0
        self._cond = threading.Condition()
        self._closed = False
        self._in_flight = 0
        self._alone = False
        """A batch is running alone on every core: no other starts until it ends."""
        self._submissions = 0
        self._company = 0.0
        """How often (smoothed) work arrived while a batch that started with the engine idle ran."""
        self._last_arrival = 0.0
        self._arrival_gap = float("inf")
        """Smoothed time between submissions: waiting for company only pays when company comes soon."""
        self._threads = [
            threading.Thread(target=self._loop, args=(backend,), name=f"encoderrt-batcher-{i}.{j}", daemon=True)
            for i, backend in enumerate(backends)
            for j in range(backend.parallel_runs)
        ]
        for thread in self._threads:
            thread.start()
        # An engine left open when the interpreter exits (an exception, Ctrl-C) must not be running a batch while
        # the interpreter tears down: onnxruntime aborts the process there. Daemon threads outlive atexit's turn.
        atexit.register(self.close)

    def submit(self, rows: Sequence[Tokens], outputs: tuple[str, ...] = ()) -> Future[Completed]:
        """`outputs`: deliver each row's outputs of these names, instead of its row of the graph's first output."""
        return self._enqueue(_Ticket(len(rows), outputs), rows)  # type: ignore[return-value]

    def submit_on_loop(self, rows: Sequence[Tokens], outputs: tuple[str, ...],
                       loop: asyncio.AbstractEventLoop) -> asyncio.Future[Completed]:
        """`submit` for a caller that awaits the answer on `loop` (called on it): the Future is the loop's own,
        completed on it, with no concurrent Future chained to it (asyncio.wrap_future: 9 us of a request's CPU, 38
        against 29 us for the hand-off to a thread and back). Cancelling it drops the rows, as cancelling
        `submit`'s does."""
        return self._enqueue(_Ticket(len(rows), outputs, loop), rows)  # type: ignore[return-value]

    def _enqueue(self, ticket: _Ticket, rows: Sequence[Tokens]) -> Future[Completed] | asyncio.Future[Completed]:
        if not rows:
            _settle(ticket.future, result=Completed([], 0.0, 0.0))
            return ticket.future
        if any(not tokens.ids for tokens in rows):
            rows = self._with_empty_rows(rows)
        if len(rows) > self.admission.max_items:
            raise InvalidRequest(f"a request of {len(rows)} items is larger than the engine's queue ({self.admission.max_items} items)")
        pending = list(enumerate(rows))
        if self._cache is not None and not self._closed:
            pending = self._answer_cached(ticket, pending)
            if not pending:
                return ticket.future
        with self._cond:
            if self._closed:
                raise EngineClosed("the engine is closed")
            try:
                self.admission.check(self._pending_items, self._rows.tokens, len(pending))
            except Overloaded:
                self._stats.add(overloaded=1)
                raise
            now = time.perf_counter()
            gap = now - self._last_arrival
            self._arrival_gap = gap if self._arrival_gap == float("inf") else 0.7 * self._arrival_gap + 0.3 * gap
            self._last_arrival = now
            self._submissions += 1
            duplicates = 0
            for index, tokens in pending:
                key = (tuple(tokens.ids), tuple(tokens.type_ids), *tokens[2:])
                row = self._rows.get(key)
                if row is None:
                    row = self._rows.add(tokens, key)
                else:
                    duplicates += 1
                row.consumers.append((ticket, index))
            self._pending_items += len(pending)
            self._stats.add(items=len(pending), deduplicated_items=duplicates, queue_depth=len(pending))
            if not self._alone:  # a worker woken now would only wait again: the lone run's end wakes them all
                self._cond.notify()
        return ticket.future

    def _answer_cached(self, ticket: _Ticket, rows: list[tuple[int, Tokens]]) -> list[tuple[int, Tokens]]:
        """Fill the ticket's slots whose rows the result cache holds, settling it if that was all of them; returns
        the (index, row) still to run. A request answered whole never queues, so it counts as no arrival."""
        assert self._cache is not None
        missing, completed = [], None
        for index, tokens in rows:
            answer = self._cache.get(row_key(tokens, ticket.named))
            if answer is None:
                missing.append((index, tokens))
            else:
                completed = ticket.deliver(index, answer)
        if hits := len(rows) - len(missing):
            self._stats.add(items=hits, cached_items=hits)
        if completed is not None:
            _settle(ticket.future, completed)  # on the caller's own thread: the loop's, for an awaiting caller
        return missing

    def _with_empty_rows(self, rows: Sequence[Tokens]) -> list[Tokens]:
        """Rows without tokens as one token nothing attends to, where every backend answers such a row; else refused:
        a decoder's tokenizer may add no token of its own to an empty text, and a transformer cannot run none."""
        for index, tokens in enumerate(rows):
            if not tokens.ids and not self._empty_rows:
                raise InvalidRequest(f"input {index} has no tokens to run: an empty text, to which this model's "
                                     "tokenizer adds none of its own; send some text")
        return [tokens if tokens.ids else tokens._replace(ids=[0], type_ids=[0], attended=0) for tokens in rows]

    def stopped_workers(self) -> list[str]:
        """The batching workers that have ended while the engine is open: none should (a worker outlives its own
        faults), and one that did leaves its share of the work undone."""
        if self._closed:
            return []
        return [thread.name for thread in self._threads if not thread.is_alive()]

    def close(self, timeout: float = 5.0) -> None:
        atexit.unregister(self.close)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._fail_waiting(EngineClosed("the engine was closed before this request ran"))
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout)

    def _fail_waiting(self, error: BaseException) -> None:
        """Answer every waiting row's callers with `error`."""
        with self._cond:
            waiting = self._rows.clear()
            items = sum(len(row.consumers) for row in waiting)
            self._pending_items -= items
            self._stats.add(queue_depth=-items)
        _settle_all([(ticket, None, error) for row in waiting for ticket, _ in row.consumers])

    def _loop(self, backend: Backend) -> None:
        """A worker: batches until the engine closes. A fault of ours in forming or answering a batch fails the
        requests it touched and the worker goes on: a worker that ended would leave every later request waiting."""
        while True:
            try:
                taken = self._next_batch(backend.capabilities.runs_alone)
            except Exception:  # noqa: BLE001 - see the docstring
                log.exception("forming a batch failed; the waiting requests are failed and the engine goes on")
                self._fail_waiting(InferenceFailed(UNEXPECTED))
                continue
            if taken is None:
                return
            batch, alone, idle_since = taken
            ended = None
            try:
                ended = self._run(backend, batch, alone)
            except Exception:  # noqa: BLE001 - see the docstring (a backend's own failure is _run's to answer)
                log.exception("answering a batch of %d rows failed; its requests are failed", len(batch))
                error = InferenceFailed(UNEXPECTED)
                _settle_all([(ticket, None, error) for row in batch for ticket, _ in row.consumers])
            finally:
                with self._cond:
                    self._in_flight -= 1
                    if idle_since is not None and ended is not None:  # did company come while it ran?
                        self._company = 0.8 * self._company + 0.2 * (ended > idle_since)
                    if alone:
                        self._alone = False
                        self._cond.notify_all()

    def _next_batch(self, can_run_alone: bool) -> tuple[list[WaitingRow], bool, int | None] | None:
        """The next batch; whether it runs alone; and, for a batch that starts with the engine idle, the
        submissions so far (None otherwise)."""
        with self._cond:
            while not self._closed:
                if not self._rows or self._alone:
                    self._cond.wait()
                    continue
                waited = time.perf_counter() - self._rows.oldest().enqueued
                company_expected = self._arrival_gap < self._max_wait
                if company_expected and self._rows.tokens < self.max_batch_tokens and waited < self._max_wait:
                    self._cond.wait(self._max_wait - waited)
                    continue
                batch = self._take_batch()
                if batch:
                    idle = not self._in_flight and not self._rows
                    alone = (can_run_alone and idle and self._company < self._company_limit(batch)
                             and not _named_outputs(batch))
                    self._in_flight += 1
                    self._alone = alone
                    if self._rows:  # submit woke one worker: rows left over are another's to run
                        self._cond.notify()
                    return batch, alone, self._submissions if idle else None
            return None

    def _company_limit(self, batch: list[WaitingRow]) -> float:
        """How much company (the smoothed share of idle-start batches that saw work arrive) a batch may see and
        still run alone: small work that every core runs much faster, whatever the company; other small work, up
        to SMALL_ALONE_WHILE_COMPANY_BELOW; the rest, ALONE_WHILE_COMPANY_BELOW."""
        padded = len(batch) * max(len(row.tokens.ids) for row in batch)
        if padded > SMALL_WORK_TOKENS:
            return ALONE_WHILE_COMPANY_BELOW
        if self._small_alone_from is not None and padded >= self._small_alone_from:
            return float("inf")
        return SMALL_ALONE_WHILE_COMPANY_BELOW

    @property
    def deep(self) -> bool:
        """A deep batch's worth of padded tokens waits (deep_batch_tokens): batches are cut at that budget, and a row
        submitted now waits for at least one of them."""
        return self._rows.tokens >= self._deep_budget

    def _take_batch(self) -> list[WaitingRow]:
        """The length-sorted waiting rows cut into runs under the budget: the run holding the oldest row (waiting.py),
        less the rows whose every caller has gone, which are dropped here, before they run."""
        deep = self.deep
        while self._rows:
            rows = self._rows.take(self._deep_budget if deep else self.max_batch_tokens)
            dropped = sum(row.prune() for row in rows)
            items = sum(len(row.consumers) for row in rows)
            self._pending_items -= items + dropped
            self._stats.add(queue_depth=-(items + dropped), cancelled_items=dropped)
            if live := [row for row in rows if row.consumers]:
                return live
        return []

    def _run(self, backend: Backend, rows: list[WaitingRow], alone: bool) -> int:
        """Run and deliver a batch; returns the submissions counted when it ended, before its callers heard (their
        next requests are no company it kept waiting)."""
        started = time.perf_counter()
        for row in rows:
            for ticket, _ in row.consumers:
                if ticket.started is None:
                    ticket.started = started
        first = backend.output_names[0]
        named = _named_outputs(rows)
        if named and any(not ticket.named for row in rows for ticket, _ in row.consumers):
            named.add(first)
        batch = Batch([row.tokens for row in rows], self._pad, outputs=tuple(sorted(named)), alone=alone)
        try:
            result = backend.run(batch)
        except Exception as exc:  # noqa: BLE001 - any backend failure must fail this batch only and keep the loop serving
            self._stats.add(failed_batches=1)
            # the backend's own message names its internals: it goes to the log, the caller gets ours
            log.error("inference failed for a batch of %d rows: %s: %s", len(rows), type(exc).__name__, exc)
            error = InferenceFailed(f"inference failed for a batch of {len(rows)} rows; the server log has the cause")
            error.__cause__ = exc  # Python callers still see the backend's error
            _settle_all([(ticket, None, error) for row in rows for ticket, _ in row.consumers])
            return self._submissions
        ended = self._submissions
        real_tokens = batch.real_tokens
        computed = real_tokens if backend.capabilities.packed_input else batch.padded_tokens  # a packed run pads nothing
        self.admission.observe(real_tokens, batch.padded_tokens, time.perf_counter(), more_queued=bool(self._rows))
        self._stats.add(batches=1, batch_rows=len(rows), real_tokens=real_tokens, padded_tokens=computed)
        answers: list[Outcome] = []
        for i, row in enumerate(rows):
            for ticket, index in row.consumers:
                answer = (_row_outputs(result, ticket.named, i, len(row.tokens.ids)) if ticket.named
                          else result[first][i])
                if self._cache is not None:  # before the callers hear: a request that follows their answer hits
                    self._cache.put(row_key(row.tokens, ticket.named), answer)
                completed = ticket.deliver(index, answer)
                if completed is not None:
                    answers.append((ticket, completed, None))
        _settle_all(answers)
        return ended
