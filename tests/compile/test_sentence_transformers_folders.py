"""What a sentence-transformers folder says, compiled into the graph: every pooling mode, Dense modules after
pooling, every score activation; checked against sentence-transformers itself at fp32 tolerances."""

import numpy as np
import pytest
import torch

import tiny_models as tm
from artifact_runner import cosine_rows
from encoderrt import Engine
from encoderrt.compile import InputError
from encoderrt.runtime.manifest import POOLINGS

TEXTS = ["search query", "the quick brown fox jumps over a lazy dog", "привет мир", "x", "größe café 東京",
         " ".join(["rank score"] * 80)]


def _embed(artifact, texts):
    with Engine.load(artifact) as engine:
        return engine.embed(texts)


@pytest.mark.parametrize("pooling", POOLINGS)
def test_every_pooling_mode_matches_sentence_transformers(pooling, tiny_dir, compile_artifact, tmp_path):
    from sentence_transformers import SentenceTransformer

    folder = tm.sentence_transformers_folder(tiny_dir / f"pooling-{pooling}", pooling=pooling, normalize=False)
    result = compile_artifact(folder, tmp_path / "artifact")
    assert result.manifest.pooling == pooling and result.manifest.parity["reference"].startswith("sentence-transformers")
    reference = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    embeddings = _embed(result.path, TEXTS)
    assert cosine_rows(embeddings, reference).min() >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), np.linalg.norm(reference, axis=1), rtol=1e-4)


def test_pooling_modes_differ(tiny_dir, compile_artifact, tmp_path):
    """Each mode computes something of its own on the same encoder (the comparisons above would not notice a mode
    silently mapped to another)."""
    outputs = {}
    for pooling in POOLINGS:
        folder = tm.sentence_transformers_folder(tiny_dir / f"pooling-{pooling}", pooling=pooling, normalize=False)
        outputs[pooling] = _embed(compile_artifact(folder, tmp_path / pooling).path, TEXTS[:3])
    for a in POOLINGS:
        for b in POOLINGS:
            if a < b:
                assert not np.allclose(outputs[a], outputs[b], atol=1e-3), (a, b)


@pytest.mark.parametrize("target", ["cpu", "openvino"])
def test_dense_modules_after_pooling(target, tiny_dir, compile_artifact, tmp_path):
    from sentence_transformers import SentenceTransformer

    folder = tm.sentence_transformers_folder(tiny_dir / "st-dense", pooling="mean", normalize=True,
                                             dense=((48, "Tanh"), (24, "Identity")))
    result = compile_artifact(folder, tmp_path / "artifact", target=target)
    assert result.manifest.shape.output_dim == 24
    model = SentenceTransformer(str(folder), device="cpu")
    embeddings = _embed(result.path, TEXTS)
    assert embeddings.shape == (len(TEXTS), 24)
    assert cosine_rows(embeddings, model.encode(TEXTS)).min() >= 0.99999
    with Engine.load(result.path) as engine:  # matryoshka dimensions cut the Dense output, then normalise
        cut = engine.embed(TEXTS, dimensions=8)
    reference = model.encode(TEXTS, normalize_embeddings=False)[:, :8]
    assert cosine_rows(cut, reference).min() >= 0.99999


def test_modules_out_of_order_are_named(tiny_dir, tmp_path, compile_artifact):
    import json
    import shutil

    folder = shutil.copytree(tm.sentence_transformers_folder(tiny_dir / "st-dense", pooling="mean", normalize=True,
                                                             dense=((48, "Tanh"), (24, "Identity"))), tmp_path / "shuffled")
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps([modules[0], modules[2], modules[1], *modules[3:]]))
    with pytest.raises(InputError, match="Transformer -> Dense -> Pooling"):
        compile_artifact(folder, tmp_path / "artifact")
    assert not (tmp_path / "artifact").exists()


@pytest.mark.parametrize("activation", ["Tanh", "ReLU", "Identity", "Sigmoid"])
def test_every_score_activation_matches_cross_encoder(activation, tiny_models, compile_artifact, tmp_path):
    from sentence_transformers import CrossEncoder

    folder = tmp_path / "ce"
    CrossEncoder(str(tiny_models["bert-cross-encoder"]), device="cpu",
                 activation_fn=getattr(torch.nn, activation)()).save_pretrained(str(folder))
    result = compile_artifact(folder, tmp_path / "artifact")
    assert result.manifest.activation == activation.lower()
    reference = CrossEncoder(str(folder), device="cpu", max_length=result.manifest.max_length).predict(tm.PAIRS)
    with Engine.load(result.path) as engine:
        scores = engine.score([q for q, _ in tm.PAIRS], [d for _, d in tm.PAIRS])
    np.testing.assert_allclose(scores, reference, atol=1e-3)


@pytest.mark.parametrize("pooling", ["mean_sqrt_len_tokens", "lasttoken"])
def test_legacy_pooling_flags_are_read(pooling, tiny_dir, compile_artifact, tmp_path):
    """sentence-transformers < 5 wrote one boolean per mode; the same folder in that form compiles the same."""
    import json
    import shutil

    from encoderrt.compile.pooling import LEGACY_FLAGS

    folder = shutil.copytree(tm.sentence_transformers_folder(tiny_dir / f"pooling-{pooling}", pooling=pooling), tmp_path / "legacy")
    config_path = next(folder.glob("1_Pooling*/config.json"))
    config = json.loads(config_path.read_text())
    config.pop("pooling_mode")
    config.update({flag: mode == pooling for flag, mode in LEGACY_FLAGS.items()})
    config_path.write_text(json.dumps(config))
    assert compile_artifact(folder, tmp_path / "artifact").manifest.pooling == pooling


def test_combined_pooling_modes_are_named(tiny_dir, compile_artifact, tmp_path):
    import json
    import shutil

    folder = shutil.copytree(tm.sentence_transformers_folder(tiny_dir / "pooling-cls", pooling="cls"), tmp_path / "combined")
    config_path = next(folder.glob("1_Pooling*/config.json"))
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "pooling_mode": ["cls", "mean"]}))
    with pytest.raises(InputError, match="pooling mode 'cls\\+mean'.*supports one of cls, mean, max"):
        compile_artifact(folder, tmp_path / "artifact")


@pytest.mark.parametrize(("similarity", "normalize"), [("cosine", False), ("dot", False), ("euclidean", True),
                                                       ("manhattan", False)])
def test_an_embedding_model_scores_by_its_folders_similarity(similarity, normalize, tiny_dir, compile_artifact,
                                                             tmp_path):
    """score and rerank with an embedding model give what its SentenceTransformer's `similarity` gives, on the
    embeddings as encode returns them (normalised where the folder normalises): a dot-product model ranks by dot
    product, not by cosine."""
    from sentence_transformers import SentenceTransformer

    folder = tm.sentence_transformers_folder(tiny_dir / f"st-{similarity}", pooling="mean", normalize=normalize,
                                             similarity_fn_name=similarity)
    result = compile_artifact(folder, tmp_path / "artifact")
    assert result.manifest.similarity == similarity
    model = SentenceTransformer(str(folder), device="cpu")
    assert model.similarity_fn_name == similarity
    query, documents = TEXTS[0], TEXTS[1:]
    reference = model.similarity(model.encode([query]), model.encode(documents))[0].numpy()
    with Engine.load(result.path) as engine:
        assert engine.info.similarity == similarity
        scores = np.array(engine.score(query, documents))
        ranked = engine.rerank(query, documents)
        pairwise = engine.score(documents[:2], documents[2:4])
    np.testing.assert_allclose(scores, reference, rtol=1e-4, atol=1e-4)
    assert [i for i, _ in ranked] == list(np.argsort(-reference, kind="stable"))
    pairwise_reference = model.similarity_pairwise(model.encode(documents[:2]), model.encode(documents[2:4]))
    np.testing.assert_allclose(pairwise, pairwise_reference, rtol=1e-4, atol=1e-4)
    if similarity != "cosine":  # the scores are the folder's similarity, not cosine under another name
        cosine = cosine_rows(np.repeat(model.encode([query]), len(documents), axis=0), model.encode(documents))
        assert not np.allclose(scores, cosine, atol=1e-2)


def test_a_similarity_an_embedding_model_does_not_take_leaves_cosine(tiny_dir, compile_artifact, tmp_path):
    """A multi-vector save's "maxsim" in a dense folder: sentence-transformers keeps cosine, and so does compile,
    saying so."""
    import json
    import shutil

    from sentence_transformers import SentenceTransformer

    from encoderrt.compile import CompileOptions
    from encoderrt.compile.source import inspect_source

    dot = tm.sentence_transformers_folder(tiny_dir / "st-dot", pooling="mean", similarity_fn_name="dot")
    folder = shutil.copytree(dot, tmp_path / "maxsim")
    config_path = folder / "config_sentence_transformers.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "similarity_fn_name": "maxsim"}))
    source = inspect_source(CompileOptions(model_dir=folder, output_dir=tmp_path / "unused"))
    assert source.similarity == "cosine" and any("'maxsim'" in note for note in source.notes)
    assert SentenceTransformer(str(folder), device="cpu").similarity_fn_name == "cosine"


def test_a_folders_truncate_dim_is_the_default_width(tiny_dir, compile_artifact, tmp_path):
    """A folder saved with truncate_dim embeds at that width, as SentenceTransformer.encode does, and a request may
    still ask for more of the model's dimensions (encode's own truncate_dim)."""
    import json
    import shutil

    from sentence_transformers import SentenceTransformer

    from encoderrt.compile import CompileOptions
    from encoderrt.compile.source import inspect_source

    folder = tm.sentence_transformers_folder(tiny_dir / "st-mean", pooling="mean")
    truncated = shutil.copytree(folder, tmp_path / "truncated")
    config_path = truncated / "config_sentence_transformers.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "truncate_dim": 12}))
    model = SentenceTransformer(str(truncated), device="cpu")
    assert model.truncate_dim == 12
    result = compile_artifact(truncated, tmp_path / "artifact")
    assert result.manifest.truncate_dim == 12
    with Engine.load(result.path) as engine:
        assert engine.info.dimensions == 12
        default, wider = engine.embed(TEXTS), engine.embed(TEXTS, dimensions=20)
        scores = engine.score(TEXTS[0], TEXTS[1:])
    assert default.shape == (len(TEXTS), 12) and wider.shape == (len(TEXTS), 20)
    np.testing.assert_allclose(default, model.encode(TEXTS), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(wider, model.encode(TEXTS, truncate_dim=20), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(scores, model.similarity(model.encode(TEXTS[:1]), model.encode(TEXTS[1:]))[0], atol=1e-5)
    for bad in (0, 10_000, "12"):
        config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "truncate_dim": bad}))
        with pytest.raises(InputError, match="truncate_dim .* is not a width from 1 to"):
            inspect_source(CompileOptions(model_dir=truncated, output_dir=tmp_path / "unused"))


def test_a_transformer_saved_with_do_lower_case_lowercases_texts_first(tiny_dir, compile_artifact, tmp_path):
    """do_lower_case in sentence_bert_config.json over a cased tokenizer (CamemBERT's Unigram): sentence-transformers
    lowercases texts before tokenising, and the artifact's tokenizer does too (compile's parity refused it before)."""
    import json

    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    folder = tm.sentence_transformers_folder(tiny_dir / "camembert-do-lower-case", "mean", family="camembert")
    config_path = folder / "sentence_bert_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "do_lower_case": True}))
    texts = ["The Quick Brown FOX", "PARIS and Rome", "ÜBER GRÖSSE Café", "x", *TEXTS]
    cased = AutoTokenizer.from_pretrained(folder)
    assert cased(texts[:3])["input_ids"] != cased([t.lower() for t in texts[:3]])["input_ids"]  # lowercasing matters
    expected = SentenceTransformer(str(folder), device="cpu").encode(texts)
    result = compile_artifact(folder, tmp_path / "artifact")
    with Engine.load(result.path) as engine:
        got = engine.embed(texts)
        lowered = cased([text.lower() for text in texts[:3]])["input_ids"]
        assert engine.count_tokens(texts[:3]) == sum(map(len, lowered))
    assert cosine_rows(np.asarray(got), expected).min() >= 0.99999
