"""Scores of text pairs (vLLM's /score pairing): a cross-encoder's activated logit, or an embedding model's similarity
(its folder's similarity_fn_name, cosine unless it says otherwise; a sparse model's, dot unless it says otherwise)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.manifest import MULTI_VECTORS, SIDES
from encoderrt.runtime.postprocess import ACTIVATIONS, SIMILARITIES, shape_embeddings
from encoderrt.runtime.requests import TextOrTexts, Truncation, as_texts
from encoderrt.runtime.tasks.base import ModelContext, Plan, Request
from encoderrt.runtime.tasks.multi_vector import pair_maxsim, rules_of, scored, side_rows
from encoderrt.runtime.token_pooling import for_request
from encoderrt.runtime.tokenizer import TextTokenizer


@dataclass(frozen=True)
class ScoreRequest(Request[list[float]]):
    """One score per pair: 1:1 (two texts), 1:N (one text_1, a list text_2), N:N (equal-length lists)."""

    text_1: TextOrTexts
    text_2: TextOrTexts
    truncate: Truncation = True
    activation: bool = True
    """False: raw logits, for users who calibrate scores themselves."""
    prompt_name: str | None = None
    """One of a cross-encoder's prompts (CrossEncoder.predict's); None: its default prompt, if it has one."""
    prompt: str | None = None
    """A prompt given verbatim, over prompt_name: in front of each query, or, for a reranker that renders pairs
    through its chat template (Qwen3-Reranker), its instruction."""
    hybrid_weights: Mapping[str, float] | None = None
    """A hybrid (bge-m3) model's weights of its dense, sparse and colbert scores, in place of its own (0.4, 0.2, 0.4;
    one left out weighs 0); the score is their weighted mean."""

    def texts_for_sizing(self) -> Sequence[object]:
        return [*([self.text_1] if isinstance(self.text_1, str) else self.text_1),
                *([self.text_2] if isinstance(self.text_2, str) else self.text_2)]

    def plan(self, model: ModelContext) -> Plan[list[float]]:
        return plan_pairs(model, *pair_texts(self.text_1, self.text_2), self.truncate, self.activation, self.prompt_name,
                          self.prompt, self.hybrid_weights)


def plan_pairs(model: ModelContext, firsts: list[str], seconds: list[str], truncate: Truncation,
               activation: bool, prompt_name: str | None = None, prompt: str | None = None,
               hybrid_weights: Mapping[str, float] | None = None) -> Plan[list[float]]:
    """Scores of (first, second) pairs: the cross-encoder runs each pair; an embedding model embeds each distinct
    text once and compares the embeddings as encode returns them by its similarity, as sentence-transformers'
    model.similarity does (a hybrid model by its three scores, runtime/tasks/hybrid.py)."""
    model.require("score", "score", "embed", "sparse", "multi_vector", "hybrid")
    if hybrid_weights is not None and model.manifest.task != "hybrid":
        raise InvalidRequest("hybrid_weights apply to a hybrid (bge-m3) model; this model serves "
                             f"{model.manifest.task}")
    if not activation and model.manifest.task != "score":  # asking for raw logits where there are none
        raise InvalidRequest("raw scores (no activation) apply to a cross-encoder's logits; this "
                             f"{model.manifest.task} model's score is a similarity, with no activation to leave out")
    if model.manifest.task == "multi_vector":
        return _late_interaction(model, firsts, seconds, truncate, prompt_name, prompt)
    if model.manifest.task == "sparse":
        return _sparse_similarity(model, firsts, seconds, truncate, prompt_name, prompt)
    tokenizer, cut = model.tokenizer_for(truncate)
    if model.manifest.task == "score":
        return _cross_encoded(model, tokenizer, cut, firsts, seconds, activation, model.prompt(prompt_name, prompt))
    if prompt_name is not None or prompt is not None:
        raise InvalidRequest("a prompt applies to a cross-encoder's pairs; this embedding model scores by the "
                             f"{model.manifest.similarity} similarity of its default-prompted embeddings")
    if model.manifest.task == "hybrid":
        from encoderrt.runtime.tasks.hybrid import plan_hybrid_scores

        return plan_hybrid_scores(model, firsts, seconds, truncate, hybrid_weights)
    unique = list(dict.fromkeys(firsts + seconds))
    position = {text: i for i, text in enumerate(unique)}
    left = [position[t] for t in firsts]
    right = [position[t] for t in seconds]
    prefix = model.prompt()
    rows = model.with_adapter(model.pooled_after(prefix, tokenizer.encode(unique, cut, prompt=prefix)), None)
    similarity, width = SIMILARITIES[model.manifest.similarity], model.manifest.truncate_dim
    normalize = model.manifest.normalize and model.manifest.similarity != "cosine"  # cosine normalises by itself

    def scores(outputs: np.ndarray) -> list[float]:
        embeddings = shape_embeddings(outputs, normalize, width)
        return similarity(embeddings[left], embeddings[right]).tolist() if left else []

    return Plan(rows, scores)


def _cross_encoded(model: ModelContext, tokenizer: TextTokenizer, cut: bool, firsts: list[str], seconds: list[str],
                   activation: bool, prompt: str) -> Plan[list[float]]:
    overhead, what = tokenizer.pair_overhead(prompt)
    if cut and tokenizer.max_length < overhead + 2:
        raise InvalidRequest(f"truncation length {tokenizer.max_length} leaves no room for a pair: {what} alone take "
                             f"{overhead} tokens; choose at least {overhead + 2}")
    rows = tokenizer.encode_pairs(firsts, seconds, cut, prompt)
    apply = ACTIVATIONS[model.manifest.activation] if activation else ACTIVATIONS["identity"]
    return Plan(rows, lambda outputs: apply(outputs[:, 0]).astype(float).tolist())


def _late_interaction(model: ModelContext, firsts: list[str], seconds: list[str], truncate: Truncation,
                      prompt_name: str | None, prompt: str | None) -> Plan[list[float]]:
    """A multi-vector model's MaxSim of each pair: each distinct query and document runs once, on its side (a prompt
    given applies to the queries); each query scores all its documents in one product."""
    queries, documents = list(dict.fromkeys(firsts)), list(dict.fromkeys(seconds))
    rows = (side_rows(model, queries, "query", truncate, prompt_name, prompt)
            + side_rows(model, documents, "document", truncate, None, None))
    query_index = {t: i for i, t in enumerate(queries)}
    document_index = {t: len(queries) + i for i, t in enumerate(documents)}  # documents' rows follow the queries'
    left, right = [query_index[t] for t in firsts], [document_index[t] for t in seconds]
    rules = rules_of(model)
    mean = rules.similarity == "meanmaxsim"
    pooling = {side: for_request(rules.token_pooling, None, side) for side in SIDES}  # encode_*'s own

    def scores(outputs: list[dict[str, np.ndarray]]) -> list[float]:
        sides = ["query" if i < len(queries) else "document" for i in range(len(rows))]
        vectors = [scored(rules, row, output[MULTI_VECTORS], side, pooling[side], model.manifest.truncate_dim)
                   for side, row, output in zip(sides, rows, outputs)]
        return pair_maxsim(vectors, left, right, mean).tolist()

    return Plan(rows, scores, outputs=(MULTI_VECTORS,), blocking_finish=any(pooling.values()))


def pair_texts(text_1: TextOrTexts, text_2: TextOrTexts) -> tuple[list[str], list[str]]:
    """vLLM's score pairing: 1:1 (str, str), 1:N (one text_1, list text_2), N:N (equal-length lists)."""
    firsts, seconds = as_texts(text_1, "text_1"), as_texts(text_2, "text_2")
    if len(firsts) == 1 and not isinstance(text_2, str):
        return firsts * len(seconds), seconds
    if isinstance(text_2, str) and len(firsts) != 1:
        raise InvalidRequest(
            f"text_1 is a list of {len(firsts)} texts but text_2 is a single text: "
            "give text_2 as a list of the same length (N:N) or a single text_1 (1:N)"
        )
    if len(firsts) != len(seconds):
        raise InvalidRequest(
            f"text_1 has {len(firsts)} texts and text_2 has {len(seconds)}: "
            "pairwise scoring (N:N) needs equal lengths, or give one text_1 for many text_2 (1:N)"
        )
    return firsts, seconds


def _sparse_similarity(model: ModelContext, firsts: list[str], seconds: list[str], truncate: Truncation,
                       prompt_name: str | None, prompt: str | None) -> Plan[list[float]]:
    """A sparse model's score of each pair, as SparseEncoder's similarity scores encode_query's vectors against
    encode_document's (each side's prompt, an inference-free model's query weights, the folder's max_active_dims;
    dot unless the folder names another similarity): each distinct query and document once, on its side (a prompt
    given applies to the queries)."""
    from encoderrt.runtime.tasks.sparse import SparseEmbedRequest

    queries, documents = list(dict.fromkeys(firsts)), list(dict.fromkeys(seconds))
    asked = SparseEmbedRequest(queries, None, truncate, "query", prompt_name, prompt).plan(model)
    answered = SparseEmbedRequest(documents, None, truncate, "document").plan(model)
    split = len(asked.rows)
    query_index, document_index = {t: i for i, t in enumerate(queries)}, {t: i for i, t in enumerate(documents)}
    left, right = [query_index[t] for t in firsts], [document_index[t] for t in seconds]

    def scores(outputs: np.ndarray) -> list[float]:
        vectors = _on_shared_ids(asked.finish(outputs[:split]), answered.finish(outputs[split:]))
        return SIMILARITIES[model.manifest.similarity](vectors[0][left], vectors[1][right]).tolist() if left else []

    read = None if asked.read_tokens is None else asked.read_tokens + tuple(len(row.ids) for row in answered.rows)
    return Plan(asked.rows + answered.rows, scores, read_tokens=read)


def _on_shared_ids(*sides: list[list[tuple[int, float]]]) -> list[np.ndarray]:
    """Each side's (token id, weight) rows as dense vectors over the token ids any of them holds, not the whole
    vocabulary (a multilingual one has 250k): a token no row holds adds nothing to any similarity."""
    ids = {token: i for i, token in enumerate(dict.fromkeys(t for rows in sides for row in rows for t, _ in row))}
    dense = []
    for rows in sides:
        vectors = np.zeros((len(rows), len(ids)), np.float32)
        for index, row in enumerate(rows):
            if row:
                vectors[index, [ids[t] for t, _ in row]] = [w for _, w in row]
        dense.append(vectors)
    return dense
