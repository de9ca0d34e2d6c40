"""Sparse (SPLADE) embeddings: per text, the (token id, weight) pairs above zero, heaviest first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from encoderrt.runtime.postprocess import sparse_rows
from encoderrt.runtime.requests import TextOrTexts, Truncation, as_texts
from encoderrt.runtime.tasks.base import ModelContext, Plan, Request, check_count


@dataclass(frozen=True)
class SparseEmbedRequest(Request[list[list[tuple[int, float]]]]):
    """A sparse (SPLADE) model's vectors as (token id, weight) pairs above zero, heaviest first; top_k keeps the k
    heaviest of each."""

    texts: TextOrTexts
    top_k: int | None = None
    truncate: Truncation = True

    def texts_for_sizing(self) -> Sequence[object]:
        return [self.texts] if isinstance(self.texts, str) else self.texts

    def plan(self, model: ModelContext) -> Plan[list[list[tuple[int, float]]]]:
        model.require("embed_sparse", "sparse", "hybrid")
        if model.manifest.task == "hybrid":  # bge-m3's lexical weights, in the same shape
            from encoderrt.runtime.tasks.hybrid import HybridEmbedRequest

            lexical = HybridEmbedRequest(self.texts, ("sparse",), self.truncate, self.top_k).plan(model)
            return Plan(lexical.rows, lambda outputs: [e.sparse for e in lexical.finish(outputs)], outputs=lexical.outputs)
        tokenizer, cut = model.tokenizer_for(self.truncate)
        check_count("top_k", self.top_k)
        return Plan(tokenizer.encode(as_texts(self.texts, "texts"), cut), lambda out: sparse_rows(out, self.top_k))
