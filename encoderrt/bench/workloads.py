"""Deterministic, realistic text workloads: short queries, passages with a long tail, rerank lists.

Texts are drawn from a fixed English vocabulary with a seeded generator, so two runs (or the
engine and its reference in one run) see exactly the same inputs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from encoderrt.runtime.tasks import (
    ClassifyRequest,
    EmbedRequest,
    MultiVectorRequest,
    Request,
    RerankRequest,
    ScoreRequest,
)

WORKLOADS = ("queries", "passages", "rerank")
BATCHED_QUERIES = "queries-batched"
"""The queries workload's texts sent PASSAGES_PER_REQUEST a request: what one-text requests are measured against."""
PASSAGES, PASSAGES_PER_REQUEST = 256, 16
RERANK_LISTS = 12
MIN_DOCUMENTS, MAX_DOCUMENTS = 32, 100
"""A rerank list's length, where the clients are few enough for every list to be whole."""

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


def rerank_cases(count: int, seed: int = 3, min_documents: int = MIN_DOCUMENTS,
                 max_documents: int = MAX_DOCUMENTS) -> list[RerankCase]:
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(count):
        n = int(rng.integers(min_documents, max_documents + 1))
        cases.append(RerankCase(queries(1, seed * 1000 + i)[0], passages(n, seed * 1000 + i + 500)))
    return cases


@dataclass(frozen=True)
class Workload:
    """Engine requests to replay, and what the reference must compute for the very same inputs."""

    name: str
    requests: list[Request]
    reference_texts: list[str]
    """For an embedding model: every text, encoded by SentenceTransformer.encode."""
    reference_pairs: list[tuple[str, str]]
    """For a cross-encoder: every (query, document) pair, scored by CrossEncoder.predict; for a multi-vector model,
    each query's documents, scored by MultiVectorEncoder's MaxSim. A multi-vector model's `reference_texts` are
    encoded as queries in the queries workload, as documents otherwise."""


def read_texts(path: Path) -> list[str]:
    """A user's own texts: one per line, or JSON lines with a "text" field."""
    texts = []
    try:
        content = path.read_text(encoding="utf-8-sig")  # past a BOM, as the jobs read their inputs
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    for number, line in enumerate(content.splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f'{path}:{number}: expected an object with a "text" string')
            texts.append(record["text"])
        else:
            texts.append(line)
    if not texts:
        raise ValueError(f"{path} holds no texts")
    return texts


def build(name: str, task: str, user_texts: list[str] | None = None, scale: float = 1.0,
          min_requests: int = 1) -> Workload | None:
    """The workload for a model task; None where it does not apply (rerank on a classifier).

    It holds at least `min_requests` distinct requests (the highest concurrency), so no request is
    ever in flight twice: the engine would compute the duplicate once and the figures would lie.
    More clients enlarge a pass up to the default size (scale 1.0); past it they split the pass into
    smaller requests, since every run takes at least a pass: 32 clients made the default rerank pass
    2.7x as long, and a default bench took 5.6 minutes on an AVX2 CPU.
    """
    n = max(8, int(PASSAGES * scale), min(PASSAGES_PER_REQUEST * min_requests, PASSAGES))
    if name == "queries":
        texts = user_texts or queries(max(2 * n, min_requests))
        if task in ("embed", "hybrid"):  # a hybrid model's dense vector; its rerank by the hybrid score
            return Workload(name, [EmbedRequest([t]) for t in texts], texts, [])
        if task == "classify":
            return Workload(name, [ClassifyRequest([t]) for t in texts], texts, [])
        if task == "multi_vector":
            return Workload(name, [MultiVectorRequest([t], side="query") for t in texts], texts, [])
        pairs = list(zip(texts, reversed(texts)))
        return Workload(name, [ScoreRequest(q, d) for q, d in pairs], [], pairs)
    if name == "passages":
        texts = user_texts or passages(n)
        per_request = max(1, min(PASSAGES_PER_REQUEST, len(texts) // min_requests))
        chunks = [texts[i : i + per_request] for i in range(0, len(texts), per_request)]
        if task in ("embed", "hybrid"):
            return Workload(name, [EmbedRequest(c) for c in chunks], texts, [])
        if task == "classify":
            return Workload(name, [ClassifyRequest(c) for c in chunks], texts, [])
        if task == "multi_vector":
            return Workload(name, [MultiVectorRequest(c) for c in chunks], texts, [])
        query = queries(1)[0]
        return Workload(name, [ScoreRequest(query, c) for c in chunks], [], [(query, t) for t in texts])
    if name == "rerank":
        if task == "classify":
            return None
        whole = max(2, int(RERANK_LISTS * scale), min(min_requests, RERANK_LISTS))  # lists' worth of documents
        count = max(whole, min_requests)
        cases = rerank_cases(count, min_documents=max(1, MIN_DOCUMENTS * whole // count),
                             max_documents=max(1, MAX_DOCUMENTS * whole // count))
        if user_texts:
            cases = [RerankCase(c.query, user_texts[: len(c.documents)]) for c in cases]
        requests = [RerankRequest(c.query, c.documents) for c in cases]
        if task in ("embed", "hybrid"):
            return Workload(name, requests, [t for c in cases for t in (c.query, *c.documents)], [])
        return Workload(name, requests, [], [(c.query, d) for c in cases for d in c.documents])
    raise ValueError(f"unknown workload '{name}'; choose from {', '.join(WORKLOADS)} or all")


def batched_queries(single: Workload, min_requests: int = 1) -> Workload | None:
    """The queries workload's very texts, PASSAGES_PER_REQUEST a request (fewer where the clients need more
    requests): the same work as a client that batches its queries, the yardstick of one-text requests. None for a
    cross-encoder, whose queries are (query, document) pairs of their own."""
    requests = single.requests
    if not requests or isinstance(requests[0], ScoreRequest):
        return None
    texts = [t for r in requests for t in r.texts]
    size = max(1, min(PASSAGES_PER_REQUEST, len(texts) // min_requests))
    chunks = [texts[i : i + size] for i in range(0, len(texts), size)]
    first = requests[0]
    if isinstance(first, MultiVectorRequest):
        batched: list[Request] = [MultiVectorRequest(c, side=first.side) for c in chunks]
    else:
        batched = [type(first)(c) for c in chunks]
    return Workload(BATCHED_QUERIES, batched, single.reference_texts, single.reference_pairs)
