"""Ward clustering of one text's token vectors, with flat clusters numbered as scipy numbers them.

sentence-transformers' HierarchicalTokenPooling (and PyLate's pool_factor) cluster with scipy's
`linkage(method="ward")` and `fcluster`. Which vectors share a cluster, and the clusters' numbers, decide the pooled
vectors and their order, so pooling must make scipy's choices, ties and rounding included. scipy makes them in C
where it is installed (the `token-pooling` extra). Where it is not (the torch-free serving images, which would
otherwise carry 140 MB of scipy for this alone), this module's numpy makes the same ones: the nearest-neighbour
chain scipy runs for Ward, its update in its order of operations, its sort and labels, then fcluster's cut and
numbering. tests/runtime/test_ward.py holds the two equal, tree for tree and label for label. numpy's clustering
is a Python step a merge, ~6x scipy's time (3.1 ms against 0.45 ms for 180 vectors, AMD EPYC), which makes pooling
a document ~4x slower (4.3 ms against 1.1 ms).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def flat_clusters(distances: np.ndarray, *, clusters: int | None = None, threshold: float | None = None,
                  use_scipy: bool | None = None) -> np.ndarray:
    """Each item's flat cluster, numbered from 1 as scipy's `fcluster` numbers them, from an [n, n] matrix of
    distances (its upper triangle is read, as scipy's `squareform(checks=False)` reads it), n >= 2: at most
    `clusters` of them (fcluster's "maxclust"), or those merged at heights up to `threshold` ("distance").
    `use_scipy`: None takes scipy where it is installed."""
    if (clusters is None) == (threshold is None):
        raise ValueError("give either clusters or threshold")
    if len(distances) < 2:
        raise ValueError("clustering needs at least two items")
    scipy_hierarchy = _scipy_hierarchy() if use_scipy is not False else None
    if use_scipy and scipy_hierarchy is None:
        raise ImportError("scipy is not installed")
    if scipy_hierarchy is not None:
        from scipy.spatial.distance import squareform

        tree = scipy_hierarchy.linkage(squareform(distances, checks=False), method="ward")
        if clusters is not None:
            return scipy_hierarchy.fcluster(tree, t=clusters, criterion="maxclust")
        return scipy_hierarchy.fcluster(tree, t=threshold, criterion="distance")
    tree = linkage(distances)
    heights = _subtree_heights(tree)
    if clusters is not None:
        if clusters >= len(distances):
            return np.arange(1, len(distances) + 1, dtype=np.int32)
        threshold = heights[_cut(heights, clusters)]
    return _numbered(tree, heights, float(threshold))


def _scipy_hierarchy() -> Any:
    try:
        from scipy.cluster import hierarchy
    except ImportError:
        return None
    return hierarchy


def linkage(distances: np.ndarray) -> np.ndarray:
    """scipy's `linkage(squareform(distances), method="ward")`, bit for bit: [n - 1, 4] rows of (cluster, cluster,
    height, size), by height, new clusters numbered n, n + 1, ... in that order."""
    count = len(distances)
    matrix = np.triu(np.asarray(distances, np.float64), 1)
    if not np.isfinite(matrix).all():
        raise ValueError("the distances to cluster must all be finite")
    matrix += matrix.T
    np.fill_diagonal(matrix, np.inf)  # a cluster is not its own neighbour; merged clusters become inf too
    sizes = np.ones(count)
    merges = np.empty((count - 1, 3))
    chain: list[int] = []
    update, scratch, weights = (np.empty(count) for _ in range(3))
    for step in range(count - 1):
        if not chain:
            chain.append(int(np.flatnonzero(sizes)[0]))
        while True:  # follow nearest neighbours until two are each other's, the chain's last one preferred on a tie
            x = chain[-1]
            row = matrix[x]
            nearest = int(np.argmin(row))
            if len(chain) > 1 and not row[nearest] < row[chain[-2]]:
                y = chain[-2]
                break
            chain.append(nearest)
        del chain[-2:]
        x, y = min(x, y), max(x, y)
        height, nx, ny = matrix[x, y], sizes[x], sizes[y]
        merges[step] = x, y, height
        sizes[x] = 0.0
        # Lance-Williams for Ward, for every cluster at once, each product in scipy's order so that the rounding is
        # its rounding: sqrt((ni + nx) t d_xi^2 + (ni + ny) t d_yi^2 - ni t d_xy^2), t = 1 / (nx + ny + ni)
        np.add(sizes, nx + ny, out=weights)
        np.divide(1.0, weights, out=weights)
        np.add(sizes, nx, out=update)
        update *= weights
        update *= matrix[x]
        update *= matrix[x]
        np.add(sizes, ny, out=scratch)
        scratch *= weights
        scratch *= matrix[y]
        scratch *= matrix[y]
        update += scratch
        np.multiply(sizes, weights, out=scratch)
        scratch *= height
        scratch *= height
        update -= scratch
        np.sqrt(update, out=update)  # merged clusters and x's own entry stay inf
        sizes[y] = nx + ny
        update[y] = np.inf
        matrix[y] = update
        matrix[:, y] = update
        matrix[x] = np.inf
        matrix[:, x] = np.inf
    return _labelled(merges[np.argsort(merges[:, 2], kind="mergesort")], count)


def _labelled(merges: np.ndarray, count: int) -> np.ndarray:
    """Merges of chain positions, by height -> scipy's rows: each side named by the cluster it now belongs to,
    the smaller number first, and the merged size."""
    tree = np.empty((count - 1, 4))
    parent = list(range(2 * count - 1))
    sizes = [1] * (2 * count - 1)
    for row, (a, b, height) in enumerate(merges.tolist()):
        a, b = _root(parent, int(a)), _root(parent, int(b))
        a, b = min(a, b), max(a, b)
        parent[a] = parent[b] = count + row
        sizes[count + row] = sizes[a] + sizes[b]
        tree[row] = a, b, height, sizes[count + row]
    return tree


def _root(parent: list[int], node: int) -> int:
    while parent[node] != node:
        node = parent[node]
    return node


def _subtree_heights(tree: np.ndarray) -> np.ndarray:
    """Each merge's highest height in its subtree: fcluster's monotonic criterion for "distance" and
    "maxclust"."""
    count = len(tree) + 1
    heights = tree[:, 2].copy()
    for row, (a, b) in enumerate(tree[:, :2].astype(int).tolist()):
        for child in (a, b):
            if child >= count:
                heights[row] = max(heights[row], heights[child - count])
    return heights


def _cut(heights: np.ndarray, clusters: int) -> int:
    """The merge whose height fcluster's "maxclust" cuts at: its bisection over the merges' rows for the first
    that leaves at most `clusters` (each merge at or under the cut joins two clusters into one)."""
    count = len(heights) + 1
    lower, upper = -1, count - 1
    while upper - lower > 1:
        middle = (lower + upper) >> 1
        if count - int(np.count_nonzero(heights <= heights[middle])) > clusters:
            lower = middle
        else:
            upper = middle
    return upper


def _numbered(tree: np.ndarray, heights: np.ndarray, threshold: float) -> np.ndarray:
    """fcluster's numbering: a walk from the root, the left side first, that numbers a cluster where it reaches
    the top of one (a merge at or under `threshold`) and a lone item where it leaves the merge above it; so a
    lone item on the left is numbered after the clusters of its right-hand side."""
    count = len(tree) + 1
    children = tree[:, :2].astype(int).tolist()
    labels = np.zeros(count, np.int32)
    number, leader = 0, -1
    visited = [False] * (2 * count - 1)
    stack = [count - 2]
    while stack:
        node = stack[-1]
        left, right = children[node]
        if leader == -1 and heights[node] <= threshold:
            leader = node
            number += 1
        if left >= count and not visited[left]:
            visited[left] = True
            stack.append(left - count)
            continue
        if right >= count and not visited[right]:
            visited[right] = True
            stack.append(right - count)
            continue
        for child in (left, right):
            if child < count:
                if leader == -1:
                    number += 1
                labels[child] = number
        if leader == node:
            leader = -1
        stack.pop()
    return labels
