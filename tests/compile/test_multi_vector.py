"""Multi-vector (ColBERT) models as sentence-transformers' MultiVectorEncoder saves them (BERT and ModernBERT bases),
and as PyLate saves them: every scored token's vector (queries expanded with [MASK], documents cut at their own
length and without punctuation) and MaxSim scores, on both CPU targets, against MultiVectorEncoder.encode_query /
encode_document and its own similarity."""

import sys

import numpy as np
import pytest

import tiny_models as tm
from artifact_runner import cosine_rows
from encoderrt import Engine
from encoderrt.compile.unpad import UNPADDED
from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.manifest import read_manifest

QUERIES = ["where is the amazon rainforest?", "fox", "café, naïve résumé",
           "the quick brown fox jumps over a lazy dog where is amazon rainforest basin south america"]  # cut at 16
DOCUMENTS = ["the amazon rainforest, covers much of the amazon basin of south america.",
             "der schnelle braune fuchs springt über den hund!", "café", "a", "東京 日本 首都",
             " ".join(["fox jumps over the lazy dog."] * 30)]  # cut at the documents' 40 tokens

VARIANTS = {
    "classic": {},  # fixed expansion to 16 tokens, not attended to; MaxSim
    "attended-min-mean-normalized": {"expansion": {"strategy": "min", "attend": True, "length": 8},
                                     "similarity": "meanmaxsim", "query_length": 12, "normalize": True},
    # GTE-ModernColBERT's base: no segment ids; a 32-token window, so each expansion token's window holds a real
    # token, as a real model's does (128 tokens; queries of 32)
    "modernbert": {"family": "modernbert", "local_attention": 32},
    # PyLate's layout: "[Q] " / "[D] " inserted tokens, fixed expansion to 16, Normalize implied, a residual Dense
    "pylate": {"use_residual": True},
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def colbert(request, tiny_dir):
    from sentence_transformers import MultiVectorEncoder

    build = tm.pylate_folder if request.param == "pylate" else tm.colbert_folder
    folder = build(tiny_dir / f"colbert-{request.param}", **VARIANTS[request.param])
    return folder, MultiVectorEncoder(str(folder), device="cpu")


def _vectors(reference, texts, side):
    encode = reference.encode_query if side == "query" else reference.encode_document
    return [v.numpy() for v in encode(texts)]


@pytest.mark.parametrize("target", ["cpu", "openvino"])
def test_token_vectors_match_multi_vector_encoder(target, colbert, compile_artifact, tmp_path):
    folder, reference = colbert
    result = compile_artifact(folder, tmp_path / "out", target=target)
    manifest = read_manifest(result.path)
    assert manifest.task == "multi_vector" and manifest.outputs == ("multi_vectors",)
    assert manifest.shape.output_dim == 24 and manifest.parity["min_cosine"] >= 0.99999
    assert manifest.fused_ops[UNPADDED]  # unattended expansion tokens are scored: their rows count as real too
    with Engine.load(result.path) as engine:
        for side, texts in (("query", QUERIES), ("document", DOCUMENTS)):
            got, expected = engine.embed_multi_vector(texts, side=side), _vectors(reference, texts, side)
            assert [g.shape for g in got] == [e.shape for e in expected]  # the same tokens kept
            assert cosine_rows(np.concatenate(got), np.concatenate(expected)).min() >= 0.99999
            np.testing.assert_allclose(np.concatenate(got), np.concatenate(expected), atol=1e-4)
        alone = [engine.embed_multi_vector(text, side="query")[0] for text in QUERIES]
        assert cosine_rows(np.concatenate(alone), np.concatenate(_vectors(reference, QUERIES, "query"))).min() >= 0.99999


def test_the_rules_each_side_follows(colbert, compile_artifact, tmp_path):
    """By hand: a document loses its punctuation and is cut at 40 tokens; a short query fills up to the expansion."""
    folder, reference = colbert
    manifest = read_manifest(compile_artifact(folder, tmp_path / "out").path)
    rules = manifest.multi_vector
    with Engine.load(tmp_path / "out") as engine:
        tokenizer = reference.tokenizer
        ids = tokenizer("[D] " + DOCUMENTS[0])["input_ids"]
        punctuation = sum(tokenizer.convert_ids_to_tokens(i) in ",.[]" for i in ids)
        # ", ." and, where "[D] " is no single token (PyLate's is), its brackets
        assert punctuation >= 2 and len(engine.embed_multi_vector(DOCUMENTS[0])[0]) == len(ids) - punctuation
        assert len(engine.embed_multi_vector(DOCUMENTS[-1])[0]) <= 40
        query = len(tokenizer("[Q] fox")["input_ids"])
        assert len(engine.embed_multi_vector("fox", side="query")[0]) == max(query, rules.expansion_length)


@pytest.mark.parametrize("target", ["cpu", "openvino"])
def test_maxsim_scores_and_rankings_match_sentence_transformers(target, colbert, compile_artifact, tmp_path):
    folder, reference = colbert
    result = compile_artifact(folder, tmp_path / "out", target=target)
    expected = reference.similarity(reference.encode_query(QUERIES), reference.encode_document(DOCUMENTS)).numpy()
    with Engine.load(result.path) as engine:
        got = np.array([engine.score(query, DOCUMENTS) for query in QUERIES])  # 1:N
        assert np.abs(got - expected).max() <= 1e-3, np.abs(got - expected).max()
        pairwise = engine.score(QUERIES, DOCUMENTS[: len(QUERIES)])  # N:N
        np.testing.assert_allclose(pairwise, np.diag(expected[:, : len(QUERIES)]), atol=1e-3)
        for query, row in zip(QUERIES, expected):
            ranked = engine.rerank(query, DOCUMENTS, top_n=3)
            assert [i for i, _ in ranked] == sorted(range(len(DOCUMENTS)), key=lambda i: -row[i])[:3]


def test_refusals_name_the_problem(colbert, compile_artifact, tmp_path, minilm_fp32):
    folder, _ = colbert
    with Engine.load(compile_artifact(folder, tmp_path / "out").path) as engine:
        with pytest.raises(InvalidRequest, match="embed is not available for this multi_vector model.*embed_multi_vector"):
            engine.embed(["fox"])
        with pytest.raises(InvalidRequest, match="side must be 'query' or 'document', got 'passage'"):
            engine.embed_multi_vector(["fox"], side="passage")
        with pytest.raises(InvalidRequest, match="unknown prompt_name 'nope'"):
            engine.embed_multi_vector(["fox"], prompt_name="nope")
    with Engine.load(minilm_fp32.path) as engine:
        with pytest.raises(InvalidRequest, match="embed_multi_vector is not available for this embed model"):
            engine.embed_multi_vector(["fox"])


def test_a_layout_it_does_not_compile_is_refused_by_name(colbert, tmp_path):
    """A Dense module after the mask (or a sentence-level Normalize) is no MultiVectorEncoder encoderrt compiles:
    one line naming the modules, and nothing written."""
    import json
    import shutil

    from encoderrt.compile import CompileOptions, InputError, compile_model

    folder = shutil.copytree(colbert[0], tmp_path / "reordered")
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps([modules[0], *modules[2:], modules[1]] if len(modules) > 2
                                                    else modules[::-1]))  # PyLate's Transformer -> Dense, reversed
    expected = ("are Transformer -> MultiVectorMask.* -> Dense; encoderrt compiles a MultiVectorEncoder" if len(modules) > 2
                else "are Dense -> Transformer; encoderrt compiles a PyLate ColBERT folder as Transformer -> Dense")
    with pytest.raises(InputError, match=expected):
        compile_model(CompileOptions(model_dir=folder, output_dir=tmp_path / "out", quiet=True))
    assert not (tmp_path / "out").exists()


POOLED = {"factor": {"pool_factor": 2}, "max-tokens": {"max_tokens": 6}, "threshold": {"distance_threshold": 0.05}}
"""sentence-transformers' HierarchicalTokenPooling settings, one way each of saying how far to pool."""


@pytest.fixture(scope="module")
def normalized_colbert(tiny_dir):
    """A ColBERT folder whose token vectors are of unit length, as token pooling expects them (cosine distances)."""
    return tm.colbert_folder(tiny_dir / "colbert-normalized", normalize=True)


def _pooling_folder(base, folder, **settings):
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.multi_vector_encoder.modules import HierarchicalTokenPooling

    model = MultiVectorEncoder(str(base), device="cpu")
    model.append(HierarchicalTokenPooling(**settings))
    model.save(str(folder))
    return folder


@pytest.mark.parametrize("pooling", list(POOLED))
def test_a_model_that_pools_its_documents_matches_multi_vector_encoder(pooling, normalized_colbert, compile_artifact,
                                                                      tmp_path, monkeypatch):
    """A MultiVectorEncoder saved with a HierarchicalTokenPooling after its mask and Normalize (sentence-transformers
    6.3) encodes documents to cluster means: the engine's documents are the same vectors, in the same order, and its
    scores and rankings MultiVectorEncoder's; queries are not pooled. Without scipy, the same vectors."""
    from sentence_transformers import MultiVectorEncoder

    folder = _pooling_folder(normalized_colbert, tmp_path / "pooled", **POOLED[pooling])
    reference, unpooled = MultiVectorEncoder(str(folder), device="cpu"), MultiVectorEncoder(str(normalized_colbert))
    result = compile_artifact(folder, tmp_path / "out", target="cpu")
    assert result.manifest.multi_vector.token_pooling is not None
    with Engine.load(result.path) as engine:
        got, expected = engine.embed_multi_vector(DOCUMENTS), _vectors(reference, DOCUMENTS, "document")
        assert [g.shape for g in got] == [e.shape for e in expected]
        np.testing.assert_allclose(np.concatenate(got), np.concatenate(expected), atol=1e-4)
        kept, every = sum(map(len, got)), sum(map(len, _vectors(unpooled, DOCUMENTS, "document")))
        assert kept <= 0.6 * every, (kept, every)  # it pooled
        queries = engine.embed_multi_vector(QUERIES, side="query")
        np.testing.assert_allclose(np.concatenate(queries), np.concatenate(_vectors(reference, QUERIES, "query")),
                                   atol=1e-4)
        scores = reference.similarity(reference.encode_query(QUERIES), reference.encode_document(DOCUMENTS)).numpy()
        got_scores = np.array([engine.score(query, DOCUMENTS) for query in QUERIES])
        assert np.abs(got_scores - scores).max() <= 1e-3
        for query, row in zip(QUERIES, scores):
            ranked = sorted(range(len(DOCUMENTS)), key=lambda i: -row[i])
            assert [i for i, _ in engine.rerank(query, DOCUMENTS)] == ranked
        # a request that pools its own way replaces the model's rule; 1 keeps every vector
        np.testing.assert_allclose(np.concatenate(engine.embed_multi_vector(DOCUMENTS, pool_factor=1)),
                                   np.concatenate(_vectors(unpooled, DOCUMENTS, "document")), atol=1e-4)
        with monkeypatch.context() as serving_install:  # runtime/ward.py's numpy in place of scipy's clustering
            serving_install.setitem(sys.modules, "scipy.cluster", None)
            np.testing.assert_array_equal(np.concatenate(engine.embed_multi_vector(DOCUMENTS)), np.concatenate(got))


def test_a_request_pools_documents_as_sentence_transformers_pools_per_call(normalized_colbert, compile_artifact,
                                                                           tmp_path, monkeypatch):
    """PyLate's pool_factor, sentence-transformers' per-call token pooling: a model without a pooling module pools
    a request's documents to the same cluster means, with scipy or without; what makes no sense is refused by
    name."""
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.multi_vector_encoder.modules import HierarchicalTokenPooling

    reference = MultiVectorEncoder(str(normalized_colbert), device="cpu")
    with Engine.load(compile_artifact(normalized_colbert, tmp_path / "out", target="cpu").path) as engine:
        for factor in (1.5, 2, 3):
            got = engine.embed_multi_vector(DOCUMENTS, pool_factor=factor)
            expected = [e.numpy() for e in reference.encode_document(
                DOCUMENTS, token_pooling=HierarchicalTokenPooling(pool_factor=factor))]
            assert [g.shape for g in got] == [e.shape for e in expected], factor
            np.testing.assert_allclose(np.concatenate(got), np.concatenate(expected), atol=1e-4)
            with monkeypatch.context() as serving_install:
                serving_install.setitem(sys.modules, "scipy.cluster", None)
                pooled = engine.embed_multi_vector(DOCUMENTS, pool_factor=factor)
                np.testing.assert_array_equal(np.concatenate(pooled), np.concatenate(got))
        refused = {0.5: "pool_factor must be a finite number of at least 1, got 0.5",
                   float("nan"): "pool_factor must be a finite number", "2": "pool_factor must be a number"}
        for factor, message in refused.items():
            with pytest.raises(InvalidRequest, match=message):
                engine.embed_multi_vector(DOCUMENTS, pool_factor=factor)
        with pytest.raises(InvalidRequest, match="pool_factor applies to documents"):
            engine.embed_multi_vector(QUERIES, side="query", pool_factor=2)


def test_matryoshka_widths_as_multi_vector_encoder_cuts_them(normalized_colbert, compile_artifact, tmp_path):
    """A folder saved with a truncate_dim (MultiVectorEncoder's) serves every vector cut to it and renormalised, on
    both sides and in its scores; a request's dimensions cut as encode's truncate_dim does, after pooling."""
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.multi_vector_encoder.modules import HierarchicalTokenPooling

    MultiVectorEncoder(str(normalized_colbert), device="cpu", truncate_dim=16).save(str(tmp_path / "cut"))
    reference = MultiVectorEncoder(str(tmp_path / "cut"), device="cpu")
    assert reference.truncate_dim == 16
    result = compile_artifact(tmp_path / "cut", tmp_path / "out", target="cpu")
    assert result.manifest.truncate_dim == 16
    with Engine.load(result.path) as engine:
        for side, texts in (("query", QUERIES), ("document", DOCUMENTS)):
            got, expected = engine.embed_multi_vector(texts, side=side), _vectors(reference, texts, side)
            assert {g.shape[1] for g in got} == {16}
            np.testing.assert_allclose(np.concatenate(got), np.concatenate(expected), atol=1e-4)
        scores = reference.similarity(reference.encode_query(QUERIES), reference.encode_document(DOCUMENTS)).numpy()
        assert np.abs(np.array([engine.score(query, DOCUMENTS) for query in QUERIES]) - scores).max() <= 1e-3
        got = engine.embed_multi_vector(DOCUMENTS, dimensions=8, pool_factor=2)
        expected = reference.encode_document(DOCUMENTS, truncate_dim=8,
                                             token_pooling=HierarchicalTokenPooling(pool_factor=2))
        assert [g.shape for g in got] == [tuple(e.shape) for e in expected]
        np.testing.assert_allclose(np.concatenate(got), np.concatenate([e.numpy() for e in expected]), atol=1e-4)
        for wrong in (0, 25, 2.5):
            with pytest.raises(InvalidRequest, match="dimensions must be an integer from 1 to 24"):
                engine.embed_multi_vector(DOCUMENTS, dimensions=wrong)


def test_a_pooling_module_it_cannot_serve_is_refused_by_name(normalized_colbert, tmp_path):
    """Pooling before the mask, or settings sentence-transformers itself would refuse, are no model encoderrt compiles:
    one line naming the module, nothing written."""
    import json

    from encoderrt.compile import CompileOptions, InputError, compile_model

    folder = _pooling_folder(normalized_colbert, tmp_path / "pooled", pool_factor=2)
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps([*modules[:2], modules[-1], *modules[2:-1]]))
    with pytest.raises(InputError, match="HierarchicalTokenPooling -> .*then at most one HierarchicalTokenPooling"):
        compile_model(CompileOptions(model_dir=folder, output_dir=tmp_path / "out", quiet=True))
    (folder / "modules.json").write_text(json.dumps(modules))
    settings = folder / modules[-1]["path"] / "config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "pool_factor": 2, "max_tokens": 8}))
    with pytest.raises(InputError, match="HierarchicalTokenPooling module in .*: pool_factor, max_tokens and "
                                         "distance_threshold each say how far to pool: give one"):
        compile_model(CompileOptions(model_dir=folder, output_dir=tmp_path / "out", quiet=True))
    assert not (tmp_path / "out").exists()


def test_compile_judges_documents_as_they_are_pooled(compile_artifact, tmp_path):
    """Compile's parity figures are those of the documents' pooled vectors, as served: a small error regroups
    clusters, which the token vectors' cosine hides (bf16 on this folder's probes: token vectors at min cosine 0.9992,
    pooled ones at 0.73). So bf16 is refused where its pooled vectors miss the tier, and where it is taken its recorded
    figure does not overstate what a user measures (on a CPU without native bf16 it runs fp32)."""
    from sentence_transformers import MultiVectorEncoder

    from encoderrt.compile.errors import ParityError
    from encoderrt.compile.parity import artifact_tokenizer, probe_texts

    # documents cut at the model's limit, as compile's probes are, so that a user's figure is over the same tokens
    whole = tm.colbert_folder(tmp_path / "colbert-whole", normalize=True, document_length=None)
    folder = _pooling_folder(whole, tmp_path / "pooled", pool_factor=2)
    reference = MultiVectorEncoder(str(folder), device="cpu")
    try:
        result = compile_artifact(folder, tmp_path / "bf16", target="openvino", precision="bf16")
    except ParityError as error:
        assert "min cosine" in str(error), error
        return
    # the probes as documents, without the document prompt (compile's probes are the texts alone)
    texts = probe_texts(artifact_tokenizer(result.manifest, result.path))
    expected = reference.encode_document(texts, prompt="")
    with Engine.load(result.path) as engine:
        served = engine.embed_multi_vector(texts, prompt="")
    cosines = [(ours * theirs.numpy()).sum(1).min() for ours, theirs in zip(served, expected) if len(ours)]
    recorded = result.manifest.parity["min_cosine"]
    assert recorded <= min(cosines) + 5e-3, (recorded, min(cosines))  # batches of other shapes round otherwise
