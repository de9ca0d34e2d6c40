"""Deterministic, realistic text workloads: short queries, passages with a long tail, rerank lists.

Texts are drawn from a fixed English vocabulary with a seeded generator, so two runs (or the
engine and its reference in one run) see exactly the same inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_VOCABULARY = (
    "the of and to in is was for on are with as by at from that this be it an or which have has not were but "
    "their they one all been more can also other new first its into two time only after most some about would "
    "there when such these may many then than over years them used well where between both under city during "
    "system river national water school known world high large population university government area state "
    "including often early several company history number public part since music called local three north "
    "south west east century found however through development energy research power species language "
    "network model data search retrieval query document passage answer question service encoder vector "
    "similarity ranking relevance index storage latency throughput memory processor cluster server request "
    "rainforest mountain island village market festival painting library hospital railway airport bridge "
    "climate temperature forest ocean desert harbour castle museum church garden theatre stadium station"
).split()


@dataclass(frozen=True)
class RerankCase:
    query: str
    documents: list[str]


def _sentence(rng: np.random.Generator, words: int) -> str:
    picks = rng.integers(0, len(_VOCABULARY), size=max(1, words))
    return " ".join(_VOCABULARY[i] for i in picks)


def queries(count: int, seed: int = 0) -> list[str]:
    """Search queries of 3 to 12 words (about 4-16 tokens with special tokens)."""
    rng = np.random.default_rng(seed)
    return [_sentence(rng, int(rng.integers(3, 13))) for _ in range(count)]


def passages(count: int, seed: int = 1, mean_words: int = 60, max_words: int = 400) -> list[str]:
    """Passages of about `mean_words` words, with a lognormal long tail up to `max_words`."""
    rng = np.random.default_rng(seed)
    sigma = 0.6
    lengths = rng.lognormal(np.log(mean_words) - sigma**2 / 2, sigma, size=count)
    return [_sentence(rng, int(np.clip(n, 5, max_words))) for n in lengths]


def mixed(count: int, seed: int = 2, query_share: float = 0.3) -> list[str]:
    """What an embedding service sees: short queries interleaved with passages."""
    n_queries = int(count * query_share)
    rng = np.random.default_rng(seed)
    texts = queries(n_queries, seed + 10) + passages(count - n_queries, seed + 20)
    return [texts[i] for i in rng.permutation(len(texts))]


def rerank_cases(count: int, seed: int = 3, min_documents: int = 32, max_documents: int = 100) -> list[RerankCase]:
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(count):
        n = int(rng.integers(min_documents, max_documents + 1))
        cases.append(RerankCase(queries(1, seed * 1000 + i)[0], passages(n, seed * 1000 + i + 500)))
    return cases
