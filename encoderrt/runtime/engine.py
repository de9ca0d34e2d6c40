"""`Engine`: the public Python API over one compiled artifact (embed / embed_sparse / score / rerank / classify).

The engine plans a request in the caller's thread (runtime/planner.py; the fast tokenizer releases the
GIL; async callers plan large requests in the default executor and small ones on the loop), hands the
rows to the scheduler's batching loop and finishes the rows that come back. It holds no HTTP and no torch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from encoderrt.runtime.admission import Admission
from encoderrt.runtime.backends import BackendOptions, load_backend
from encoderrt.runtime.calibration import calibrate, check_graph, measure_budget
from encoderrt.runtime.config import EngineConfig
from encoderrt.runtime.manifest import Manifest, read_manifest
from encoderrt.runtime.planner import Plan, Planner
from encoderrt.runtime.prompts import default_prompt
from encoderrt.runtime.quantization import EmbeddingQuantizer, Precision
from encoderrt.runtime.requests import (
    Classification,
    ClassifyRequest,
    Completion,
    EmbedRequest,
    Request,
    RerankRequest,
    ScoreRequest,
    SparseEmbedRequest,
    TextOrTexts,
    TokenEmbedRequest,
    Truncation,
    as_texts,
)
from encoderrt.runtime.scheduler import Completed, Scheduler
from encoderrt.runtime.stats import EngineStats, Timings
from encoderrt.runtime.tokenizer import TOKENIZER_FILE, TextTokenizer


@dataclass(frozen=True)
class EngineInfo:
    """Model facts from the manifest, plus the batching settings in force."""

    name: str
    task: str
    architecture: str
    max_length: int
    dimensions: int
    pooling: str | None
    normalize: bool
    activation: str
    labels: tuple[str, ...]
    precision: str
    target: str
    execution: str
    """What runs the graph: runtime, precision in force (a bf16 artifact runs f32 on a CPU without bf16), streams."""
    max_batch_tokens: int
    sessions: int
    parallel_runs: int
    """Batches in flight at once: sessions x the backend's streams."""
    calibration: tuple[tuple[int, float, float], ...] = ()


SMALL_REQUEST_CHARS = 2048
"""Requests up to this many characters are tokenised on the event loop (tens of microseconds)."""


def _is_small(request: Request) -> bool:
    if isinstance(request, EmbedRequest):
        texts: Sequence[str] = request.texts
    elif isinstance(request, ScoreRequest):
        texts = [*([request.text_1] if isinstance(request.text_1, str) else request.text_1),
                 *([request.text_2] if isinstance(request.text_2, str) else request.text_2)]
    elif isinstance(request, RerankRequest):
        texts = [request.query, *request.documents]
    else:
        texts = request.texts
    if len(texts) > 64:
        return False
    return sum(len(t) for t in texts if isinstance(t, str)) <= SMALL_REQUEST_CHARS


class Engine:
    def __init__(self, manifest: Manifest, artifact_dir: Path, config: EngineConfig):
        """Use `Engine.load`."""
        self.manifest = manifest
        self.stats = EngineStats()
        self._tokenizer = TextTokenizer(artifact_dir / TOKENIZER_FILE, manifest.max_length, manifest.pad_token_id, manifest.inputs)
        threads = BackendOptions(config.intra_op_threads).resolved_threads()
        per_session = BackendOptions(max(1, threads // config.sessions))
        backends = [load_backend(manifest, artifact_dir, per_session) for _ in range(config.sessions)]
        check_graph(backends[0], self._tokenizer.pad, manifest.max_length, manifest.shape.output_dim, manifest.shape.vocab_size)
        budget, limit = config.max_batch_tokens, backends[0].max_batch_tokens
        if budget is not None and limit is not None and budget > limit:
            raise ValueError(f"max_batch_tokens {budget} is more than this engine was built for ({limit}); "
                             f"choose at most {limit}, or recompile with --max-batch-tokens {budget}")
        if budget is None:
            calibration = calibrate(backends[0], self._tokenizer.pad, manifest.max_length, manifest.shape.vocab_size,
                                    config.calibration_latency_ms)
            budget = calibration.max_batch_tokens
        else:
            calibration = measure_budget(backends[0], self._tokenizer.pad, budget, manifest.max_length,
                                         manifest.shape.vocab_size)
        workers = sum(b.parallel_runs for b in backends)
        admission = Admission(config.max_queue_items, config.max_queue_seconds, budget, calibration.tokens_per_second)
        self._scheduler = Scheduler(backends, self._tokenizer.pad, budget, config.max_wait_ms, admission, self.stats)
        name = str(manifest.source.get("name") or artifact_dir.name)
        self._planner = Planner(manifest, self._tokenizer, name, default_prompt(manifest, config.default_prompt_name),
                                config.long_inputs == "chunk", config.max_token_embeddings)
        self.quantizer = EmbeddingQuantizer(lambda texts, normalize, dimensions: self.embed(texts, normalize, dimensions))
        """int8 / uint8 / binary / ubinary embeddings, int8 and uint8 by this model's calibrated ranges."""
        self.info = EngineInfo(
            name=name,
            task=manifest.task,
            architecture=manifest.architecture,
            max_length=manifest.max_length,
            dimensions=manifest.shape.output_dim,
            pooling=manifest.pooling,
            normalize=manifest.normalize,
            activation=manifest.activation,
            labels=manifest.labels,
            precision=manifest.precision,
            target=manifest.target,
            execution=backends[0].execution,
            max_batch_tokens=budget,
            sessions=config.sessions,
            parallel_runs=workers,
            calibration=calibration.measurements,
        )

    @classmethod
    def load(cls, artifact_dir: str | Path, config: EngineConfig | None = None, **settings: Any) -> "Engine":
        """Load an artifact (manifest schema and file hashes are checked); `settings` override EngineConfig fields."""
        folder = Path(artifact_dir)
        manifest = read_manifest(folder)
        return cls(manifest, folder, replace(config or EngineConfig(), **settings))

    # -- public verbs -------------------------------------------------------------------------

    def embed(self, texts: TextOrTexts, normalize: bool | None = None, dimensions: int | None = None, truncate: Truncation = True,
              prompt_name: str | None = None, prompt: str | None = None, precision: Precision = "float32") -> np.ndarray:
        """As SentenceTransformer.encode: the model's default prompt applies unless prompt_name or prompt says otherwise;
        precision int8 / uint8 / binary / ubinary quantises as runtime/quantization.py says."""
        vectors = self.run(EmbedRequest(as_texts(texts, "texts"), normalize, dimensions, truncate, prompt_name=prompt_name,
                                        prompt=prompt)).value
        return vectors if precision == "float32" else self.quantizer.quantize(vectors, precision, normalize, dimensions)

    def embed_tokens(self, texts: TextOrTexts, truncate: Truncation = True, prompt_name: str | None = None,
                     prompt: str | None = None) -> list[np.ndarray]:
        """Every token's final hidden state, one [tokens, hidden] array per text, as
        SentenceTransformer.encode(output_value="token_embeddings") returns them (TEI's /embed_all)."""
        return self.run(TokenEmbedRequest(as_texts(texts, "texts"), truncate, prompt_name, prompt)).value

    def embed_sparse(self, texts: TextOrTexts, top_k: int | None = None, truncate: Truncation = True) -> list[list[tuple[int, float]]]:
        """A sparse (SPLADE) model's vectors as (token id, weight) pairs above zero, heaviest first."""
        return self.run(SparseEmbedRequest(as_texts(texts, "texts"), top_k, truncate)).value

    def score(self, text_1: TextOrTexts, text_2: TextOrTexts, truncate: Truncation = True, activation: bool = True) -> list[float]:
        return self.run(ScoreRequest(text_1, text_2, truncate, activation)).value

    def rerank(self, query: str, documents: Sequence[str], top_n: int | None = None, truncate: Truncation = True,
               activation: bool = True) -> list[tuple[int, float]]:
        return self.run(RerankRequest(query, documents, top_n, truncate, activation)).value

    def classify(self, texts: TextOrTexts, truncate: Truncation = True) -> list[Classification]:
        return self.run(ClassifyRequest(as_texts(texts, "texts"), truncate)).value

    async def aembed(self, texts: TextOrTexts, normalize: bool | None = None, dimensions: int | None = None,
                     truncate: Truncation = True, prompt_name: str | None = None, prompt: str | None = None) -> np.ndarray:
        return (await self.arun(EmbedRequest(as_texts(texts, "texts"), normalize, dimensions, truncate, prompt_name=prompt_name,
                                             prompt=prompt))).value

    async def ascore(self, text_1: TextOrTexts, text_2: TextOrTexts, truncate: Truncation = True, activation: bool = True) -> list[float]:
        return (await self.arun(ScoreRequest(text_1, text_2, truncate, activation))).value

    async def arerank(self, query: str, documents: Sequence[str], top_n: int | None = None, truncate: Truncation = True,
                      activation: bool = True) -> list[tuple[int, float]]:
        return (await self.arun(RerankRequest(query, documents, top_n, truncate, activation))).value

    async def aclassify(self, texts: TextOrTexts, truncate: Truncation = True) -> list[Classification]:
        return (await self.arun(ClassifyRequest(as_texts(texts, "texts"), truncate))).value

    def tokenize(self, text: str, text_pair: str | None = None, truncate: Truncation = True) -> list[int]:
        """Token ids with special tokens; truncate=False returns every token, however long."""
        tokenizer, cut = self._planner.tokenizer_for(truncate)
        if text_pair is None:
            return tokenizer.encode([text], cut, check_length=False)[0].ids
        return tokenizer.encode_pairs([text], [text_pair], cut)[0].ids

    def decode(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        """Texts for token ids (TEI's /decode); ids outside the vocabulary are an InvalidRequest."""
        return self._tokenizer.decode(batch, self.manifest.shape.vocab_size, skip_special_tokens)

    def count_tokens(self, texts: Sequence[str] = (), pairs: Sequence[tuple[str, str]] = ()) -> int:
        """Tokens these inputs take through the engine (truncated at the model's limit)."""
        total = sum(len(r.ids) for r in self._tokenizer.encode(list(texts))) if texts else 0
        if pairs:
            firsts, seconds = zip(*pairs)
            total += sum(len(r.ids) for r in self._tokenizer.encode_pairs(firsts, seconds))
        return total

    # -- requests with usage and timings (what the server calls) ---------------------------------

    def run(self, request: Request) -> Completion:
        start = time.perf_counter()
        plan = self._planner.plan(request)
        tokenized = time.perf_counter()
        completed = self._scheduler.submit(plan.rows, plan.token_embeddings).result()
        return self._complete(plan, completed, tokenized - start)

    async def arun(self, request: Request) -> Completion:
        start = time.perf_counter()
        if _is_small(request):  # a thread hop costs more than tokenising a few short texts
            plan = self._planner.plan(request)
        else:
            plan = await asyncio.get_running_loop().run_in_executor(None, self._planner.plan, request)
        tokenized = time.perf_counter()
        # cancelling the awaiting task cancels the Future, and the scheduler drops its rows
        completed = await asyncio.wrap_future(self._scheduler.submit(plan.rows, plan.token_embeddings))
        return self._complete(plan, completed, tokenized - start)

    def _complete(self, plan: Plan, completed: Completed, tokenize_seconds: float) -> Completion:
        if plan.token_embeddings:
            outputs: Any = completed.outputs
        elif completed.outputs:
            outputs = np.stack(completed.outputs)
        else:
            outputs = np.empty((0, self.manifest.shape.output_dim), np.float32)
        timings = Timings(tokenize_seconds, completed.queue_seconds, completed.inference_seconds)
        self.stats.add(requests=1, tokenize_seconds=timings.tokenize, queue_seconds=timings.queue, inference_seconds=timings.inference)
        return Completion(plan.finish(outputs), sum(len(r.ids) for r in plan.rows), timings)

    # -- lifecycle ------------------------------------------------------------------------------

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
