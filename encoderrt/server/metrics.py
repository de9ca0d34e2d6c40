"""Prometheus metrics: HTTP counters and latency per route, engine figures read at scrape time.

The engine figures are one table (ENGINE_FIGURES), which Ray replicas publish too (deploy/ray.py).

Each app owns its CollectorRegistry, so two apps in one process (tests, several servers) never
share counters.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from encoderrt.runtime import Engine
from encoderrt.runtime.cpu import cpu_seconds
from encoderrt.server.registry import ModelRegistry

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class EngineFigure(NamedTuple):
    """One figure of each served engine, labelled by model."""

    name: str
    kind: Literal["gauge", "counter"]
    description: str
    read: Callable[[Engine, Mapping[str, float]], float | None]
    """Its value, from the engine and a snapshot of its stats; None where the engine has no such thing."""


def _stat(name: str) -> Callable[[Engine, Mapping[str, float]], float]:
    return lambda engine, stats: stats[name]


ENGINE_FIGURES = (
    EngineFigure("encoderrt_queue_depth", "gauge", "Items waiting in the engine queue", _stat("queue_depth")),
    EngineFigure("encoderrt_padding_efficiency", "gauge", "Real tokens / padded tokens over all batches",
                 _stat("padding_efficiency")),
    EngineFigure("encoderrt_batches", "counter", "Backend runs", _stat("batches")),
    EngineFigure("encoderrt_failed_batches", "counter", "Backend runs that failed", _stat("failed_batches")),
    EngineFigure("encoderrt_batch_rows", "counter", "Rows run in batches", _stat("batch_rows")),
    EngineFigure("encoderrt_tokens_processed", "counter", "Real tokens processed", _stat("real_tokens")),
    EngineFigure("encoderrt_engine_items", "counter", "Items submitted to the engine", _stat("items")),
    EngineFigure("encoderrt_cancelled_items", "counter", "Items dropped before they ran: their client left",
                 _stat("cancelled_items")),
    EngineFigure("encoderrt_overloaded", "counter", "Requests refused because the queue was full (429)",
                 _stat("overloaded")),
    EngineFigure("encoderrt_cached_items", "counter", "Items answered from the result cache without running "
                 "(--result-cache-mb)", _stat("cached_items")),
    EngineFigure("encoderrt_result_cache_bytes", "gauge", "Bytes the result cache holds: answers and remembered "
                 "tokens (models with --result-cache-mb)",
                 lambda engine, stats: engine.result_cache_held() if engine.info.result_cache_bytes else None),
    EngineFigure("encoderrt_result_cache_limit_bytes", "gauge", "The result cache's bound (--result-cache-mb)",
                 lambda engine, stats: engine.info.result_cache_bytes or None),
)
"""What /metrics and a Ray replica's published metrics say of each engine."""


class _EngineCollector:
    def __init__(self, models: ModelRegistry):
        self._models = models

    def collect(self) -> Iterator[Metric]:
        families = [(GaugeMetricFamily if figure.kind == "gauge" else CounterMetricFamily)(
                        figure.name, figure.description, labels=["model"]) for figure in ENGINE_FIGURES]
        tokens = CounterMetricFamily("encoderrt_batch_tokens", "Tokens run in batches", labels=["model", "kind"])
        for served in self._models.models():
            stats = served.engine.stats.snapshot()
            for figure, family in zip(ENGINE_FIGURES, families):
                value = figure.read(served.engine, stats)
                if value is not None:
                    family.add_metric([served.name], value)
            tokens.add_metric([served.name, "real"], stats["real_tokens"])
            tokens.add_metric([served.name, "padded"], stats["padded_tokens"])
        yield from (*families, tokens)


class _ThreadCollector:
    """CPU seconds of the threads that run the server's event loops, read from /proc at each scrape (where there is
    none, nothing): a request's Python runs there, one core at most, so a loop near one second a second is the
    server's front end at its limit, whatever the backend's threads have left."""

    def __init__(self) -> None:
        self.threads: dict[str, int] = {}
        """Each loop's role ("event_loop": uvicorn's, "grpc": the gRPC server's) -> its thread's native id."""

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("encoderrt_thread_cpu_seconds", "CPU seconds of the threads that run the "
                                     "server's event loops: uvicorn's (event_loop) and the gRPC server's (grpc)",
                                     labels=["thread"])
        for role, thread in list(self.threads.items()):
            try:
                family.add_metric([role], cpu_seconds(thread=thread))
            except OSError:  # not Linux, or the thread has ended
                continue
        yield family


class Metrics:
    def __init__(self, models: ModelRegistry):
        self.registry = CollectorRegistry()
        self.requests = Counter("encoderrt_http_requests", "HTTP requests by route and status", ["route", "status"],
                                registry=self.registry)
        self.latency = Histogram("encoderrt_http_request_duration_seconds", "HTTP request latency by route", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self._cut_off = Counter("encoderrt_http_cut_off_at_shutdown", "Requests still running when the shutdown timeout ended",
                                registry=self.registry)
        self.cut_off_requests = 0
        self._refused = Counter("encoderrt_http_refused", "Requests the connection layer answered before the app: 431 "
                                "head too large, 408 head too slow, 503 over --max-connections, 400 malformed HTTP",
                                ["status"], registry=self.registry)
        self.grpc_calls = Counter("encoderrt_grpc_calls", "gRPC calls (TEI's API) by method and status code",
                                  ["method", "code"], registry=self.registry)
        self.grpc_latency = Histogram("encoderrt_grpc_call_duration_seconds", "gRPC call latency by method (a stream's "
                                      "whole call)", ["method"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(_EngineCollector(models))
        self._threads = _ThreadCollector()
        self.registry.register(self._threads)
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}
        """Each (route, status)'s counter and histogram children: `labels()` checks its arguments and looks them up
        under a lock, 8.3 us of every request's event loop against 2.0 with them kept (2-core AVX2 EPYC)."""

    def observe(self, route: str, status: int, seconds: float) -> None:
        children = self._children.get((route, status))
        if children is None:  # a race here makes the same children twice: labels() hands out one per label set
            children = self._children[route, status] = (self.requests.labels(route, str(status)),
                                                        self.latency.labels(route))
        children[0].inc()
        children[1].observe(seconds)

    def observe_grpc(self, method: str, code: str, seconds: float) -> None:
        self.grpc_calls.labels(method, code).inc()
        self.grpc_latency.labels(method).observe(seconds)

    def watch_thread(self, role: str) -> None:
        """Report the calling thread's CPU as the loop `role` runs on (`encoderrt_thread_cpu_seconds`)."""
        self._threads.threads[role] = threading.get_native_id()

    def count_cut_off(self) -> None:
        self.cut_off_requests += 1
        self._cut_off.inc()

    def count_refused(self, status: int) -> None:
        self._refused.labels(str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
