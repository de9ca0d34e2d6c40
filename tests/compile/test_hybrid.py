"""bge-m3-shaped folders (an XLM-R sentence-transformers model with FlagEmbedding's colbert_linear.pt and
sparse_linear.pt): the dense vector, the lexical weights and the colbert vectors from one pass, and the hybrid score,
on both CPU targets, against bge-m3's published formulas in plain PyTorch (tests/bge_m3_reference.py)."""

import numpy as np
import pytest
from bge_m3_reference import hybrid_score, reference

import tiny_models as tm
from artifact_runner import cosine_rows
from encoderrt import Engine
from encoderrt.compile.errors import InputError
from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.manifest import read_manifest

QUERIES = ["where is the amazon rainforest?", "fox", "la la la la"]
DOCUMENTS = ["the amazon rainforest covers much of the amazon basin of south america.",
             "der schnelle braune fuchs springt über den hund!", "café naïve résumé", "a", "东京 日本 首都",
             " ".join(["the quick brown fox jumps over the lazy dog."] * 20)]  # cut at the model's 48 tokens


@pytest.fixture(scope="module")
def bge_m3(tiny_dir):
    return tm.bge_m3_folder(tiny_dir / "bge-m3", colbert_dim=24)


@pytest.mark.parametrize("target", ["cpu", "openvino"])
def test_the_three_outputs_match_bge_m3s_formulas(target, bge_m3, compile_artifact, tmp_path):
    result = compile_artifact(bge_m3, tmp_path / "out", target=target, precision="fp32")
    manifest = read_manifest(result.path)
    assert manifest.task == "hybrid" and manifest.pooling == "cls" and manifest.normalize
    assert manifest.outputs == ("embeddings", "token_embeddings", "lexical_weights", "multi_vectors")
    assert manifest.parity["lexical_weights"]["max_abs_logit_diff"] <= 1e-3
    assert manifest.parity["multi_vectors"]["min_cosine"] >= 0.99999
    texts = QUERIES + DOCUMENTS
    expected = reference(bge_m3, texts)
    with Engine.load(result.path) as engine:
        got = engine.embed_hybrid(texts)
        assert cosine_rows(np.stack([g.dense for g in got]), np.stack([e[0] for e in expected])).min() >= 0.99999
        for embedding, (_, lexical, colbert) in zip(got, expected):
            assert dict(embedding.sparse).keys() == lexical.keys()  # the same token ids weighted
            assert max((abs(w - lexical[i]) for i, w in embedding.sparse), default=0.0) <= 1e-4
            assert [w for _, w in embedding.sparse] == sorted((w for _, w in embedding.sparse), reverse=True)
            assert embedding.colbert.shape == colbert.shape  # every token but the CLS
            assert cosine_rows(embedding.colbert, colbert).min() >= 0.99999
        assert sum(len(g.sparse) for g in got) > 3 * len(texts)
        # each representation alone, through the verbs other models answer, is the same
        np.testing.assert_allclose(engine.embed(texts), np.stack([g.dense for g in got]), atol=1e-6)
        for alone, embedding in zip(engine.embed_sparse(texts, top_k=3), got):
            assert _same_weights(alone, embedding.sparse[:3])
        for alone, embedding in zip(engine.embed_multi_vector(texts), got):
            np.testing.assert_allclose(alone, embedding.colbert, atol=1e-6)
        only = engine.embed_hybrid(texts[:2], outputs=["sparse"])
        assert only[0].dense is None and only[0].colbert is None and _same_weights(only[0].sparse, got[0].sparse)


def _same_weights(a, b):
    """The same token ids, weights equal up to a batch's summation order."""
    return [i for i, _ in a] == [i for i, _ in b] and np.allclose([w for _, w in a], [w for _, w in b], atol=1e-5)


def test_the_dense_vector_is_sentence_transformers(bge_m3, compile_artifact, tmp_path):
    from sentence_transformers import SentenceTransformer

    expected = SentenceTransformer(str(bge_m3), device="cpu").encode(DOCUMENTS)
    with Engine.load(compile_artifact(bge_m3, tmp_path / "out", target="cpu", precision="fp32").path) as engine:
        assert cosine_rows(engine.embed(DOCUMENTS), expected).min() >= 0.99999


@pytest.mark.parametrize("target", ["cpu", "openvino"])
def test_hybrid_scores_and_rankings_match_the_formulas(target, bge_m3, compile_artifact, tmp_path):
    result = compile_artifact(bge_m3, tmp_path / "out", target=target, precision="fp32")
    queries, documents = reference(bge_m3, QUERIES), reference(bge_m3, DOCUMENTS)
    expected = np.array([[hybrid_score(q, d) for d in documents] for q in queries])
    with Engine.load(result.path) as engine:
        got = np.array([engine.score(query, DOCUMENTS) for query in QUERIES])
        assert np.abs(got - expected).max() <= 1e-3
        assert (np.argsort(-got, axis=1) == np.argsort(-expected, axis=1)).all()
        pairwise = engine.score(QUERIES, DOCUMENTS[:3])
        np.testing.assert_allclose(pairwise, [expected[i, i] for i in range(3)], atol=1e-3)
        ranked = engine.rerank(QUERIES[0], DOCUMENTS, top_n=3)
        assert [i for i, _ in ranked] == list(np.argsort(-expected[0], kind="stable")[:3])
        for weights in ({"sparse": 1.0}, {"dense": 1.0, "colbert": 3.0}):
            order = tuple(weights.get(kind, 0.0) for kind in ("dense", "sparse", "colbert"))
            mine = engine.score(QUERIES[0], DOCUMENTS, hybrid_weights=weights)
            np.testing.assert_allclose(mine, [hybrid_score(queries[0], d, order) for d in documents], atol=1e-3)


def test_bf16_moves_no_ranking_past_its_rounding(bge_m3, compile_artifact, tmp_path):
    """bf16 (where the CPU has it; f32 elsewhere): scores within 0.01 of the formulas', and no two documents swapped
    whose scores differ by more than twice that error. (The issue's Spearman >= 0.999 needs a trained bge-m3: this
    random checkpoint scores most documents within 0.005 of each other, and bf16 reorders those near-ties.)"""
    result = compile_artifact(bge_m3, tmp_path / "out", target="openvino", precision="bf16")
    queries, documents = reference(bge_m3, QUERIES), reference(bge_m3, DOCUMENTS + QUERIES)
    with Engine.load(result.path) as engine:
        for text, query in zip(QUERIES, queries):
            expected = np.array([hybrid_score(query, document) for document in documents])
            got = np.array(engine.score(text, DOCUMENTS + QUERIES))
            error = np.abs(got - expected).max()
            assert error <= 1e-2
            apart = np.abs(expected[:, None] - expected[None, :]) > 2 * error
            assert (np.sign(got[:, None] - got[None, :]) == np.sign(expected[:, None] - expected[None, :]))[apart].all()


def test_one_run_per_text_whatever_the_outputs(bge_m3, compile_artifact, tmp_path):
    """Asking for all three representations runs each text's row once, as asking for the dense vector does."""
    with Engine.load(compile_artifact(bge_m3, tmp_path / "out", target="cpu", precision="fp32").path) as engine:
        tokens = sum(len(engine.tokenize(text)) for text in DOCUMENTS)
        before = engine.stats.snapshot()["real_tokens"]
        engine.embed_hybrid(DOCUMENTS)
        assert engine.stats.snapshot()["real_tokens"] - before == tokens


def test_bad_requests_name_the_problem(bge_m3, compile_artifact, tmp_path, tiny_artifacts):
    with Engine.load(compile_artifact(bge_m3, tmp_path / "out", target="cpu", precision="fp32").path) as engine:
        with pytest.raises(InvalidRequest, match="outputs must be a non-empty list of dense, sparse, colbert"):
            engine.embed_hybrid(["a"], outputs=["dense", "lexical"])
        with pytest.raises(InvalidRequest, match="outputs must be"):
            engine.embed_hybrid(["a"], outputs=[])
        with pytest.raises(InvalidRequest, match=r"hybrid_weights\['sparse'\] must be a number of at least 0"):
            engine.score("a", ["b"], hybrid_weights={"sparse": -1})
        with pytest.raises(InvalidRequest, match="at least one of dense, sparse and colbert a weight above 0"):
            engine.score("a", ["b"], hybrid_weights={"dense": 0})
        with pytest.raises(InvalidRequest, match="hybrid_weights maps dense, sparse, colbert"):
            engine.rerank("a", ["b"], hybrid_weights={"bm25": 1})
    with Engine.load(tiny_artifacts["st-cls"]) as plain:
        with pytest.raises(InvalidRequest, match="hybrid_weights apply to a hybrid"):
            plain.score("a", ["b"], hybrid_weights={"dense": 1})
        with pytest.raises(InvalidRequest, match="embed_hybrid is not available for this embed model"):
            plain.embed_hybrid(["a"])


def test_task_embed_compiles_the_dense_output_alone(bge_m3, compile_artifact, tmp_path):
    manifest = read_manifest(compile_artifact(bge_m3, tmp_path / "out", target="cpu", precision="fp32", task="embed").path)
    assert manifest.task == "embed" and manifest.outputs == ("embeddings", "token_embeddings")


def test_broken_heads_are_refused_by_name(bge_m3, tmp_path):
    import shutil

    import torch

    from encoderrt.compile.options import CompileOptions
    from encoderrt.compile.pipeline import compile_model

    half = shutil.copytree(bge_m3, tmp_path / "half")
    (half / "sparse_linear.pt").unlink()
    with pytest.raises(InputError, match="has colbert_linear.pt but not sparse_linear.pt"):
        compile_model(CompileOptions(model_dir=half, output_dir=tmp_path / "a", target="cpu", precision="fp32"))
    wrong = shutil.copytree(bge_m3, tmp_path / "wrong")
    torch.save(torch.nn.Linear(7, 1).state_dict(), wrong / "sparse_linear.pt")
    with pytest.raises(InputError, match="is not a Linear head on the encoder's 32-wide states"):
        compile_model(CompileOptions(model_dir=wrong, output_dir=tmp_path / "b", target="cpu", precision="fp32"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
