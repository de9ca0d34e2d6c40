"""Hybrid (bge-m3) requests: any of a text's three representations from one run of its row (the dense vector, the
lexical weights, the colbert vectors), and the hybrid score that score and rerank use for such a model.

The graph returns the pooled row and every token's lexical weight and colbert vector (compile/hybrid.py); what
bge-m3 makes of them is here, by FlagEmbedding's formulas: the dense vector normalised as the folder says; a text's
lexical weights are each token id's largest weight above zero, the CLS, end, padding and unknown tokens left out;
its colbert vectors are every token's but the first, normalised (runtime/tasks/multi_vector.py's `scored`). A pair
scores by the weighted mean of the dense vectors' cosine, the sum over shared token ids of the weights' products, and
MeanMaxSim of the colbert vectors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.manifest import HYBRID_OUTPUTS, LEXICAL_WEIGHTS, MULTI_VECTORS, Hybrid
from encoderrt.runtime.postprocess import cosine_pairs, shape_embeddings
from encoderrt.runtime.requests import TextOrTexts, Truncation, as_texts
from encoderrt.runtime.tasks.base import ModelContext, Plan, Request, check_count
from encoderrt.runtime.tasks.multi_vector import pair_maxsim, rules_of, scored
from encoderrt.runtime.tokenizer import Tokens

Lexical = tuple[np.ndarray, np.ndarray]
"""A text's lexical weights as (token ids ascending, their weights): the form lexical scores are computed in."""


@dataclass(frozen=True)
class HybridEmbedding:
    """A text's representations, each None unless the request asked for it."""

    dense: np.ndarray | None = None
    """[dim], normalised where the model normalises."""
    sparse: list[tuple[int, float]] | None = None
    """(token id, weight) pairs above zero, heaviest first (SPLADE's shape: runtime/tasks/sparse.py)."""
    colbert: np.ndarray | None = None
    """[tokens, dim]: a vector for every token but the first, each of unit length."""


@dataclass(frozen=True)
class HybridEmbedRequest(Request[list[HybridEmbedding]]):
    """A hybrid (bge-m3) model's dense vector, lexical weights and colbert vectors of each text, any subset of them
    (`outputs`), all from one run of the text's row."""

    texts: TextOrTexts
    outputs: Sequence[str] = HYBRID_OUTPUTS
    """Which of "dense", "sparse" and "colbert" to return."""
    truncate: Truncation = True
    top_k: int | None = None
    """Keep the k heaviest lexical weights of each text."""

    def texts_for_sizing(self) -> Sequence[object]:
        return [self.texts] if isinstance(self.texts, str) else self.texts

    def plan(self, model: ModelContext) -> Plan[list[HybridEmbedding]]:
        model.require("embed_hybrid", "hybrid")
        wanted = _outputs(self.outputs)
        check_count("top_k", self.top_k)
        rows = hybrid_rows(model, as_texts(self.texts, "texts"), self.truncate)
        if "colbert" in wanted:
            model.limit_token_vectors(rows, "token vectors", "send fewer or shorter texts, or leave colbert out")
        names, rules = graph_outputs(model, wanted), rules_of(model)

        def finish(outputs: list[dict[str, np.ndarray]]) -> list[HybridEmbedding]:
            dense = (shape_embeddings(np.stack([output[names[0]] for output in outputs]), model.manifest.normalize, None)
                     if "dense" in wanted and outputs else [None] * len(outputs))
            return [HybridEmbedding(
                dense=vector,
                sparse=_pairs(lexical(model, row, output[LEXICAL_WEIGHTS]), self.top_k) if "sparse" in wanted else None,
                colbert=scored(rules, row, output[MULTI_VECTORS], "document") if "colbert" in wanted else None,
            ) for row, output, vector in zip(rows, outputs, dense)]

        return Plan(rows, finish, outputs=names)


def hybrid_rows(model: ModelContext, texts: list[str], truncate: Truncation) -> list[Tokens]:
    """Texts with the model's default prompt (bge-m3 has none), as its embed requests run them."""
    tokenizer, cut = model.tokenizer_for(truncate)
    prefix = model.prompt()
    return model.pooled_after(prefix, model.prompted_rows(texts, prefix, tokenizer, cut))


def graph_outputs(model: ModelContext, wanted: Sequence[str]) -> tuple[str, ...]:
    """The graph outputs that make the wanted representations (the first output is the dense row)."""
    by_kind = {"dense": model.manifest.outputs[0], "sparse": LEXICAL_WEIGHTS, "colbert": MULTI_VECTORS}
    return tuple(by_kind[kind] for kind in HYBRID_OUTPUTS if kind in wanted)


def hybrid_rules(model: ModelContext) -> Hybrid:
    rules = model.manifest.hybrid
    assert rules is not None  # the manifest refuses a hybrid task without them
    return rules


def lexical(model: ModelContext, row: Tokens, weights: np.ndarray) -> Lexical:
    """Each token id's largest weight above zero, the model's unweighted tokens left out."""
    ids = np.asarray(row.ids)
    keep = (weights > 0) & ~np.isin(ids, hybrid_rules(model).lexical_skip_ids)
    ids, weights = ids[keep], weights[keep].astype(np.float32)
    order = np.lexsort((-weights, ids))  # by id, the heaviest of each id first
    ids, weights = ids[order], weights[order]
    first = np.ones(len(ids), bool)
    first[1:] = ids[1:] != ids[:-1]
    return ids[first], weights[first]


def lexical_score(query: Lexical, document: Lexical) -> float:
    """The sum over the token ids both have of their weights' product."""
    _, in_query, in_document = np.intersect1d(query[0], document[0], assume_unique=True, return_indices=True)
    return float(np.dot(query[1][in_query], document[1][in_document]))


def _pairs(weights: Lexical, top_k: int | None) -> list[tuple[int, float]]:
    order = np.argsort(-weights[1], kind="stable")[:top_k]
    return [(int(weights[0][i]), float(weights[1][i])) for i in order]


def _outputs(outputs: Sequence[str]) -> tuple[str, ...]:
    if isinstance(outputs, str) or not outputs or any(kind not in HYBRID_OUTPUTS for kind in outputs):
        raise InvalidRequest(f"outputs must be a non-empty list of {', '.join(HYBRID_OUTPUTS)}; got {outputs!r}")
    return tuple(dict.fromkeys(outputs))


def score_weights(model: ModelContext, weights: Mapping[str, float] | None) -> dict[str, float]:
    """The weights of the dense, sparse and colbert scores: the request's, where it gives them (a representation it
    leaves out weighs 0, and is not computed), else the model's."""
    if weights is None:
        return dict(hybrid_rules(model).weights)
    if not isinstance(weights, Mapping) or any(kind not in HYBRID_OUTPUTS for kind in weights):
        raise InvalidRequest(f"hybrid_weights maps {', '.join(HYBRID_OUTPUTS)} to weights; got {weights!r}")
    for kind, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < float("inf"):
            raise InvalidRequest(f"hybrid_weights[{kind!r}] must be a number of at least 0; got {weight!r}")
    merged = {kind: float(weights.get(kind, 0.0)) for kind in HYBRID_OUTPUTS}
    if not sum(merged.values()) > 0:
        raise InvalidRequest("hybrid_weights must give at least one of dense, sparse and colbert a weight above 0")
    return merged


def plan_hybrid_scores(model: ModelContext, firsts: list[str], seconds: list[str], truncate: Truncation,
                       weights: Mapping[str, float] | None) -> Plan[list[float]]:
    """Each pair's weighted mean of its dense, sparse and colbert scores (FlagEmbedding's compute_score
    "colbert+sparse+dense"); each distinct text runs once, and each query's colbert scores against all its
    documents come from one product."""
    weighted = score_weights(model, weights)
    wanted = [kind for kind in HYBRID_OUTPUTS if weighted[kind] > 0]
    unique = list(dict.fromkeys(firsts + seconds))
    position = {text: i for i, text in enumerate(unique)}
    left, right = [position[t] for t in firsts], [position[t] for t in seconds]
    rows = hybrid_rows(model, unique, truncate)
    names, rules = graph_outputs(model, wanted), rules_of(model)

    def scores(outputs: list[dict[str, np.ndarray]]) -> list[float]:
        total = np.zeros(len(firsts), np.float64)
        if "dense" in wanted:
            dense = np.stack([output[names[0]] for output in outputs]).astype(np.float32)
            total += weighted["dense"] * cosine_pairs(dense[left], dense[right])
        if "sparse" in wanted:
            weights_of = [lexical(model, row, output[LEXICAL_WEIGHTS]) for row, output in zip(rows, outputs)]
            total += weighted["sparse"] * np.array([lexical_score(weights_of[a], weights_of[b]) for a, b in zip(left, right)])
        if "colbert" in wanted:
            vectors = [scored(rules, row, output[MULTI_VECTORS], "document") for row, output in zip(rows, outputs)]
            total += weighted["colbert"] * pair_maxsim(vectors, left, right, mean=True)
        return (total / sum(weighted.values())).tolist()

    return Plan(rows, scores, outputs=names)
