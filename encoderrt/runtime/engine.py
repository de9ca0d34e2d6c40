"""`Engine`: the public Python API over one compiled artifact (embed / score / rerank / classify).

The engine tokenises in the caller's thread (the fast tokenizer releases the GIL; async callers
tokenise large requests in the default executor and small ones on the loop), hands rows to the scheduler's batching loop and shapes the
rows that come back. It holds no HTTP and no torch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from encoderrt.runtime.backends import BackendOptions, load_backend
from encoderrt.runtime.calibration import Calibration, calibrate
from encoderrt.runtime.chunking import chunk_rows, merge_chunks
from encoderrt.runtime.config import EngineConfig
from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.manifest import Manifest, read_manifest
from encoderrt.runtime.postprocess import ACTIVATIONS, check_dimensions, cosine_pairs, shape_embeddings, softmax, sparse_rows
from encoderrt.runtime.prompts import default_prompt, resolve_prompt, with_prompt
from encoderrt.runtime.requests import (
    Classification,
    ClassifyRequest,
    Completion,
    EmbedRequest,
    RerankRequest,
    Request,
    ScoreRequest,
    SparseEmbedRequest,
    TextOrTexts,
    Truncation,
    as_texts,
    pair_texts,
)
from encoderrt.runtime.scheduler import Completed, Scheduler
from encoderrt.runtime.stats import EngineStats, Timings
from encoderrt.runtime.tokenizer import TOKENIZER_FILE, TextTokenizer, Tokens


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


@dataclass(frozen=True)
class _Plan:
    """Rows to run for one request, and how to turn their outputs into the answer."""

    rows: list[Tokens]
    finish: Callable[[np.ndarray], Any]


class Engine:
    def __init__(self, manifest: Manifest, artifact_dir: Path, config: EngineConfig):
        """Use `Engine.load`."""
        self.manifest = manifest
        self.stats = EngineStats()
        self._tokenizer = TextTokenizer(artifact_dir / TOKENIZER_FILE, manifest.max_length, manifest.pad_token_id, manifest.inputs)
        threads = BackendOptions(config.intra_op_threads).resolved_threads()
        per_session = BackendOptions(max(1, threads // config.sessions))
        backends = [load_backend(manifest, artifact_dir, per_session) for _ in range(config.sessions)]
        calibration: Calibration | None = None
        budget, limit = config.max_batch_tokens, backends[0].max_batch_tokens
        if budget is not None and limit is not None and budget > limit:
            raise ValueError(f"max_batch_tokens {budget} is more than this engine was built for ({limit}); "
                             f"choose at most {limit}, or recompile with --max-batch-tokens {budget}")
        if budget is None:
            calibration = calibrate(backends[0], self._tokenizer.pad, manifest.max_length, manifest.shape.vocab_size,
                                    config.calibration_latency_ms)
            budget = calibration.max_batch_tokens
        self._default_prompt_name = default_prompt(manifest, config.default_prompt_name)
        self._chunk_long_inputs = config.long_inputs == "chunk"
        self._scheduler = Scheduler(backends, self._tokenizer.pad, budget, config.max_wait_ms, config.max_queue_items, self.stats)
        self.info = EngineInfo(
            name=str(manifest.source.get("name") or artifact_dir.name),
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
            parallel_runs=sum(b.parallel_runs for b in backends),
            calibration=calibration.measurements if calibration else (),
        )

    @classmethod
    def load(cls, artifact_dir: str | Path, config: EngineConfig | None = None, **settings: Any) -> "Engine":
        """Load an artifact (manifest schema and file hashes are checked); `settings` override EngineConfig fields."""
        folder = Path(artifact_dir)
        manifest = read_manifest(folder)
        return cls(manifest, folder, replace(config or EngineConfig(), **settings))

    # -- public verbs -------------------------------------------------------------------------

    def embed(self, texts: TextOrTexts, normalize: bool | None = None, dimensions: int | None = None, truncate: Truncation = True,
              prompt_name: str | None = None, prompt: str | None = None) -> np.ndarray:
        """As SentenceTransformer.encode: the model's default prompt applies unless prompt_name or prompt says otherwise."""
        return self.run(EmbedRequest(as_texts(texts, "texts"), normalize, dimensions, truncate, prompt_name=prompt_name,
                                     prompt=prompt)).value

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
        tokenizer, cut = self._tokenizer_for(truncate)
        if text_pair is None:
            return tokenizer.encode([text], cut, check_length=False)[0].ids
        return tokenizer.encode_pairs([text], [text_pair], cut)[0].ids

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
        plan = self._plan(request)
        tokenized = time.perf_counter()
        completed = self._scheduler.submit(plan.rows).result()
        return self._complete(plan, completed, tokenized - start)

    async def arun(self, request: Request) -> Completion:
        start = time.perf_counter()
        if _is_small(request):  # a thread hop costs more than tokenising a few short texts
            plan = self._plan(request)
        else:
            plan = await asyncio.get_running_loop().run_in_executor(None, self._plan, request)
        tokenized = time.perf_counter()
        # cancelling the awaiting task cancels the Future, and the scheduler drops its rows
        completed = await asyncio.wrap_future(self._scheduler.submit(plan.rows))
        return self._complete(plan, completed, tokenized - start)

    def _complete(self, plan: _Plan, completed: Completed, tokenize_seconds: float) -> Completion:
        outputs = np.stack(completed.outputs) if completed.outputs else np.empty((0, self.manifest.shape.output_dim), np.float32)
        timings = Timings(tokenize_seconds, completed.queue_seconds, completed.inference_seconds)
        self.stats.add(requests=1, tokenize_seconds=timings.tokenize, queue_seconds=timings.queue, inference_seconds=timings.inference)
        return Completion(plan.finish(outputs), sum(len(r.ids) for r in plan.rows), timings)

    # -- planning: request -> rows + finish ---------------------------------------------------

    def _plan(self, request: Request) -> _Plan:
        if isinstance(request, EmbedRequest):
            return self._plan_embed(request)
        if isinstance(request, ScoreRequest):
            return self._plan_score(*pair_texts(request.text_1, request.text_2), request.truncate, request.activation)
        if isinstance(request, RerankRequest):
            return self._plan_rerank(request)
        if isinstance(request, ClassifyRequest):
            return self._plan_classify(request)
        if isinstance(request, SparseEmbedRequest):
            self._require("embed_sparse", "sparse")
            tokenizer, cut = self._tokenizer_for(request.truncate)
            sparse_rows(np.zeros((0, 1)), request.top_k)  # a bad top_k fails before anything runs
            return _Plan(tokenizer.encode(as_texts(request.texts, "texts"), cut), lambda out: sparse_rows(out, request.top_k))
        raise TypeError(f"not an engine request: {type(request).__name__}")

    def _tokenizer_for(self, truncate: Truncation) -> tuple[TextTokenizer, bool]:
        """The tokenizer for a request's truncation rule, and whether it truncates."""
        if isinstance(truncate, bool):
            return self._tokenizer, truncate
        limit = self.manifest.max_length
        if not isinstance(truncate, int) or not 2 <= truncate <= limit:
            raise InvalidRequest(f"truncation length must be an integer from 2 to {limit}, the model's limit; got {truncate!r}")
        return self._tokenizer.limited(truncate), True

    def _require(self, verb: str, *tasks: str) -> None:
        if self.manifest.task not in tasks:
            hint = {"embed": "use embed", "score": "use score or rerank", "classify": "use classify",
                    "sparse": "use embed_sparse"}[self.manifest.task]
            raise InvalidRequest(f"{verb} is not available for this {self.manifest.task} model ({self.info.name}); {hint}")

    def _plan_embed(self, request: EmbedRequest) -> _Plan:
        self._require("embed", "embed")
        check_dimensions(request.dimensions, self.manifest.shape.output_dim)
        normalize = self.manifest.normalize if request.normalize is None else request.normalize
        tokenizer, cut = self._tokenizer_for(request.truncate)
        prefix = resolve_prompt(self.manifest.prompts, self._default_prompt_name, request.prompt_name, request.prompt)
        if request.token_ids is not None:
            if request.texts:
                raise InvalidRequest("give texts or token ids, not both")
            if request.prompt_name is not None or request.prompt:
                raise InvalidRequest("a prompt applies to texts, not to token ids")
            rows = tokenizer.from_ids(request.token_ids, self.manifest.shape.vocab_size, cut)
        elif self._chunk_long_inputs and isinstance(request.truncate, bool):  # a per-request length still cuts
            rows, counts = chunk_rows(self._tokenizer, with_prompt(as_texts(request.texts, "texts"), prefix))
            return _Plan(rows, lambda outputs: shape_embeddings(merge_chunks(outputs, rows, counts), normalize,
                                                                request.dimensions))
        else:
            rows = tokenizer.encode(with_prompt(as_texts(request.texts, "texts"), prefix), cut)
        return _Plan(rows, lambda outputs: shape_embeddings(outputs, normalize, request.dimensions))

    def _plan_score(self, firsts: list[str], seconds: list[str], truncate: Truncation, activation: bool) -> _Plan:
        self._require("score", "score", "embed")
        tokenizer, cut = self._tokenizer_for(truncate)
        if self.manifest.task == "embed":
            # an embedding model scores by cosine similarity; each distinct text is embedded once
            unique = list(dict.fromkeys(firsts + seconds))
            position = {text: i for i, text in enumerate(unique)}
            left = [position[t] for t in firsts]
            right = [position[t] for t in seconds]
            prefix = resolve_prompt(self.manifest.prompts, self._default_prompt_name, None, None)
            rows = tokenizer.encode(with_prompt(unique, prefix), cut)  # as encode() would embed them
            return _Plan(rows, lambda outputs: cosine_pairs(outputs[left], outputs[right]).tolist() if left else [])
        rows = tokenizer.encode_pairs(firsts, seconds, cut)
        apply = ACTIVATIONS[self.manifest.activation] if activation else ACTIVATIONS["identity"]
        return _Plan(rows, lambda outputs: apply(outputs[:, 0]).astype(float).tolist())

    def _plan_rerank(self, request: RerankRequest) -> _Plan:
        if not isinstance(request.query, str):
            raise InvalidRequest(f"query must be a string, got {type(request.query).__name__}")
        documents = as_texts(request.documents, "documents") if not isinstance(request.documents, str) else None
        if documents is None:
            raise InvalidRequest("documents must be a list of strings")
        top_n = request.top_n
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
            raise InvalidRequest(f"top_n must be a positive integer, got {top_n!r}")
        plan = self._plan_score([request.query] * len(documents), documents, request.truncate, request.activation)

        def ranked(outputs: np.ndarray) -> list[tuple[int, float]]:
            scores = plan.finish(outputs)
            order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
            return [(i, scores[i]) for i in order[:top_n]]

        return _Plan(plan.rows, ranked)

    def _plan_classify(self, request: ClassifyRequest) -> _Plan:
        self._require("classify", "classify", "score")
        labels = self.manifest.labels
        tokenizer, cut = self._tokenizer_for(request.truncate)
        rows = tokenizer.encode(as_texts(request.texts, "texts"), cut)

        def classified(outputs: np.ndarray) -> list[Classification]:
            probs = ACTIVATIONS[self.manifest.activation](outputs) if self.manifest.task == "score" else softmax(outputs)
            return [
                Classification(labels[int(np.argmax(p))], p.astype(float).tolist(), row.astype(float).tolist())
                for p, row in zip(probs, outputs)
            ]

        return _Plan(rows, classified)

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
