"""Reranking: documents ordered by their score against one query (Cohere's and Jina's /rerank, TEI's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.requests import Truncation, as_texts
from encoderrt.runtime.tasks.base import ModelContext, Plan, Request, check_count
from encoderrt.runtime.tasks.score import plan_pairs


@dataclass(frozen=True)
class RerankRequest(Request[list[tuple[int, float]]]):
    """(document index, score) pairs, best first (ties by index), the top_n of them if given."""

    query: str
    documents: Sequence[str]
    top_n: int | None = None
    truncate: Truncation = True
    activation: bool = True
    prompt_name: str | None = None
    """As ScoreRequest's: one of a cross-encoder's prompts."""
    prompt: str | None = None
    """As ScoreRequest's: in front of the query, or a chat-template reranker's instruction."""
    hybrid_weights: Mapping[str, float] | None = None
    """As ScoreRequest's: a hybrid (bge-m3) model's weights of its dense, sparse and colbert scores."""

    def texts_for_sizing(self) -> Sequence[object]:
        return [self.query, *self.documents]

    def plan(self, model: ModelContext) -> Plan[list[tuple[int, float]]]:
        if not isinstance(self.query, str):
            raise InvalidRequest(f"query must be a string, got {type(self.query).__name__}")
        if isinstance(self.documents, str):
            raise InvalidRequest("documents must be a list of strings")
        documents = as_texts(self.documents, "documents")
        check_count("top_n", self.top_n)
        scores = plan_pairs(model, [self.query] * len(documents), documents, self.truncate, self.activation,
                            self.prompt_name, self.prompt, self.hybrid_weights)

        def ranked(outputs: np.ndarray) -> list[tuple[int, float]]:
            return rank(scores.finish(outputs), self.top_n)

        return Plan(scores.rows, ranked, outputs=scores.outputs)


def rank(scores: Sequence[float], top_n: int | None = None) -> list[tuple[int, float]]:
    """(index, score) best first, ties by index; the top_n of them if given."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return [(i, scores[i]) for i in order[:top_n]]
