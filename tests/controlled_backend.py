"""A backend wrapper that tests can hold at a gate, slow down or make fail, around the real backend."""

import threading
import time

import pytest

from encoderrt.runtime import engine as engine_module


class ControlledBackend:
    """Wraps a real backend: can hold a batch at a gate, or fail the next run."""

    seconds_per_token = 0.0
    """Each run takes at least this per real token: a known throughput, whatever the machine (set it on the class
    before Engine.load, and the load-time throughput measurement sees it too)."""

    def __init__(self, inner):
        self.inner = inner
        self.input_names, self.output_names = inner.input_names, inner.output_names
        self.max_batch_tokens = inner.max_batch_tokens
        self.parallel_runs = 1  # one batch at a time, so a test holds exactly the batch it gates
        self.execution = inner.execution
        self.capabilities = inner.capabilities
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_next = False
        self.batches: list[tuple[int, int]] = []

    def run(self, batch):
        if self.seconds_per_token:
            time.sleep(batch.real_tokens * self.seconds_per_token)
        if not threading.current_thread().name.startswith("encoderrt-batcher"):
            return self.inner.run(batch)  # Engine.load's own runs (graph check, throughput measurement) are no batch
        self.batches.append((len(batch.rows), batch.width))
        self.entered.set()
        assert self.gate.wait(30), "test gate never opened"
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("simulated device fault")
        return self.inner.run(batch)


@pytest.fixture
def controlled(monkeypatch):
    """Engine.load builds ControlledBackends; returns the list of those created."""
    backends = []
    real_load = engine_module.load_backend

    def load_backend(*args, **kwargs):
        backends.append(ControlledBackend(real_load(*args, **kwargs)))
        return backends[-1]

    monkeypatch.setattr(engine_module, "load_backend", load_backend)
    return backends


