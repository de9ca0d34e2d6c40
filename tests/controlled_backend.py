"""A backend wrapper that tests can hold at a gate or make fail, around the real backend."""

import threading

import pytest

from encoderrt.runtime import engine as engine_module


class ControlledBackend:
    """Wraps a real backend: can hold a batch at a gate, or fail the next run."""

    def __init__(self, inner):
        self.inner = inner
        self.input_names = inner.input_names
        self.max_batch_tokens = inner.max_batch_tokens
        self.parallel_runs = 1  # one batch at a time, so a test holds exactly the batch it gates
        self.execution = inner.execution
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_next = False
        self.batches: list[tuple[int, int]] = []
        self._checked = False

    def run(self, feeds):
        if not self._checked:  # Engine.load's one check of the graph (runtime/calibration.check_graph) is not a batch
            self._checked = True
            return self.inner.run(feeds)
        self.batches.append(feeds["input_ids"].shape)
        self.entered.set()
        assert self.gate.wait(30), "test gate never opened"
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("simulated device fault")
        return self.inner.run(feeds)


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


