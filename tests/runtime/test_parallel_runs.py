"""A backend with several streams gets that many batches in flight at once, from the engine and the raw timer."""

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest

from encoderrt import Engine
from encoderrt.runtime import engine as engine_module
from encoderrt.runtime import scheduler as scheduler_module
from encoderrt.runtime.backends import Batch, first_output
from encoderrt.runtime.errors import InferenceFailed
from encoderrt.runtime.throughput import pass_seconds
from encoderrt.runtime.tokenizer import TOKENIZER_FILE, TextTokenizer, Tokens


class TwoStreams:
    """Wraps a real backend; each run waits up to 1 s for a second run to be in flight, and records the most seen."""

    def __init__(self, inner):
        self.inner = inner
        self.input_names, self.output_names, self.max_batch_tokens = inner.input_names, inner.output_names, inner.max_batch_tokens
        self.parallel_runs, self.execution, self.capabilities = 2, "two streams", inner.capabilities
        self.in_flight = self.most_in_flight = 0
        self.changed = threading.Condition()
        self.fail = False

    def run(self, batch):
        with self.changed:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.changed.notify_all()
            self.changed.wait_for(lambda: self.in_flight >= 2, timeout=1.0)
        try:
            if self.fail:
                raise RuntimeError("simulated stream fault")
            return self.inner.run(batch)
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
        expected = np.concatenate([first_output(made[0].inner, Batch(engine._tokenizer.encode([t]), engine._tokenizer.pad))
                                   for t in texts])
    assert made[0].most_in_flight == 2
    np.testing.assert_allclose(embeddings, expected / np.linalg.norm(expected, axis=1, keepdims=True), atol=1e-5)


def test_raw_timing_runs_streams_together_and_reraises_failures(tiny_artifacts):
    from encoderrt.runtime.backends import load_backend
    from encoderrt.runtime.manifest import read_manifest

    backend = TwoStreams(load_backend(read_manifest(tiny_artifacts["st-cls"]), tiny_artifacts["st-cls"]))
    rows = [Tokens([5] * 4, [0] * 4)] * 2
    tokenizer = TextTokenizer(tiny_artifacts["st-cls"] / TOKENIZER_FILE, 64, 0, backend.input_names)
    assert pass_seconds(backend, [Batch(rows, tokenizer.pad)] * 4) > 0 and backend.most_in_flight == 2
    backend.fail = True
    with pytest.raises(RuntimeError, match="simulated stream fault"):
        pass_seconds(backend, [Batch(rows, tokenizer.pad)] * 4)


class LoneRuns:
    """Two streams and lone batches on every core over a real backend. Records how each batch ran and how many runs
    were in flight
    with it; while `holding`, each batch waits until the test takes its release from `held` and sets it. A stream's
    run takes `stream_delay` longer than a lone one (small work then measures as worth running alone at load)."""

    stream_delay = 0.004
    alone_delay = 0.0

    def __init__(self, inner):
        self.inner = inner
        self.input_names, self.output_names, self.max_batch_tokens = inner.input_names, inner.output_names, inner.max_batch_tokens
        self.parallel_runs, self.execution = 2, "two streams, lone batches on both cores"
        self.capabilities = replace(inner.capabilities, runs_alone=True)
        self.ran: list[tuple[str, int]] = []
        self.in_flight = 0
        self.lock = threading.Lock()
        self.holding = False
        self.held: queue.Queue[threading.Event] = queue.Queue()
        self.fail_alone = False

    def _held(self, how, batch):
        with self.lock:
            self.in_flight += 1
            self.ran.append((how, self.in_flight))
        if self.holding and threading.current_thread().name.startswith("encoderrt-batcher"):
            release = threading.Event()
            self.held.put(release)
            assert release.wait(30), "the test never released this batch"
        try:
            return self.inner.run(batch)
        finally:
            with self.lock:
                self.in_flight -= 1

    def run(self, batch):
        if not batch.alone:
            time.sleep(self.stream_delay)
            return self._held("stream", batch)
        if self.fail_alone:
            self.fail_alone = False
            raise RuntimeError("simulated fault on every core")
        time.sleep(self.alone_delay)
        return self._held("alone", batch)


@pytest.fixture
def lone_runs(tiny_artifacts, monkeypatch):
    """An engine over a LoneRuns backend whose budget holds one of the tests' rows per batch."""
    made = []
    real = engine_module.load_backend
    monkeypatch.setattr(engine_module, "load_backend", lambda *a, **k: made.append(LoneRuns(real(*a, **k))) or made[-1])
    with Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=16, max_wait_ms=0) as engine:
        made[0].ran.clear()  # Engine.load's own runs
        made[0].holding = True
        yield engine, made[0]
        made[0].holding = False


def submit(engine, *texts):
    return engine._scheduler.submit(engine._tokenizer.encode(list(texts)))


def test_a_request_that_is_the_only_work_runs_alone(lone_runs):
    engine, backend = lone_runs
    backend.holding = False
    alone = engine.embed(["the only request"])
    assert backend.ran == [("alone", 1)]
    np.testing.assert_allclose(alone, engine.embed(["the only request", "and a second one in its own batch"])[:1],
                               atol=1e-5)
    assert backend.ran[1] == ("stream", 1)  # the second row was waiting; it runs alone only if the first is done by then


def test_a_batch_with_work_beside_it_runs_on_a_stream(lone_runs):
    engine, backend = lone_runs
    future = submit(engine, "the first of two rows", "the second of two rows")  # one row per 16-token batch
    releases = [backend.held.get(timeout=10), backend.held.get(timeout=10)]  # both in flight at once
    for release in releases:
        release.set()
    future.result(timeout=10)
    assert backend.ran == [("stream", 1), ("stream", 2)]


def test_nothing_starts_while_a_batch_runs_alone(lone_runs):
    engine, backend = lone_runs
    first = submit(engine, "first")
    release = backend.held.get(timeout=10)
    assert backend.ran == [("alone", 1)]
    second = submit(engine, "second")
    with pytest.raises(queue.Empty):  # a batch started beside one running on every core
        backend.held.get(timeout=0.3)
    release.set()
    first.result(timeout=10)
    backend.held.get(timeout=10).set()
    second.result(timeout=10)
    assert backend.ran == [("alone", 1), ("alone", 1)]  # the second was then the only work in its turn


def arriving_during_the_one_before(engine, backend, count):
    """`count` requests, each submitted while the one before it is held in the backend, that one then released and
    finished; the last is still held. Their futures."""
    futures = [submit(engine, "request 0")]
    for i in range(1, count):
        release = backend.held.get(timeout=10)
        futures.append(submit(engine, f"request {i}"))
        release.set()
        futures[-2].result(timeout=10)
    return futures


def test_lone_runs_stop_while_work_keeps_arriving_during_them_and_resume_when_it_does_not(lone_runs, monkeypatch):
    """Hand count, smoothed 0.8 / 0.2 against the limit 0.3: company during requests 0-2 brings it to 0.2, 0.36 and
    0.488. Request 2 runs on a stream, so request 3 starts beside it (not from idle: no count). Quiet requests
    4-6 bring it to 0.39, 0.312 and 0.25, so request 7 runs alone again. (Work above SMALL_WORK_TOKENS: here, any.)"""
    monkeypatch.setattr(scheduler_module, "SMALL_WORK_TOKENS", 0)
    engine, backend = lone_runs
    futures = arriving_during_the_one_before(engine, backend, 3)
    beside = backend.held.get(timeout=10)  # request 2, on a stream
    futures.append(submit(engine, "request 3"))
    releases = [beside, backend.held.get(timeout=10)]  # request 3 has started beside it before either ends
    for release, future in zip(releases, futures[2:]):
        release.set()
        future.result(timeout=10)
    backend.holding = False
    for i in range(4, 8):
        engine.embed([f"request {i}"])
    assert backend.ran == [("alone", 1), ("alone", 1), ("stream", 1), ("stream", 2), ("stream", 1), ("stream", 1),
                           ("stream", 1), ("alone", 1)]


def test_small_work_runs_alone_even_while_work_keeps_arriving(lone_runs):
    """The same arrivals as above, each batch a row of a few tokens (under SMALL_WORK_TOKENS): every one runs alone,
    none on a stream, since splitting such batches across single-threaded streams only makes them smaller."""
    engine, backend = lone_runs
    assert engine._scheduler._small_alone_from == 0  # measured at load: a lone run beats a stream's at every size
    futures = arriving_during_the_one_before(engine, backend, 5)
    backend.held.get(timeout=10).set()
    futures[-1].result(timeout=10)
    assert backend.ran == [("alone", 1)] * 5


def test_small_work_follows_the_company_rule_where_every_core_runs_it_no_faster(tiny_artifacts, monkeypatch):
    """Where a lone run of small work is no faster than a stream's (OpenVINO's bf16 streams on AMX), small work runs
    alone only while company stays under SMALL_ALONE_WHILE_COMPANY_BELOW (0.6). Hand count, smoothed 0.8 / 0.2:
    company during requests 0-4 brings it to 0.2, 0.36, 0.488, 0.59 and 0.672, so request 5 runs on a stream."""
    monkeypatch.setattr(LoneRuns, "stream_delay", 0.004)
    monkeypatch.setattr(LoneRuns, "alone_delay", 0.004)
    made = []
    real = engine_module.load_backend
    monkeypatch.setattr(engine_module, "load_backend", lambda *a, **k: made.append(LoneRuns(real(*a, **k))) or made[-1])
    with Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=16, max_wait_ms=0) as engine:
        backend = made[0]
        assert engine._scheduler._small_alone_from is None
        backend.ran.clear()
        backend.holding = True
        futures = arriving_during_the_one_before(engine, backend, 6)
        backend.held.get(timeout=10).set()
        futures[-1].result(timeout=10)
        backend.holding = False
    assert backend.ran == [("alone", 1)] * 5 + [("stream", 1)]


def test_a_failed_lone_run_fails_its_batch_only_and_frees_the_streams(lone_runs):
    engine, backend = lone_runs
    backend.holding, backend.fail_alone = False, True
    with pytest.raises(InferenceFailed, match="inference failed for a batch of 1 rows"):
        engine.embed(["this one fails"])
    two = submit(engine, "the first of two rows", "the second of two rows")
    assert len(two.result(timeout=10).outputs) == 2 and backend.ran[-2][0] == "stream"  # not held back by a stale flag
    assert engine.embed(["and the next one"]).shape[0] == 1 and backend.ran[-1][0] == "alone"


def test_onnxruntime_runs_a_stream_per_core_and_lone_batches_on_every_core(tiny_artifacts):
    """A small graph on two threads: two single-threaded sessions for batches side by side, one over both cores for a
    lone batch; both give the one-session engine's vectors. One thread: one session, nothing to run alone."""
    texts = ["a short query", "a longer passage about the weather in Lisbon in the spring"]
    with Engine.load(tiny_artifacts["st-cls"], intra_op_threads=1) as one:
        assert one.info.parallel_runs == 1 and "streams" not in one.info.execution
        expected = one.embed(texts)
    with Engine.load(tiny_artifacts["st-cls"], intra_op_threads=2) as engine:
        assert engine.info.parallel_runs == 2 and "2 streams" in engine.info.execution
        np.testing.assert_allclose(engine.embed(texts), expected, atol=1e-5)  # a lone batch, on both cores
        with ThreadPoolExecutor(16) as pool:  # batches side by side on the streams
            rows = np.concatenate(list(pool.map(lambda text: engine.embed([text]), texts * 8)))
        np.testing.assert_allclose(rows, np.tile(expected, (8, 1)), atol=1e-5)


def test_onnxruntime_keeps_one_session_where_the_streams_copies_of_the_weights_would_pass_the_budget(tiny_artifacts,
                                                                                                    monkeypatch):
    """Each session holds its own prepacked GEMM weights: two streams and the lone-batch session hold three copies."""
    from encoderrt.runtime.backends import onnxruntime_cpu
    from encoderrt.runtime.manifest import read_manifest

    manifest = read_manifest(tiny_artifacts["st-cls"])
    h, i = manifest.shape.hidden_size, manifest.shape.intermediate_size  # BERT: Q, K, V, O and the FFN's two matrices
    copy = manifest.shape.num_layers * (4 * h * h + 2 * h * i) * 4  # bytes of fp32
    assert onnxruntime_cpu.prepacked_bytes(manifest) == copy == 2 * (4 * 32 * 32 + 2 * 32 * 64) * 4
    monkeypatch.setattr(onnxruntime_cpu, "STREAMS_MEMORY_BYTES", 3 * copy)
    with Engine.load(tiny_artifacts["st-cls"], intra_op_threads=2) as engine:
        assert engine.info.parallel_runs == 2
    monkeypatch.setattr(onnxruntime_cpu, "STREAMS_MEMORY_BYTES", 3 * copy - 1)
    with Engine.load(tiny_artifacts["st-cls"], intra_op_threads=2) as engine:
        assert engine.info.parallel_runs == 1 and "streams" not in engine.info.execution


def test_onnxruntime_streams_without_the_lone_batch_session_where_none_runs_alone(tiny_artifacts):
    """Compile's own runs never run a batch alone (BackendOptions.lone_runs off): two streams, no third session and
    its copy of the weights."""
    from encoderrt.runtime.backends import BackendOptions, load_backend
    from encoderrt.runtime.manifest import read_manifest

    artifact = tiny_artifacts["st-cls"]
    both = load_backend(read_manifest(artifact), artifact, BackendOptions(2))
    streams_only = load_backend(read_manifest(artifact), artifact, BackendOptions(2, lone_runs=False))
    assert both.parallel_runs == streams_only.parallel_runs == 2
    assert both.capabilities.runs_alone and not streams_only.capabilities.runs_alone
    assert both._alone is not None and streams_only._alone is None


def test_a_bulk_jobs_engine_loads_no_every_core_copy(tiny_artifacts):
    """A job's queue is deep until its last batches, so its engine (job_engine_config: lone_runs off) loads the streams
    alone; a lone request then runs on a stream, with the same vectors."""
    from dataclasses import replace

    from encoderrt.jobs.job import JobSettings, job_engine_config

    texts = ["a short query", "a longer passage about the weather in Lisbon in the spring"]
    with Engine.load(tiny_artifacts["st-cls"], intra_op_threads=2) as served:
        assert "a lone batch on every core" in served.info.execution  # the default, as a server loads it
        expected = served.embed(texts)
    config = replace(job_engine_config(JobSettings()), intra_op_threads=2)
    with Engine.load(tiny_artifacts["st-cls"], config) as job:
        assert job.info.parallel_runs == 2 and "2 streams" in job.info.execution
        assert "a lone batch" not in job.info.execution
        np.testing.assert_allclose(job.embed(texts), expected, atol=1e-5)
