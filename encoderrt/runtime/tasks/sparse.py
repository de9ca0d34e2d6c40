"""Sparse (SPLADE) embeddings: per text, the (token id, weight) pairs above zero, heaviest first, as SparseEncoder's
encode, encode_query and encode_document return them: the side's prompt in front, the folder's max_active_dims kept.

An inference-free sparse model (Manifest.static_queries) embeds its documents through the graph and its queries
from fixed weights, one per token the query holds; a request names its side, or takes the model's default one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from encoderrt.runtime.errors import InputTooLong, InvalidRequest
from encoderrt.runtime.manifest import SIDES, Side
from encoderrt.runtime.postprocess import sparse_rows
from encoderrt.runtime.prompts import side_prompt_name, with_prompt
from encoderrt.runtime.requests import NoLongerThan, TextOrTexts, Truncation, as_texts
from encoderrt.runtime.tasks.base import ModelContext, Plan, Request, check_count


@dataclass(frozen=True)
class SparseEmbedRequest(Request[list[list[tuple[int, float]]]]):
    """A sparse (SPLADE) model's vectors as (token id, weight) pairs above zero, heaviest first."""

    texts: TextOrTexts
    top_k: int | None = None
    """Keep the k heaviest of each; None: the model's max_active_dims, else all."""
    truncate: Truncation = True
    side: Side | None = None
    """"query" or "document", as encode_query / encode_document: the side's prompt, and an inference-free model's
    route; None: as encode (the default prompt, the model's default route)."""
    prompt_name: str | None = None
    """One of the model's prompts; None: the side's own, else the model's default."""
    prompt: str | None = None
    """A prompt given verbatim, over prompt_name ("" for none)."""
    truncation_side: str = "right"
    """Which end truncation cuts: "left" keeps a text's end."""

    def texts_for_sizing(self) -> Sequence[object]:
        return [self.texts] if isinstance(self.texts, str) else self.texts

    def plan(self, model: ModelContext) -> Plan[list[list[tuple[int, float]]]]:
        model.require("embed_sparse", "sparse", "hybrid")
        if self.side is not None and self.side not in SIDES:
            raise InvalidRequest(f"side must be 'query' or 'document', got {self.side!r}")
        if model.manifest.task == "hybrid":  # bge-m3's lexical weights, in the same shape
            from encoderrt.runtime.tasks.hybrid import HybridEmbedRequest

            if self.prompt_name is not None or self.prompt or self.truncation_side != "right":
                raise InvalidRequest("a hybrid model's lexical weights take no prompt and are cut at the text's end")
            lexical = HybridEmbedRequest(self.texts, ("sparse",), self.truncate, self.top_k).plan(model)
            return Plan(lexical.rows, lambda outputs: [e.sparse for e in lexical.finish(outputs)], outputs=lexical.outputs)
        check_count("top_k", self.top_k)
        top_k = self.top_k or model.manifest.max_active_dims
        texts = as_texts(self.texts, "texts")
        prefix = model.prompt(side_prompt_name(model.manifest.prompts, self.side, self.prompt_name, self.prompt),
                              self.prompt)
        static, weights = model.manifest.static_queries, model.static_query_weights
        if static is not None and weights is not None and (self.side or static.default_side) == "query":
            if self.truncation_side != "right":
                raise InvalidRequest("an inference-free model's queries are cut at their end: truncation side must be "
                                     "'right'")
            return _static_queries(model, weights, static.max_length, with_prompt(texts, prefix), self.truncate, top_k)
        tokenizer, cut = model.tokenizer_for(self.truncate)
        rows = model.prompted_rows(texts, prefix, tokenizer, cut, self.truncation_side)
        return Plan(rows, lambda out: sparse_rows(out, top_k))


def _static_queries(model: ModelContext, weights: np.ndarray, limit: int | None, texts: list[str], truncate: Truncation,
                    top_k: int | None) -> Plan[list[list[tuple[int, float]]]]:
    """Queries answered from the model's `weights`, as SparseStaticEmbedding computes them: each distinct token of the
    text, without special tokens, cut at the query side's `limit` (or the request's shorter one), weighs its weight.
    No row runs; the request counts the tokens it read."""
    cuts = truncate is not False and not isinstance(truncate, NoLongerThan)
    if not isinstance(truncate, bool):
        length = truncate.tokens if isinstance(truncate, NoLongerThan) else truncate
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise InvalidRequest(f"truncation length must be a positive integer; got {length!r}")
        limit = min(limit or length, length)
    ids = model.tokenizer.words(texts)
    for index, row in enumerate(ids):
        if limit is not None and len(row) > limit and not cuts:
            raise InputTooLong(index, len(row), limit, "the query side's")
    ids = [row[:limit] for row in ids]
    rows = np.zeros((len(texts), len(weights)), np.float32)
    for index, row in enumerate(ids):
        present = np.unique(np.asarray(row, dtype=np.int64))
        rows[index, present] = weights[present]
    return Plan([], lambda _: sparse_rows(rows, top_k), read_tokens=tuple(map(len, ids)))
