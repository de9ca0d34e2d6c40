"""Planning: an engine request becomes the rows to run and the function that turns their outputs into the answer.

Everything a request means is decided here, before any row is queued: the task it needs, truncation,
prompts, chunks of long inputs, pairs; the scheduler only ever sees rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from encoderrt.runtime.chunking import chunk_rows, merge_chunks
from encoderrt.runtime.errors import InvalidRequest, ResultTooLarge
from encoderrt.runtime.manifest import TOKEN_EMBEDDINGS, Manifest
from encoderrt.runtime.postprocess import (
    ACTIVATIONS,
    check_count,
    check_dimensions,
    cosine_pairs,
    shape_embeddings,
    softmax,
    sparse_rows,
)
from encoderrt.runtime.prompts import resolve_prompt, with_prompt
from encoderrt.runtime.requests import (
    Classification,
    ClassifyRequest,
    EmbedRequest,
    NoLongerThan,
    Request,
    RerankRequest,
    ScoreRequest,
    SparseEmbedRequest,
    TokenEmbedRequest,
    Truncation,
    as_texts,
    pair_texts,
)
from encoderrt.runtime.tokenizer import POOLING_START, TextTokenizer, Tokens


@dataclass(frozen=True)
class Plan:
    """Rows to run for one request, and how to turn their outputs into the answer."""

    rows: list[Tokens]
    finish: Callable[[Any], Any]
    """Gets the rows' outputs stacked, or, for token embeddings, the list of each row's [tokens, hidden] states."""
    token_embeddings: bool = False


class Planner:
    def __init__(self, manifest: Manifest, tokenizer: TextTokenizer, name: str, default_prompt_name: str | None,
                 chunk_long_inputs: bool, max_token_embeddings: int):
        self.manifest = manifest
        self._max_token_embeddings = max_token_embeddings
        self._tokenizer = tokenizer
        self._name = name
        self._default_prompt_name = default_prompt_name
        self._chunk_long_inputs = chunk_long_inputs

    def plan(self, request: Request) -> Plan:
        """The rows for a request; a row the model cannot run is refused here, before it joins a batch."""
        plan = self._plan(request)
        limit = self.manifest.max_length
        for index, row in enumerate(plan.rows):
            if len(row.ids) > limit:
                raise InvalidRequest(f"input {index} has {len(row.ids)} tokens after truncation, more than this model's "
                                     f"limit of {limit}")
        return plan

    def _plan(self, request: Request) -> Plan:
        if isinstance(request, EmbedRequest):
            return self._plan_embed(request)
        if isinstance(request, TokenEmbedRequest):
            return self._plan_token_embed(request)
        if isinstance(request, ScoreRequest):
            return self._plan_score(*pair_texts(request.text_1, request.text_2), request.truncate, request.activation)
        if isinstance(request, RerankRequest):
            return self._plan_rerank(request)
        if isinstance(request, ClassifyRequest):
            return self._plan_classify(request)
        if isinstance(request, SparseEmbedRequest):
            self._require("embed_sparse", "sparse")
            tokenizer, cut = self.tokenizer_for(request.truncate)
            check_count("top_k", request.top_k)
            return Plan(tokenizer.encode(as_texts(request.texts, "texts"), cut), lambda out: sparse_rows(out, request.top_k))
        raise TypeError(f"not an engine request: {type(request).__name__}")

    def tokenizer_for(self, truncate: Truncation) -> tuple[TextTokenizer, bool]:
        """The tokenizer for a request's truncation rule, and whether it truncates."""
        if isinstance(truncate, bool):
            return self._tokenizer, truncate
        refuse = isinstance(truncate, NoLongerThan)
        length = truncate.tokens if refuse else truncate
        limit = self.manifest.max_length
        if isinstance(length, bool) or not isinstance(length, int) or not 2 <= length <= limit:
            raise InvalidRequest(f"truncation length must be an integer from 2 to {limit}, the model's limit; got {length!r}")
        return self._tokenizer.limited(length), not refuse

    def _require(self, verb: str, *tasks: str) -> None:
        if self.manifest.task not in tasks:
            hint = {"embed": "use embed", "score": "use score or rerank", "classify": "use classify",
                    "sparse": "use embed_sparse"}[self.manifest.task]
            raise InvalidRequest(f"{verb} is not available for this {self.manifest.task} model ({self._name}); {hint}")

    def _plan_embed(self, request: EmbedRequest) -> Plan:
        self._require("embed", "embed")
        check_dimensions(request.dimensions, self.manifest.shape.output_dim)
        normalize = self.manifest.normalize if request.normalize is None else request.normalize
        tokenizer, cut = self.tokenizer_for(request.truncate)
        prefix = resolve_prompt(self.manifest.prompts, self._default_prompt_name, request.prompt_name, request.prompt)
        if request.token_ids is not None:
            if request.texts:
                raise InvalidRequest("give texts or token ids, not both")
            if request.prompt_name is not None or request.prompt:
                raise InvalidRequest("a prompt applies to texts, not to token ids")
            rows = tokenizer.from_ids(request.token_ids, self.manifest.shape.vocab_size, cut)
        elif self._chunk_long_inputs and isinstance(request.truncate, bool) and request.truncation_side == "right":
            # a per-request length, or an explicit cut at the start, still cuts
            rows, counts = chunk_rows(self._tokenizer, with_prompt(as_texts(request.texts, "texts"), prefix))
            if start := self._excluded_prompt_tokens(prefix):  # the prompt is in each text's first chunk
                firsts = set(np.cumsum([0, *counts[:-1]]).tolist())
                rows = [row._replace(pooling_start=start) if i in firsts else row for i, row in enumerate(rows)]
            return Plan(rows, lambda outputs: shape_embeddings(merge_chunks(outputs, rows, counts), normalize,
                                                                request.dimensions))
        else:
            rows = self._pooled_after(prefix, self._prompted_rows(request.texts, prefix, tokenizer, cut, request.truncation_side))
        return Plan(rows, lambda outputs: shape_embeddings(outputs, normalize, request.dimensions))

    @staticmethod
    def _prompted_rows(texts: Sequence[str], prefix: str, tokenizer: TextTokenizer, cut: bool, side: str) -> list[Tokens]:
        """Texts with their prompt in front, tokenised, truncation cutting the `side` end."""
        if side not in ("right", "left"):
            raise InvalidRequest(f"truncation side must be 'right' or 'left', got {side!r}")
        return tokenizer.encode(with_prompt(as_texts(texts, "texts"), prefix), cut, side=side)

    def _plan_token_embed(self, request: TokenEmbedRequest) -> Plan:
        self._require("embed_all", "embed")
        if TOKEN_EMBEDDINGS not in self.manifest.outputs:
            raise InvalidRequest(f"this artifact of {self._name} has no token embeddings output (compiled for "
                                 f"{self.manifest.target}, or by an older encoderrt); recompile it for cpu or openvino")
        tokenizer, cut = self.tokenizer_for(request.truncate)
        prefix = resolve_prompt(self.manifest.prompts, self._default_prompt_name, request.prompt_name, request.prompt)
        rows = self._prompted_rows(request.texts, prefix, tokenizer, cut, request.truncation_side)
        total = sum(len(row.ids) for row in rows)
        if total > self._max_token_embeddings:
            raise ResultTooLarge(f"these inputs have {total} tokens; one request returns at most "
                                 f"{self._max_token_embeddings} token embeddings ({self.manifest.shape.hidden_size} floats "
                                 "each): send fewer or shorter texts")
        return Plan(rows, lambda states: [state.astype(np.float32, copy=False) for state in states], token_embeddings=True)

    def _excluded_prompt_tokens(self, prefix: str) -> int:
        """How many leading tokens pooling skips: the prompt's, where the model leaves its prompt out of pooling."""
        return self._tokenizer.prompt_length(prefix) if prefix and POOLING_START in self.manifest.inputs else 0

    def _pooled_after(self, prefix: str, rows: list[Tokens]) -> list[Tokens]:
        start = self._excluded_prompt_tokens(prefix)
        return [row._replace(pooling_start=start) for row in rows] if start else rows

    def _plan_score(self, firsts: list[str], seconds: list[str], truncate: Truncation, activation: bool) -> Plan:
        self._require("score", "score", "embed")
        tokenizer, cut = self.tokenizer_for(truncate)
        if self.manifest.task == "embed":
            # an embedding model scores by cosine similarity; each distinct text is embedded once
            unique = list(dict.fromkeys(firsts + seconds))
            position = {text: i for i, text in enumerate(unique)}
            left = [position[t] for t in firsts]
            right = [position[t] for t in seconds]
            prefix = resolve_prompt(self.manifest.prompts, self._default_prompt_name, None, None)
            rows = self._pooled_after(prefix, tokenizer.encode(with_prompt(unique, prefix), cut))  # as encode() would
            return Plan(rows, lambda outputs: cosine_pairs(outputs[left], outputs[right]).tolist() if left else [])
        specials = tokenizer.pair_special_tokens
        if cut and tokenizer.max_length < specials + 2:
            raise InvalidRequest(f"truncation length {tokenizer.max_length} leaves no room for a pair: its special tokens "
                                 f"alone take {specials}; choose at least {specials + 2}")
        rows = tokenizer.encode_pairs(firsts, seconds, cut)
        apply = ACTIVATIONS[self.manifest.activation] if activation else ACTIVATIONS["identity"]
        return Plan(rows, lambda outputs: apply(outputs[:, 0]).astype(float).tolist())

    def _plan_rerank(self, request: RerankRequest) -> Plan:
        if not isinstance(request.query, str):
            raise InvalidRequest(f"query must be a string, got {type(request.query).__name__}")
        documents = as_texts(request.documents, "documents") if not isinstance(request.documents, str) else None
        if documents is None:
            raise InvalidRequest("documents must be a list of strings")
        top_n = request.top_n
        check_count("top_n", top_n)
        plan = self._plan_score([request.query] * len(documents), documents, request.truncate, request.activation)

        def ranked(outputs: np.ndarray) -> list[tuple[int, float]]:
            scores = plan.finish(outputs)
            order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
            return [(i, scores[i]) for i in order[:top_n]]

        return Plan(plan.rows, ranked)

    def _plan_classify(self, request: ClassifyRequest) -> Plan:
        self._require("classify", "classify", "score")
        labels = self.manifest.labels
        tokenizer, cut = self.tokenizer_for(request.truncate)
        rows = tokenizer.encode(as_texts(request.texts, "texts"), cut)

        def classified(outputs: np.ndarray) -> list[Classification]:
            probs = ACTIVATIONS[self.manifest.activation](outputs) if self.manifest.task == "score" else softmax(outputs)
            return [
                Classification(labels[int(np.argmax(p))], p.astype(float).tolist(), row.astype(float).tolist())
                for p, row in zip(probs, outputs)
            ]

        return Plan(rows, classified)
