"""Engine settings. Defaults suit a small CPU box; every field can be overridden at load."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class EngineConfig:
    max_batch_tokens: int | None = None
    """Padded tokens (rows x longest row) per backend run; None: calibrate at load."""
    max_wait_ms: float = 2.0
    """How long a shallow queue waits for company before running a small batch."""
    max_queue_items: int = 8192
    """Rows waiting at most; past it new work fails at once with Overloaded."""
    max_queue_seconds: float = 5.0
    """Work waiting at most, in seconds at the measured throughput; past it new work fails at once with Overloaded
    (runtime/admission.py). Bounds latency under overload, and the time to recover after it."""
    sessions: int = 1
    """Parallel backend instances, each with cores / sessions threads (1 measured best on 2 cores)."""
    intra_op_threads: int = 0
    """Threads for all sessions together; 0: every core the process may use."""
    calibration_latency_ms: float = 150.0
    """Calibration picks the budget with the best throughput whose batch stays under this latency."""
    long_inputs: Literal["truncate", "chunk"] = "truncate"
    """Embedding inputs past the model's limit: cut at it, or embedded in chunks and merged (runtime/chunking.py)."""
    default_prompt_name: str | None = None
    """Overrides the folder's default prompt (TEI's --default-prompt-name); "" serves without one."""
    max_token_embeddings: int = 8192
    """Token vectors one embed_tokens request (TEI's /embed_all) may return: each is hidden-size floats, so 8,192
    tokens of a 384-wide model are 12.6 MB as float32 and some 60 MB as JSON."""

    def __post_init__(self) -> None:
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be positive, got {self.max_batch_tokens}")
        if self.max_queue_items < 1:
            raise ValueError(f"max_queue_items must be positive, got {self.max_queue_items}")
        if not self.max_queue_seconds > 0:
            raise ValueError(f"max_queue_seconds must be above 0, got {self.max_queue_seconds}")
        if self.sessions < 1:
            raise ValueError(f"sessions must be positive, got {self.sessions}")
        if self.long_inputs not in ("truncate", "chunk"):
            raise ValueError(f"long_inputs must be 'truncate' or 'chunk', got {self.long_inputs!r}")
        if self.max_token_embeddings < 1:
            raise ValueError(f"max_token_embeddings must be positive, got {self.max_token_embeddings}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must not be negative, got {self.max_wait_ms}")
