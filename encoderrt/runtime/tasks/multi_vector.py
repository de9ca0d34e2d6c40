"""Multi-vector (ColBERT) requests: the vectors of a text's scored tokens, as sentence-transformers'
MultiVectorEncoder.encode_query / encode_document return them, and MaxSim, the late-interaction score that
score and rerank use for such a model (runtime/tasks/score.py).

A side's rules come from the manifest (MultiVector): queries and documents have their own prompt and length;
queries shorter than the expansion length are filled with the expansion token, which the encoder does not attend
to (unless the model says so) but whose vectors are scored; the skip-list's tokens (punctuation) are dropped from
documents; where the model pools its documents' vectors (runtime/token_pooling.py), or a request asks to, they are
pooled last."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.manifest import MULTI_VECTORS, SIDES, MultiVector, Side, TokenPooling
from encoderrt.runtime.postprocess import l2_normalize
from encoderrt.runtime.prompts import side_prompt_name
from encoderrt.runtime.requests import TextOrTexts, Truncation, as_texts
from encoderrt.runtime.tasks.base import ModelContext, Plan, Request
from encoderrt.runtime.tasks.embed import check_dimensions
from encoderrt.runtime.token_pooling import for_request, pooled
from encoderrt.runtime.tokenizer import Tokens


@dataclass(frozen=True)
class MultiVectorRequest(Request[list[np.ndarray]]):
    """One [vectors, dim] array per text: a query's every token (its expansion included), a document's tokens less
    the skip-list's."""

    texts: TextOrTexts
    side: Side = "document"
    truncate: Truncation = True
    prompt_name: str | None = None
    """One of the model's prompts; None: the side's own ("query", or "document" / "passage" / "corpus")."""
    prompt: str | None = None
    """A prompt given verbatim, over prompt_name ("" for none)."""
    pool_factor: float | None = None
    """Documents' vectors pooled to about 1 / pool_factor of them (sentence-transformers' HierarchicalTokenPooling,
    PyLate's pool_factor), in place of the model's own pooling; 1: none merged; None: as the model pools."""
    dimensions: int | None = None
    """Each vector's first N dimensions, renormalised (a Matryoshka ColBERT's smaller width, MultiVectorEncoder's
    truncate_dim); None: the model's own (its folder's truncate_dim, else every dimension)."""

    def texts_for_sizing(self) -> Sequence[object]:
        return [self.texts] if isinstance(self.texts, str) else self.texts

    def plan(self, model: ModelContext) -> Plan[list[np.ndarray]]:
        model.require("embed_multi_vector", "multi_vector", "hybrid")
        rows = side_rows(model, as_texts(self.texts, "texts"), self.side, self.truncate, self.prompt_name, self.prompt)
        model.limit_token_vectors(rows, "token vectors")
        rules = rules_of(model)
        pooling = for_request(rules.token_pooling, self.pool_factor, self.side)
        if self.dimensions is not None and model.manifest.task == "hybrid":
            raise InvalidRequest("dimensions apply to a multi-vector model's vectors; a hybrid model's colbert vectors "
                                 "are served whole")
        check_dimensions(self.dimensions, model.manifest.shape.output_dim)
        width = self.dimensions if self.dimensions is not None else model.manifest.truncate_dim
        return Plan(rows, lambda outputs: [scored(rules, row, output[MULTI_VECTORS], self.side, pooling, width)
                                           for row, output in zip(rows, outputs)], outputs=(MULTI_VECTORS,),
                    blocking_finish=pooling is not None)


def rules_of(model: ModelContext) -> MultiVector:
    rules = model.manifest.multi_vector
    assert rules is not None  # the manifest refuses a multi_vector task without them
    return rules


def side_rows(model: ModelContext, texts: list[str], side: str, truncate: Truncation, prompt_name: str | None,
              prompt: str | None) -> list[Tokens]:
    """The rows of texts on one side: the side's prompt in front, cut at the side's length (and the request's),
    a query filled up to the expansion length."""
    if side not in SIDES:
        raise InvalidRequest(f"side must be 'query' or 'document', got {side!r}")
    rules = rules_of(model)
    prefix = model.prompt(side_prompt_name(model.manifest.prompts, side, prompt_name, prompt), prompt)
    tokenizer, cut = model.tokenizer_for(truncate)
    length = rules.length(side)
    if length is not None and length < tokenizer.max_length:
        tokenizer, cut = tokenizer.limited(length), True  # the model's own cut for the side, as encode applies it
    rows = model.prompted_rows(texts, prefix, tokenizer, cut)
    if side == "query" and rules.expansion_length:
        rows = [_expanded(row, rules) for row in rows]
    return rows


def _expanded(row: Tokens, rules: MultiVector) -> Tokens:
    missing = (rules.expansion_length or 0) - len(row.ids)
    if missing <= 0:
        return row
    assert rules.expansion_token_id is not None
    return row._replace(ids=row.ids + [rules.expansion_token_id] * missing, type_ids=row.type_ids + [0] * missing,
                        attended=-1 if rules.expansion_attend else len(row.ids))


def scored(rules: MultiVector, row: Tokens, vectors: np.ndarray, side: str, pooling: TokenPooling | None = None,
           width: int | None = None) -> np.ndarray:
    """The vectors a row is scored by, under the model's rules: all of a query's; a document's less the skip-list's
    tokens; each of unit length where the model normalises; then pooled where `pooling` says; then cut to `width`
    dimensions and renormalised, as MultiVectorEncoder's truncate_dim cuts them."""
    vectors, ids = vectors.astype(np.float32, copy=False), row.ids
    if rules.skip_first:
        vectors, ids = vectors[1:], ids[1:]
    if side in rules.skip_sides and rules.skip_ids:
        vectors = vectors[~np.isin(np.asarray(ids), rules.skip_ids)]
    vectors = l2_normalize(vectors) if rules.normalize else vectors
    vectors = pooled(vectors, pooling) if pooling is not None else vectors
    return l2_normalize(vectors[:, :width]) if width is not None else vectors


def pair_maxsim(vectors: Sequence[np.ndarray], left: Sequence[int], right: Sequence[int], mean: bool) -> np.ndarray:
    """MaxSim of each (vectors[left[i]], vectors[right[i]]) pair: the pairs grouped by query in one pass, each query
    against all its documents in one product."""
    pairs_of: dict[int, list[int]] = {}
    for i, query in enumerate(left):
        pairs_of.setdefault(query, []).append(i)
    result = np.zeros(len(left), np.float64)
    for query, pairs in pairs_of.items():
        result[pairs] = maxsim(vectors[query], [vectors[right[i]] for i in pairs], mean)
    return result


def maxsim(query: np.ndarray, documents: Sequence[np.ndarray], mean: bool = False) -> np.ndarray:
    """Each document's late-interaction score against one query: the sum over the query's vectors of each one's best
    dot product with the document's vectors (over their number with `mean`), all documents in one product."""
    if not documents:
        return np.zeros(0, np.float32)
    width = max(len(d) for d in documents)
    padded = np.zeros((len(documents), max(width, 1), query.shape[-1]), np.float32)
    real = np.zeros((len(documents), max(width, 1)), bool)
    for i, document in enumerate(documents):
        padded[i, : len(document)] = document
        real[i, : len(document)] = True
    products = np.einsum("qd,nld->nql", query, padded)
    best = np.where(real[:, None, :], products, -np.inf).max(axis=2)
    best[~np.isfinite(best)] = 0.0  # a document with no scored token contributes nothing
    scores = best.sum(axis=1)
    return scores / max(len(query), 1) if mean else scores
