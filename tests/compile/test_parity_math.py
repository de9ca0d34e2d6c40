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


def test_nan_outputs_fail_parity():
    """NaN compares false with every limit, so a graph that emits NaN (a fully masked padded row) must be named."""
    reference = np.eye(3, dtype=np.float32) + 0.1
    broken = reference.copy()
    broken[1, 0] = np.nan
    figures, failures = compare("embed", "fp32", reference, [reference, broken])
    assert figures["non_finite"] == 1 and failures == ["1 outputs are NaN or infinite"]
    logits = np.array([[0.5], [1.5], [-0.3]], dtype=np.float32)
    _, failures = compare("score", "fp32", logits, [np.where(logits > 1, np.inf, logits)], activation="sigmoid")
    assert "1 outputs are NaN or infinite" in failures


def test_a_multi_vector_model_is_lossless_only_where_its_maxsim_rankings_hold():
    """Token vectors as rows, `lengths` of them per probe: the lossless tier asks each probe, as a query, to rank the
    probes as the reference does (by hand: probe 0's best match moves from probe 1 to probe 2)."""
    e = np.eye(4, dtype=np.float32)
    reference = np.stack([e[0], e[1] + 0.30 * e[0], e[2] + 0.29 * e[0], e[3]])  # one vector per probe
    figures, _ = compare("multi_vector", "bf16", reference, [reference * 1.0], lengths=[1, 1, 1, 1])
    assert figures["spearman"] == 1.0 and figures["lossless"] is True
    swapped = reference.copy()
    swapped[2] = e[2] + 0.31 * e[0]  # now probe 2 outscores probe 1 against probe 0, its vector turned 0.02 rad
    figures, failures = compare("multi_vector", "bf16", reference, [swapped], lengths=[1, 1, 1, 1])
    assert figures["spearman"] < 0.999 and figures["lossless"] is False and not failures  # bf16's own tolerance holds


def test_probes_cut_to_the_same_tokens_are_one_document_in_the_rankings():
    """Probes past the limit are cut to the same tokens and tie in the reference: a candidate's order between them
    is no ranking change (by hand: probes 2 and 3 are one document; the candidate puts 3 a hair above 2)."""
    e = np.eye(3, dtype=np.float32)
    reference = np.stack([e[0], e[1] + 0.5 * e[0], e[2] + 0.3 * e[0], e[2] + 0.3 * e[0]])
    candidate = reference.copy()
    candidate[3] = e[2] + 0.3001 * e[0]
    figures, _ = compare("multi_vector", "bf16", reference, [candidate], lengths=[1, 1, 1, 1])
    assert figures["spearman"] == 1.0 and figures["lossless"] is True
    candidate[2] = e[2] + 0.6 * e[0]  # a real swap: probe 2 now outranks probe 1 against probe 0
    figures, _ = compare("multi_vector", "bf16", reference, [candidate], lengths=[1, 1, 1, 1])
    assert figures["spearman"] < 0.999 and figures["lossless"] is False
