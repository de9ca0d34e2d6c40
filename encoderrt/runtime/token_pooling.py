"""Hierarchical token pooling: a text's token vectors, after its first (protected) ones, clustered by Ward linkage
on their cosine distances, each cluster replaced by the mean of its vectors, as sentence-transformers'
HierarchicalTokenPooling (and PyLate's pool_factor) pools a ColBERT model's documents: an index holds a half or a
third of the vectors for a small loss in ranking.

Each text is pooled alone; sentence-transformers pools a batch at once, but every count it takes from the batch
bounds the per-text counts it also takes, so the two agree. The clustering is scipy's, as sentence-transformers
clusters: scipy's own code where it is installed, runtime/ward.py's equal numpy elsewhere.
"""

from __future__ import annotations

import numpy as np

from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.manifest import TokenPooling
from encoderrt.runtime.postprocess import l2_normalize
from encoderrt.runtime.ward import flat_clusters


def pooled(vectors: np.ndarray, rules: TokenPooling) -> np.ndarray:
    """[tokens, dim] float32 -> [kept, dim]: the protected vectors as they are, then one mean per cluster of the rest,
    in the order of their cluster numbers; every vector of unit length where `rules.normalize` says."""
    protected = min(rules.protected_tokens, len(vectors))
    rest = vectors[protected:]
    labels = _clusters(rest, rules)
    if labels is not None:
        counts = np.bincount(labels).astype(np.float32)
        sums = np.zeros((len(counts), vectors.shape[1]), np.float32)
        np.add.at(sums, labels, rest)
        vectors = np.concatenate([vectors[:protected], sums / counts[:, None]])
    return l2_normalize(vectors) if rules.normalize else vectors


def _clusters(vectors: np.ndarray, rules: TokenPooling) -> np.ndarray | None:
    """Each vector's cluster, numbered from 0, or None where nothing is merged."""
    count = len(vectors)
    if count <= 1:
        return None
    if rules.distance_threshold is None:
        if rules.max_tokens is not None:
            target = rules.max_tokens - rules.protected_tokens
        else:
            target = max(int(count // rules.pool_factor), 1)
        if target >= count:
            return None
    distances = np.clip(1.0 - vectors @ vectors.T, 0.0, 2.0)
    if rules.distance_threshold is None:
        numbers = flat_clusters(distances, clusters=target)
    else:
        numbers = flat_clusters(distances, threshold=rules.distance_threshold)
    return np.unique(numbers, return_inverse=True)[1]


def for_request(model_rules: TokenPooling | None, pool_factor: float | None, side: str) -> TokenPooling | None:
    """The pooling a request's side gets: the model's own, or, where the request names a pool_factor, that factor in
    place of the model's rule (with the model's protected tokens and normalising, or sentence-transformers'
    defaults); None where nothing pools."""
    if pool_factor is None:
        return model_rules if model_rules is not None and side in model_rules.sides else None
    if side != "document":
        raise InvalidRequest("pool_factor applies to documents: a query keeps every vector, as MaxSim reads them")
    if isinstance(pool_factor, bool) or not isinstance(pool_factor, (int, float)):
        raise InvalidRequest(f"pool_factor must be a number of at least 1, got {pool_factor!r}")
    base = model_rules or TokenPooling()
    rules = TokenPooling(float(pool_factor), protected_tokens=base.protected_tokens, normalize=base.normalize)
    if problem := rules.problem():
        raise InvalidRequest(problem)
    return rules
