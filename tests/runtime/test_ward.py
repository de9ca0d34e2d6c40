"""runtime/ward.py's numpy clustering against scipy's own (what sentence-transformers' token pooling calls): the same
linkage rows, bit for bit, and the same flat cluster numbers, on unit vectors like a ColBERT model's, with ties
(repeated vectors, coarse ones) and every cut from one cluster to one per vector."""

import numpy as np
import pytest
from scipy.cluster import hierarchy
from scipy.spatial.distance import squareform

from encoderrt.runtime import ward


def _distances(rng, count, width, ties):
    vectors = rng.standard_normal((count, width)).astype(np.float32)
    if ties == "repeated":
        vectors[rng.integers(0, count, count // 2)] = vectors[0]
    elif ties == "coarse":
        vectors = np.round(vectors)
        vectors[~vectors.any(axis=1)] = 1.0  # no zero vectors
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.clip(1.0 - vectors @ vectors.T, 0.0, 2.0)  # as token pooling computes them: float32, not symmetric


@pytest.mark.parametrize("ties", ["none", "repeated", "coarse"])
def test_the_tree_and_the_clusters_are_scipys(ties):
    rng = np.random.default_rng(len(ties))
    for _ in range(300):
        count = int(rng.integers(2, 48))
        distances = _distances(rng, count, int(rng.integers(2, 12)), ties)
        tree = ward.linkage(distances)
        np.testing.assert_array_equal(tree, hierarchy.linkage(squareform(distances, checks=False), method="ward"))
        for clusters in {1, 2, count // 2 or 1, count - 1, count, count + 3}:
            expected = hierarchy.fcluster(tree, t=clusters, criterion="maxclust")
            np.testing.assert_array_equal(ward.flat_clusters(distances, clusters=clusters, use_scipy=False), expected)
        for threshold in (0.0, float(rng.uniform(0.0, 1.0)), float(tree[count // 2 - 1, 2]) if count > 2 else 0.5):
            expected = hierarchy.fcluster(tree, t=threshold, criterion="distance")
            np.testing.assert_array_equal(ward.flat_clusters(distances, threshold=threshold, use_scipy=False),
                                          expected)


def test_a_long_document():
    """512 tokens, a ColBERT document's usual limit, cut in half as pool_factor 2 cuts it."""
    distances = _distances(np.random.default_rng(7), 512, 128, "none")
    np.testing.assert_array_equal(ward.flat_clusters(distances, clusters=256, use_scipy=False),
                                  ward.flat_clusters(distances, clusters=256, use_scipy=True))


def test_what_it_refuses():
    with pytest.raises(ValueError, match="the distances to cluster must all be finite"):
        ward.flat_clusters(np.array([[0.0, np.nan], [np.nan, 0.0]]), clusters=1, use_scipy=False)
    with pytest.raises(ValueError, match="give either clusters or threshold"):
        ward.flat_clusters(np.zeros((2, 2)), clusters=1, threshold=0.5)
    with pytest.raises(ValueError, match="clustering needs at least two items"):
        ward.flat_clusters(np.zeros((1, 1)), clusters=1, use_scipy=False)
