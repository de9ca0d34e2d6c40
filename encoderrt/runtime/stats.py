"""Counters and timings that the server exports (Prometheus) and the benchmarks read."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class Timings:
    """Where one request's time went, in seconds."""

    tokenize: float = 0.0
    queue: float = 0.0
    inference: float = 0.0

    @property
    def total(self) -> float:
        return self.tokenize + self.queue + self.inference


@dataclass
class EngineStats:
    requests: int = 0
    items: int = 0
    batches: int = 0
    batch_rows: int = 0
    real_tokens: int = 0
    """Tokens of the rows that ran (after deduplication), without padding."""
    padded_tokens: int = 0
    deduplicated_items: int = 0
    cached_items: int = 0
    """Items answered from the result cache, without running (EngineConfig.result_cache_mb)."""
    cancelled_items: int = 0
    failed_batches: int = 0
    overloaded: int = 0
    queue_depth: int = 0
    tokenize_seconds: float = 0.0
    queue_seconds: float = 0.0
    inference_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def padding_efficiency(self) -> float:
        return self.real_tokens / self.padded_tokens if self.padded_tokens else 1.0

    def add(self, **increments: float) -> None:
        with self._lock:
            for name, value in increments.items():
                setattr(self, name, getattr(self, name) + value)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            values = {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
            values["padding_efficiency"] = self.padding_efficiency
        return values
