"""The token budget chosen at load, against backends whose cost per batch is known."""

from __future__ import annotations

import threading
import time

import numpy as np

from encoderrt.runtime.backends import Capabilities
from encoderrt.runtime.calibration import CANDIDATE_BUDGETS, calibrate
from encoderrt.runtime.tokenizer import Tokens


class CostModel:
    """Sleeps `fixed + per_token x padded tokens` per run, and records how many runs overlapped."""

    max_batch_tokens = None

    def __init__(self, fixed: float, per_token: float, parallel_runs: int = 1):
        self.fixed, self.per_token, self.parallel_runs = fixed, per_token, parallel_runs
        self.running = self.most_at_once = 0
        self.lock = threading.Lock()

    capabilities = Capabilities()
    output_names = ("embeddings",)

    def run(self, batch):
        with self.lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        time.sleep(self.fixed + self.per_token * batch.padded_tokens)
        with self.lock:
            self.running -= 1
        return {"embeddings": np.zeros((len(batch.rows), 4), dtype=np.float32)}


def pad(rows: list[Tokens]) -> dict[str, np.ndarray]:
    return {"input_ids": np.array([row.ids for row in rows])}


def test_a_flat_throughput_keeps_the_smallest_budget():
    """Where every budget drains the queue equally fast, a bigger batch only adds latency and padding."""
    # 51 ms for 256 tokens: sleep's own overshoot (~0.2 ms per run on an idle CPU, ~2 ms beside another test worker)
    # stays far from the 10% margin (at 10 ms per run it came within it)
    result = calibrate(CostModel(fixed=0.0, per_token=200e-6), pad, max_length=128, vocab_size=1000, latency_cap_ms=500)
    assert result.max_batch_tokens == 256
    assert [budget for budget, _, _ in result.measurements][:3] == [256, 512, 1024]


def test_a_fixed_cost_per_run_calls_for_big_batches():
    """5 ms per run whatever its size (a GPU launch, say): throughput keeps growing with the batch, within 10% of
    the best only at 16,384 tokens (hand count: 16384 / 21.4 ms = 766k tokens/s, 8192 / 13.2 ms = 621k)."""
    result = calibrate(CostModel(fixed=5e-3, per_token=1e-6), pad, max_length=128, vocab_size=1000, latency_cap_ms=150)
    assert result.max_batch_tokens == 16384


def test_calibration_keeps_every_stream_busy_and_respects_the_latency_cap():
    # throughput still grows 20% from 1,024 to 2,048 tokens (hand count: 33.6k and 40.2k tokens/s), so the latency
    # cap, not the knee, ends the search: 1,024 tokens take 30 ms, 2,048 take 51 ms
    backend = CostModel(fixed=10e-3, per_token=20e-6, parallel_runs=2)
    result = calibrate(backend, pad, max_length=128, vocab_size=1000, latency_cap_ms=40)
    assert backend.most_at_once == 2
    assert result.max_batch_tokens <= 1024
    assert max(budget for budget, _, _ in result.measurements) == 2048  # tried, found too slow, and not tried again


def _modelled(monkeypatch, seconds_for):
    """Each pass takes `seconds_for(padded tokens)` by the calibration's own clock, exactly: the search's rules are
    tested without the sleep overshoot of a busy machine (which once read a flat curve as a 10% gain). Returns
    the count of passes by padded tokens."""
    from encoderrt.runtime import calibration

    passes: dict[int, int] = {}

    def pass_seconds(backend, batches):
        tokens = batches[0].padded_tokens
        passes[tokens] = passes.get(tokens, 0) + 1
        return seconds_for(tokens)

    monkeypatch.setattr(calibration, "pass_seconds", pass_seconds)
    return passes


def test_the_search_stops_at_the_knee_and_times_again_only_contenders(monkeypatch):
    """Flat throughput: two doublings without a 10% gain end the search. A fixed cost per run: 256 tokens drain at
    49k tokens/s against 766k at 16,384 (hand count), so 256 is timed in the first round only."""
    _modelled(monkeypatch, lambda tokens: 100e-6 * tokens)
    flat = calibrate(CostModel(0.0, 0.0), pad, max_length=128, vocab_size=1000, latency_cap_ms=500)
    assert [budget for budget, _, _ in flat.measurements] == [256, 512, 1024]

    passes = _modelled(monkeypatch, lambda tokens: 5e-3 + 1e-6 * tokens)
    growing = calibrate(CostModel(0.0, 0.0), pad, max_length=128, vocab_size=1000, latency_cap_ms=150)
    assert growing.max_batch_tokens == 16384
    # 256 tokens: one round, a warm-up pass and 6 of 5.3 ms to fill 30 ms (three rounds would be 19 passes);
    # 16,384 tokens (21.4 ms a pass): a warm-up and two passes in each of three rounds
    assert (passes[256], passes[16384]) == (7, 7)


def test_a_curve_still_climbing_is_followed_to_its_end(monkeypatch):
    """8% more throughput at every doubling: no two doublings in a row stay within 10% of the last real gain, so
    every budget is tried; 8,192 tokens are within 10% of 16,384's throughput (1 / 1.08 = 0.93) and win."""
    # 256 tokens in 5 ms, then 8% faster per doubling
    _modelled(monkeypatch, lambda tokens: 5e-3 * tokens / 256 / 1.08 ** np.log2(tokens / 256))
    result = calibrate(CostModel(0.0, 0.0), pad, max_length=128, vocab_size=1000, latency_cap_ms=1000)
    assert [budget for budget, _, _ in result.measurements] == list(CANDIDATE_BUDGETS)
    assert result.max_batch_tokens == 8192


def test_calibrating_for_throughput_takes_the_largest_budget_near_the_best(monkeypatch):
    """The same curves, for a bulk job: flat, the largest budget tried wins (fewer batches, each paying the engine's
    fixed cost once); climbing 8% a doubling, only the best is within 3% of itself (1 / 1.08 = 0.93)."""
    _modelled(monkeypatch, lambda tokens: 100e-6 * tokens)
    flat = calibrate(CostModel(0.0, 0.0), pad, max_length=128, vocab_size=1000, latency_cap_ms=500, goal="throughput")
    assert flat.max_batch_tokens == 1024
    _modelled(monkeypatch, lambda tokens: 5e-3 * tokens / 256 / 1.08 ** np.log2(tokens / 256))
    climbing = calibrate(CostModel(0.0, 0.0), pad, max_length=128, vocab_size=1000, latency_cap_ms=1000,
                         goal="throughput")
    assert climbing.max_batch_tokens == 16384


class LoneSpeedup(CostModel):
    """Two streams and lone runs: a lone run takes `per_token x padded tokens`, a stream's run `speedup(rows)` times
    that (long enough, a lone query 1.6 ms, that a busy machine's late wake-ups do not blur a 1.8x speedup into
    less than 1.5x: at 0.3 ms one did, once, with the other test worker compiling)."""

    capabilities = Capabilities(runs_alone=True)

    def __init__(self, speedup):
        super().__init__(0.0, 1e-4, parallel_runs=2)
        self.speedup = speedup

    def run(self, batch):
        factor = 1.0 if batch.alone else self.speedup(len(batch.rows))
        time.sleep(self.per_token * batch.padded_tokens * factor)
        return {"embeddings": np.zeros((len(batch.rows), 4), dtype=np.float32)}


def test_small_work_runs_alone_only_from_the_size_where_every_core_pays():
    """Batches of 1, 4 and 16 sixteen-token queries, timed alone and on one stream: small work runs alone under load
    from the first size at which a lone run is 1.5x one stream (as onnxruntime's sessions measure), at no size where
    it never is (OpenVINO's bf16 streams on AMX measure 1.4x)."""
    from encoderrt.runtime.calibration import small_work_alone_from

    assert small_work_alone_from(LoneSpeedup(lambda rows: 1.8), pad, 30_000) == 0  # any small batch
    assert small_work_alone_from(LoneSpeedup(lambda rows: {1: 1.1, 4: 1.2, 16: 2.0}[rows]), pad, 30_000) == 256
    assert small_work_alone_from(LoneSpeedup(lambda rows: 1.1), pad, 30_000) is None
    assert small_work_alone_from(CostModel(0.0, 2e-5, parallel_runs=2), pad, 30_000) is None  # nothing runs alone
