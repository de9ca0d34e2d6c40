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
        model.require("embed_sparse", "sparse")
        tokenizer, cut = model.tokenizer_for(self.truncate)
        check_count("top_k", self.top_k)
        return Plan(tokenizer.encode(as_texts(self.texts, "texts"), cut), lambda out: sparse_rows(out, self.top_k))
