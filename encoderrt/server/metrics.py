"""Prometheus metrics: HTTP counters and latency per route, engine figures read at scrape time.

Each app owns its CollectorRegistry, so two apps in one process (tests, several servers) never
share counters.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from encoderrt.runtime.cpu import cpu_seconds
from encoderrt.server.registry import ModelRegistry

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _EngineCollector:
    def __init__(self, models: ModelRegistry):
        self._models = models

    def collect(self) -> Iterator[Metric]:
        queue = GaugeMetricFamily("encoderrt_queue_depth", "Items waiting in the engine queue", labels=["model"])
        efficiency = GaugeMetricFamily("encoderrt_padding_efficiency", "Real tokens / padded tokens over all batches", labels=["model"])
        batches = CounterMetricFamily("encoderrt_batches", "Backend runs", labels=["model"])
        rows = CounterMetricFamily("encoderrt_batch_rows", "Rows run in batches", labels=["model"])
        tokens = CounterMetricFamily("encoderrt_batch_tokens", "Tokens run in batches", labels=["model", "kind"])
        processed = CounterMetricFamily("encoderrt_tokens_processed", "Real tokens processed", labels=["model"])
        items = CounterMetricFamily("encoderrt_engine_items", "Items submitted to the engine", labels=["model"])
        cancelled = CounterMetricFamily("encoderrt_cancelled_items", "Items dropped before they ran: their client left",
                                        labels=["model"])
        cached = CounterMetricFamily("encoderrt_cached_items", "Items answered from the result cache without running "
                                     "(--result-cache-mb)", labels=["model"])
        held = GaugeMetricFamily("encoderrt_result_cache_bytes", "Bytes the result cache holds: answers and remembered "
                                 "tokens (models with --result-cache-mb)", labels=["model"])
        bound = GaugeMetricFamily("encoderrt_result_cache_limit_bytes", "The result cache's bound (--result-cache-mb)",
                                  labels=["model"])
        for served in self._models.models():
            stats = served.engine.stats.snapshot()
            queue.add_metric([served.name], stats["queue_depth"])
            efficiency.add_metric([served.name], stats["padding_efficiency"])
            batches.add_metric([served.name], stats["batches"])
            rows.add_metric([served.name], stats["batch_rows"])
            tokens.add_metric([served.name, "real"], stats["real_tokens"])
            tokens.add_metric([served.name, "padded"], stats["padded_tokens"])
            processed.add_metric([served.name], stats["real_tokens"])
            items.add_metric([served.name], stats["items"])
            cancelled.add_metric([served.name], stats["cancelled_items"])
            cached.add_metric([served.name], stats["cached_items"])
            if served.engine.info.result_cache_bytes:
                held.add_metric([served.name], served.engine.result_cache_held())
                bound.add_metric([served.name], served.engine.info.result_cache_bytes)
        yield from (queue, efficiency, batches, rows, tokens, processed, items, cancelled, cached, held, bound)


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
