import numpy as np
from scipy.stats import spearmanr

from encoderrt.compile.parity import compare, spearman


def test_spearman_matches_scipy():
    rng = np.random.default_rng(0)
    a = rng.normal(size=50)
    b = a + rng.normal(scale=0.5, size=50)
    b[:5] = b[5]  # ties
    assert abs(spearman(a, b) - spearmanr(a, b).statistic) < 1e-12


def test_compare_reports_worst_run():
    reference = np.eye(3, dtype=np.float32) + 0.1
    figures, failures = compare("embed", "fp32", reference, [reference, reference + np.array([[0, 0.5, 0], [0, 0, 0], [0, 0, 0]])])
    assert figures["min_cosine"] < 0.99 and failures and "min cosine" in failures[0]
