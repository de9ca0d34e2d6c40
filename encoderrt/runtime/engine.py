"""`Engine`: the public Python API over one compiled artifact (embed / embed_tokens / embed_sparse / score / rerank /
classify, each with its async twin).

Every request kind runs one way: it plans itself in the caller's thread (runtime/tasks/; the fast tokenizer
releases the GIL; async callers plan large requests in the default executor and small ones on the loop), the
rows go to the scheduler's batching loop, and the plan finishes the rows that come back. The verbs are made
from the kinds (`_verbs`), so a sync verb and its async twin are one code path. It holds no HTTP and no torch.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import numpy as np

from encoderrt.runtime.admission import Admission
from encoderrt.runtime.backends import BackendOptions, load_backend
from encoderrt.runtime.calibration import calibrate, check_graph, measure_budget, small_work_alone_from
from encoderrt.runtime.config import EngineConfig
from encoderrt.runtime.manifest import Manifest, read_manifest
from encoderrt.runtime.prompts import default_prompt
from encoderrt.runtime.quantization import EmbeddingQuantizer
from encoderrt.runtime.requests import Completion, Truncation
from encoderrt.runtime.result_cache import ResultCache
from encoderrt.runtime.scheduler import DEEP_BATCH_TOKENS, Completed, Scheduler
from encoderrt.runtime.stats import EngineStats, Timings
from encoderrt.runtime.tasks import (
    ClassifyRequest,
    EmbedRequest,
    HybridEmbedRequest,
    ModelContext,
    MultiVectorRequest,
    Plan,
    Request,
    RerankRequest,
    ScoreRequest,
    SparseEmbedRequest,
    TokenEmbedRequest,
    plan,
)
from encoderrt.runtime.tokenizer import TextTokenizer

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class EngineInfo:
    """Model facts from the manifest, plus the batching settings in force."""

    name: str
    task: str
    architecture: str
    max_length: int
    dimensions: int
    """The width of an embedding as embed returns it by default: the folder's truncate_dim, else the model's own."""
    pooling: str | None
    normalize: bool
    similarity: str
    """How an embedding model scores two texts (Manifest.similarity)."""
    activation: str
    labels: tuple[str, ...]
    precision: str
    target: str
    execution: str
    """What runs the graph: runtime, precision in force (a bf16 artifact runs f32 on a CPU without bf16), streams."""
    max_batch_tokens: int
    deep_batch_tokens: int
    """The budget while the queue is deep (EngineConfig.deep_batch_tokens): the most padded tokens a batch holds."""
    sessions: int
    parallel_runs: int
    """Batches in flight at once: sessions x the backend's streams."""
    calibration: tuple[tuple[int, float, float], ...] = ()
    result_cache_bytes: int = 0
    """The result cache's bound (EngineConfig.result_cache_mb), 0: none."""


def _deep_budget(given: int | None, budget: int, calibrated: bool, limit: int | None) -> int:
    """EngineConfig.deep_batch_tokens resolved: as given (0: the budget), else DEEP_BATCH_TOKENS for a calibrated
    budget and a given budget as it is; never below the budget, nor past the backend's limit."""
    deep = budget if given == 0 else given or (DEEP_BATCH_TOKENS if calibrated else budget)
    return max(budget, deep if limit is None else min(deep, limit))


SMALL_REQUEST_CHARS = 2048
"""Requests up to this many characters are tokenised on the event loop (tens of microseconds)."""


def _is_small(request: Request) -> bool:
    texts = request.texts_for_sizing()
    if len(texts) > 64:
        return False
    return sum(len(t) for t in texts if isinstance(t, str)) <= SMALL_REQUEST_CHARS


def _verbs(kind: Callable[P, Request[R]]) -> tuple[Callable[Concatenate["Engine", P], R],
                                                    Callable[Concatenate["Engine", P], Awaitable[R]]]:
    """A request kind's sync verb and its async twin, both taking the kind's own fields (its signature and
    docstring are theirs): `engine.embed(texts, ...)` is `engine.run(EmbedRequest(texts, ...)).value`."""

    def sync(engine: "Engine", /, *args: P.args, **kwargs: P.kwargs) -> R:
        return engine.run(kind(*args, **kwargs)).value

    async def asynchronous(engine: "Engine", /, *args: P.args, **kwargs: P.kwargs) -> R:
        return (await engine.arun(kind(*args, **kwargs))).value

    fields = inspect.signature(kind).parameters.values()
    for verb in (sync, asynchronous):
        verb.__doc__ = kind.__doc__
        verb.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY), *fields])
    return sync, asynchronous


class Engine:
    def __init__(self, manifest: Manifest, artifact_dir: Path, config: EngineConfig):
        """Use `Engine.load`."""
        self.manifest = manifest
        self.artifact_dir = artifact_dir
        self.stats = EngineStats()
        cache_bytes = int(config.result_cache_mb * 2**20)
        cache = ResultCache(cache_bytes) if cache_bytes else None
        self._tokenizer = TextTokenizer.for_artifact(manifest, artifact_dir, memo=cache)
        if config.long_inputs == "chunk" and manifest.text_messages:
            raise ValueError("long_inputs 'chunk' is not available for this model: it reads each text inside its chat "
                             "template, which a chunk would not hold; leave long inputs truncated")
        threads = BackendOptions(config.intra_op_threads).resolved_threads()
        per_session = BackendOptions(max(1, threads // config.sessions), lone_runs=config.lone_runs)
        backends = [load_backend(manifest, artifact_dir, per_session) for _ in range(config.sessions)]
        check_graph(backends[0], self._tokenizer.pad, manifest.max_length, manifest.shape.output_dim, manifest.shape.vocab_size)
        budget, limit = config.max_batch_tokens, backends[0].max_batch_tokens
        for name, given in (("max_batch_tokens", budget), ("deep_batch_tokens", config.deep_batch_tokens)):
            if given and limit is not None and given > limit:
                raise ValueError(f"{name} {given} is more than this engine was built for ({limit}); "
                                 f"choose at most {limit}, or recompile with --max-batch-tokens {given}")
        if budget is None:
            calibration = calibrate(backends[0], self._tokenizer.pad, manifest.max_length, manifest.shape.vocab_size,
                                    config.calibration_latency_ms, config.calibrate_for)
            budget = calibration.max_batch_tokens
        else:
            calibration = measure_budget(backends[0], self._tokenizer.pad, budget, manifest.max_length,
                                         manifest.shape.vocab_size)
        workers = sum(b.parallel_runs for b in backends)
        admission = Admission(config.max_queue_items, config.max_queue_seconds, budget, calibration.tokens_per_second)
        small_alone_from = small_work_alone_from(backends[0], self._tokenizer.pad, manifest.shape.vocab_size)
        deep_budget = _deep_budget(config.deep_batch_tokens, budget, config.max_batch_tokens is None, limit)
        self._scheduler = Scheduler(backends, self._tokenizer.pad, budget, config.max_wait_ms, admission, self.stats,
                                    small_alone_from, deep_budget, cache)
        name = str(manifest.source.get("name") or artifact_dir.name)
        self.quantizer = EmbeddingQuantizer(lambda texts, normalize, dimensions: self.embed(texts, normalize, dimensions))
        """int8 / uint8 / binary / ubinary embeddings, int8 and uint8 by this model's calibrated ranges."""
        static = manifest.static_queries
        self._model = ModelContext(manifest, self._tokenizer, name, default_prompt(manifest, config.default_prompt_name),
                                   config.long_inputs == "chunk", config.max_token_embeddings, self.quantizer,
                                   np.load(artifact_dir / static.weights_file, allow_pickle=False) if static else None)
        self.info = EngineInfo(
            name=name,
            task=manifest.task,
            architecture=manifest.architecture,
            max_length=manifest.max_length,
            dimensions=manifest.truncate_dim or manifest.shape.output_dim,
            pooling=manifest.pooling,
            normalize=manifest.normalize,
            similarity=manifest.similarity,
            activation=manifest.activation,
            labels=manifest.labels,
            precision=manifest.precision,
            target=manifest.target,
            execution=backends[0].execution,
            max_batch_tokens=budget,
            deep_batch_tokens=deep_budget,
            sessions=config.sessions,
            parallel_runs=workers,
            calibration=calibration.measurements,
            result_cache_bytes=cache_bytes,
        )
        self._cache = cache

    @classmethod
    def load(cls, artifact_dir: str | Path, config: EngineConfig | None = None, **settings: Any) -> "Engine":
        """Load an artifact (manifest schema and file hashes are checked); `settings` override EngineConfig fields."""
        folder = Path(artifact_dir)
        manifest = read_manifest(folder)
        return cls(manifest, folder, replace(config or EngineConfig(), **settings))

    # -- public verbs: one per request kind, each with its async twin ------------------------------------

    embed, aembed = _verbs(EmbedRequest)
    embed_tokens, aembed_tokens = _verbs(TokenEmbedRequest)
    embed_sparse, aembed_sparse = _verbs(SparseEmbedRequest)
    embed_multi_vector, aembed_multi_vector = _verbs(MultiVectorRequest)
    embed_hybrid, aembed_hybrid = _verbs(HybridEmbedRequest)
    score, ascore = _verbs(ScoreRequest)
    rerank, arerank = _verbs(RerankRequest)
    classify, aclassify = _verbs(ClassifyRequest)

    def tokenize(self, text: str, text_pair: str | None = None, truncate: Truncation = True) -> list[int]:
        """Token ids with special tokens; truncate=False returns every token, however long."""
        tokenizer, cut = self._model.tokenizer_for(truncate)
        if text_pair is None:
            # the caller's own list: the memo keeps the one it returns
            return list(tokenizer.encode([text], cut, check_length=False)[0].ids)
        return tokenizer.encode_pairs([text], [text_pair], cut)[0].ids

    def decode(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        """Texts for token ids (TEI's /decode); ids outside the vocabulary are an InvalidRequest."""
        return self._tokenizer.decode(batch, self.manifest.shape.vocab_size, skip_special_tokens)

    def count_tokens(self, texts: Sequence[str] = (), pairs: Sequence[tuple[str, str]] = ()) -> int:
        """Tokens these inputs take through the engine (truncated at the model's limit); a multi-vector model runs
        a pair's query and document apart, each distinct one once."""
        if pairs and self.manifest.task == "multi_vector":
            firsts, seconds = zip(*pairs)
            texts, pairs = [*texts, *dict.fromkeys(firsts), *dict.fromkeys(seconds)], ()
        elif pairs and self.manifest.task == "hybrid":  # each distinct text once, whichever side
            texts, pairs = [*texts, *dict.fromkeys(text for pair in pairs for text in pair)], ()
        total = sum(len(r.ids) for r in self._tokenizer.encode(list(texts))) if texts else 0
        if pairs:
            firsts, seconds = zip(*pairs)
            total += sum(len(r.ids) for r in self._tokenizer.encode_pairs(firsts, seconds))
        return total

    # -- requests with usage and timings (what the server calls) ---------------------------------

    def run(self, request: Request[R]) -> Completion:
        start = time.perf_counter()
        planned = plan(self._model, request)
        tokenized = time.perf_counter()
        completed = self._scheduler.submit(planned.rows, planned.outputs).result()
        return self._complete(planned, completed, tokenized - start)

    async def arun(self, request: Request[R]) -> Completion:
        start = time.perf_counter()
        loop = asyncio.get_running_loop()
        if _is_small(request):  # a thread hop costs more than tokenising a few short texts
            planned = plan(self._model, request)
        else:
            planned = await loop.run_in_executor(None, plan, self._model, request)
        tokenized = time.perf_counter()
        # cancelling the awaiting task cancels the Future, and the scheduler drops its rows
        completed = await self._scheduler.submit_on_loop(planned.rows, planned.outputs, loop)
        if planned.blocking_finish:
            return await loop.run_in_executor(None, self._complete, planned, completed, tokenized - start)
        return self._complete(planned, completed, tokenized - start)

    def _complete(self, planned: Plan, completed: Completed, tokenize_seconds: float) -> Completion:
        if planned.outputs:
            outputs: Any = completed.outputs
        elif len(completed.outputs) == 1:  # np.stack's checks cost more than the copy of one row
            outputs = completed.outputs[0][np.newaxis].copy()
        elif completed.outputs:
            outputs = np.stack(completed.outputs)
        else:
            outputs = np.empty((0, self.manifest.shape.output_dim), np.float32)
        timings = Timings(tokenize_seconds, completed.queue_seconds, completed.inference_seconds)
        self.stats.add(requests=1, tokenize_seconds=timings.tokenize, queue_seconds=timings.queue, inference_seconds=timings.inference)
        row_tokens = tuple(len(r.ids) for r in planned.rows) if planned.read_tokens is None else planned.read_tokens
        return Completion(planned.finish(outputs), sum(row_tokens), timings, row_tokens)

    def backlogged(self) -> bool:
        """Whether a deep batch's worth of work already waits (EngineInfo.deep_batch_tokens): what is submitted now
        waits for at least one batch, so a caller gains nothing by sending it alone rather than with what follows."""
        return self._scheduler.deep

    def result_cache_held(self) -> int:
        """Bytes the result cache holds now (answers and remembered tokens, as it counts them), 0 without one: beside
        EngineInfo.result_cache_bytes, whether the bound is reached."""
        return self._cache.nbytes if self._cache is not None else 0

    # -- lifecycle ------------------------------------------------------------------------------

    def stopped_workers(self) -> list[str]:
        """Batching workers that ended while the engine is open (health checks report them); none in a sound one."""
        return self._scheduler.stopped_workers()

    def close(self) -> None:
        self._scheduler.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> "Engine":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()
