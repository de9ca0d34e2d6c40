"""A backend with several streams gets that many batches in flight at once, from the engine and the raw timer."""

import threading

import numpy as np
import pytest

from encoderrt import Engine
from encoderrt.runtime import engine as engine_module
from encoderrt.runtime.throughput import pass_seconds


class TwoStreams:
    """Wraps a real backend; each run waits up to 1 s for a second run to be in flight, and records the most seen."""

    def __init__(self, inner):
        self.inner = inner
        self.input_names, self.max_batch_tokens = inner.input_names, inner.max_batch_tokens
        self.parallel_runs, self.execution = 2, "two streams"
        self.in_flight = self.most_in_flight = 0
        self.changed = threading.Condition()
        self.fail = False

    def run(self, feeds):
        with self.changed:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.changed.notify_all()
            self.changed.wait_for(lambda: self.in_flight >= 2, timeout=1.0)
        try:
            if self.fail:
                raise RuntimeError("simulated stream fault")
            return self.inner.run(feeds)
        finally:
            with self.changed:
                self.in_flight -= 1


def test_the_scheduler_keeps_parallel_runs_batches_in_flight(tiny_artifacts, monkeypatch):
    made = []
    real = engine_module.load_backend
    monkeypatch.setattr(engine_module, "load_backend", lambda *a, **k: made.append(TwoStreams(real(*a, **k))) or made[-1])
    with Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=64) as engine:
        assert engine.info.parallel_runs == 2 and engine.info.execution == "two streams"
        texts = [f"text number {i} " * (1 + i % 5) for i in range(40)]  # more rows than one 64-token batch holds
        embeddings = engine.embed(texts)
        expected = np.concatenate([made[0].inner.run(engine._tokenizer.pad(engine._tokenizer.encode([t]))) for t in texts])
    assert made[0].most_in_flight == 2
    np.testing.assert_allclose(embeddings, expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-5)


def test_raw_timing_runs_streams_together_and_reraises_failures(tiny_artifacts):
    from encoderrt.runtime.backends import load_backend
    from encoderrt.runtime.manifest import read_manifest

    backend = TwoStreams(load_backend(read_manifest(tiny_artifacts["st-cls"]), tiny_artifacts["st-cls"]))
    feeds = {"input_ids": np.full((2, 4), 5), "attention_mask": np.ones((2, 4), dtype=np.int64),
             "token_type_ids": np.zeros((2, 4), dtype=np.int64)}
    assert pass_seconds(backend, [feeds] * 4) > 0 and backend.most_in_flight == 2
    backend.fail = True
    with pytest.raises(RuntimeError, match="simulated stream fault"):
        pass_seconds(backend, [feeds] * 4)
