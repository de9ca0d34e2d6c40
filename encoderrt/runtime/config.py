"""Engine settings. Defaults suit a small CPU box; every field can be overridden at load (`Engine.load(path,\n**fields)`) and is a flag of `encoderrt serve` (runtime/settings.py generates it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from encoderrt.runtime.settings import check_choices, setting


@dataclass(frozen=True)
class EngineConfig:
    max_batch_tokens: int | None = setting(
        None, "padded tokens (rows x longest row) per backend run while the queue is shallow", metavar="N",
        shown="calibrated at load")
    deep_batch_tokens: int | None = setting(
        None, "padded tokens per backend run while that many are waiting (0: never more than --max-batch-tokens)",
        metavar="N", shown="1024 over a calibrated budget; a given --max-batch-tokens")
    """The calibrated budget is the latency knee on rows of one length, and at it a batch of passages holds one or two
    of them (scheduler.DEEP_BATCH_TOKENS has the figures). A budget the user gives is theirs: it is kept."""
    max_wait_ms: float = setting(
        0.0, "how long a shallow queue waits for company before running a small batch (0: a free stream takes "
        "what is waiting at once, and batches grow by themselves while every stream is busy)", metavar="MS")
    """0 by measurement: one-query closed-loop clients of bf16 all-MiniLM-L6-v2 on OpenVINO's two streams (2-core
    Sapphire Rapids, 4 alternating rounds) got 17,440 / 16,680 / 15,000 tokens/s at 0 / 1 / 2 ms with 32 clients
    and 8,590 / 8,470 / 8,130 with 8; one client, open-loop arrivals at 300-1,500 a second and passages were
    within noise. Waiting leaves a stream idle while the clients it would wait for are those its last batch
    holds."""
    max_queue_items: int = setting(
        8192, "rows waiting per model at most; past it new work is refused at once (HTTP 429)", metavar="N",
        aliases=("--max-queue",))
    max_queue_seconds: float = setting(
        5.0, "work waiting per model at most, in seconds at the measured throughput; past it new work is refused at "
        "once (HTTP 429). Bounds latency under overload and the time to recover after it ('inf': no limit)",
        metavar="S")
    sessions: int = setting(
        1, "parallel backend instances, each with cores / sessions threads (1 measured best on 2 cores)", metavar="N")
    intra_op_threads: int = setting(
        0, "backend threads for all sessions together; 0: every core the process may use", metavar="N")
    lone_runs: bool = setting(
        True, "also load the every-core copy of the weights that runs a batch alone when it is the only work (a "
        "lone query's latency on a backend with streams); off saves that copy's memory")
    """A bulk job turns it off: its queue is deep until its last batches (Qwen3-Embedding-0.6B's bf16 artifact:
    1.06 GiB)."""
    calibration_latency_ms: float = setting(
        150.0, "calibration picks the budget with the best throughput whose batch stays under this latency",
        metavar="MS")
    calibrate_for: Literal["latency", "throughput"] = setting(
        "latency", "what the calibrated budget serves: latency takes the smallest budget within 10% of the best "
        "throughput, so requests wait less; throughput the largest within 3%, so fewer batches each pay the "
        "engine's fixed cost (bulk jobs calibrate so)")
    long_inputs: Literal["truncate", "chunk"] = setting(
        "truncate", "embedding inputs past the model's limit: cut at it, or embedded in chunks and averaged")
    result_cache_mb: float = setting(
        0.0, "memory for the answers to rows already run, least recently used forgotten first: a repeated query, or "
        "a document reranked again, is answered without running it, and a repeated short text without tokenising it "
        "(0: off)", metavar="MB")
    """Off by default: a closed-loop benchmark that repeats its texts would measure the table, not the model (the
    bench's own engines never use it), and the memory is the operator's to give. Keyed by a row's tokens, and a short
    text's tokens by the text and its truncation rule (runtime/result_cache.py)."""
    default_prompt_name: str | None = None
    """Overrides the folder's default prompt ("" serves without one); `serve` takes it per model (server/loading.py)."""
    max_token_embeddings: int = setting(
        8192, "token vectors one /embed_all request may return at most (HTTP 413 above it): each is hidden-size "
        "floats, so 8,192 tokens of a 384-wide model are 12.6 MB as float32 and some 60 MB as JSON", metavar="N")

    def __post_init__(self) -> None:
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be positive, got {self.max_batch_tokens}")
        if self.deep_batch_tokens is not None and self.deep_batch_tokens < 0:
            raise ValueError(f"deep_batch_tokens must be 0 or more, got {self.deep_batch_tokens}")
        if self.max_queue_items < 1:
            raise ValueError(f"max_queue_items must be positive, got {self.max_queue_items}")
        if not self.max_queue_seconds > 0:
            raise ValueError(f"max_queue_seconds must be above 0, got {self.max_queue_seconds}")
        if self.sessions < 1:
            raise ValueError(f"sessions must be positive, got {self.sessions}")
        check_choices(self)
        if not 0 <= self.result_cache_mb < float("inf"):
            raise ValueError(f"result_cache_mb must be 0 (off) or more, and finite, got {self.result_cache_mb}")
        if self.max_token_embeddings < 1:
            raise ValueError(f"max_token_embeddings must be positive, got {self.max_token_embeddings}")
        if not self.max_wait_ms >= 0:  # NaN too
            raise ValueError(f"max_wait_ms must not be negative, got {self.max_wait_ms}")
        if self.intra_op_threads < 0:
            raise ValueError(f"intra_op_threads must be 0 (every core) or more, got {self.intra_op_threads}")
        if not 0 < self.calibration_latency_ms < float("inf"):
            raise ValueError(f"calibration_latency_ms must be above 0 and finite, got {self.calibration_latency_ms}")
