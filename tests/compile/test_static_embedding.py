"""Static embedding models (model2vec's potion, static-retrieval-mrl): a sentence-transformers folder whose
StaticEmbedding averages its tokens' vectors compiles to target "static" and serves as sentence-transformers encodes,
on the engine and over HTTP."""

import json

import httpx
import numpy as np
import pytest

import tiny_models as tm
from artifact_runner import cosine_rows
from encoderrt import Engine
from encoderrt.compile import CompileOptions, InputError, compile_model
from encoderrt.runtime.errors import InvalidRequest
from encoderrt.server import ServerSettings, create_app
from server_helpers import ready_registry, running_server

TEXTS = ["search query", "the quick brown fox jumps over a lazy dog", "привет мир", "x", "größe café 東京",
         "fox fox fox dog", " ".join(tm.CORPUS_WORDS)]


@pytest.mark.parametrize("model2vec", [False, True], ids=["sentence-transformers", "model2vec-quantised"])
def test_a_static_model_embeds_as_sentence_transformers_encodes(model2vec, tiny_dir, compile_artifact, tmp_path):
    """The mean of each text's token vectors without special tokens (model2vec's shared rows and per-token weights
    folded in, as sentence-transformers loads them), normalised, zeros for an empty text; prompts, Matryoshka
    dimensions and similarity as for any embedding model; OpenAI's and TEI's routes."""
    from sentence_transformers import SentenceTransformer

    folder = tm.static_embedding_folder(tiny_dir / f"static-{model2vec}", model2vec=model2vec,
                                        prompts={"query": "search query: "}, similarity_fn_name="dot")
    model = SentenceTransformer(str(folder), device="cpu")
    result = compile_artifact(folder, tmp_path / "artifact")
    manifest = result.manifest
    assert (manifest.target, manifest.precision, manifest.task, manifest.normalize) == ("static", "fp32", "embed", True)
    assert manifest.parity["min_cosine"] >= 0.99999 and manifest.parity["reference"].startswith("sentence-transformers")
    expected, queries = model.encode(TEXTS), model.encode(TEXTS, prompt_name="query")
    assert cosine_rows(expected, queries).min() < 0.99  # the prompt changes the vectors
    with Engine.load(result.path) as engine:
        assert engine.info.execution.startswith("numpy")
        np.testing.assert_allclose(engine.embed(TEXTS), expected, atol=1e-6)
        np.testing.assert_allclose(engine.embed(TEXTS, prompt_name="query"), queries, atol=1e-6)
        short = np.asarray(engine.embed(TEXTS, dimensions=8))
        np.testing.assert_allclose(short, expected[:, :8] / np.linalg.norm(expected[:, :8], axis=1, keepdims=True),
                                   atol=1e-6)
        np.testing.assert_allclose(engine.score(TEXTS[0], TEXTS[1:]), model.similarity(expected[:1], expected[1:])[0],
                                   atol=1e-5)
        # an empty text: the mean of no vectors, zeros, as StaticEmbedding's EmbeddingBag gives, batched with others
        np.testing.assert_allclose(engine.embed(["", TEXTS[0], ""]), model.encode(["", TEXTS[0], ""]), atol=1e-6)
        assert not np.asarray(engine.embed([""])).any()
        settings = ServerSettings()
        with running_server(create_app(settings, ready_registry(static=engine)), settings) as url, \
                httpx.Client(base_url=url, timeout=30) as http:
            openai = http.post("/v1/embeddings", json={"input": TEXTS, "model": "static"}).json()
            tei = http.post("/embed", json={"inputs": TEXTS, "prompt_name": "query"}).json()
    np.testing.assert_allclose([row["embedding"] for row in openai["data"]], expected, atol=1e-6)
    assert openai["usage"]["prompt_tokens"] == sum(len(model.tokenize([t])["input_ids"]) for t in TEXTS)
    np.testing.assert_allclose(tei, queries, atol=1e-6)


def test_a_static_model_cuts_texts_at_its_limit_or_reads_them_whole_in_chunks(tiny_dir, compile_artifact, tmp_path):
    """sentence-transformers reads a text whole; the artifact cuts it at max_length (--max-length), as every encoderrt
    model does, and truncate=False refuses it by name. Chunked long inputs (--long-inputs chunk) merge by token
    count, which for a mean of token vectors is the whole text's mean: sentence-transformers' vector at any length."""
    from sentence_transformers import SentenceTransformer

    folder = tm.static_embedding_folder(tiny_dir / "static-limit", prompts={"query": "search query: "},
                                        similarity_fn_name="dot")
    result = compile_artifact(folder, tmp_path / "artifact", max_length=6)
    model = SentenceTransformer(str(folder), device="cpu")
    long_texts = [" ".join(tm.CORPUS_WORDS), " ".join(tm.CORPUS_WORDS[::-1][:9]), "x"]
    whole = model.encode(long_texts)
    model[0].tokenizer.enable_truncation(6)
    with Engine.load(result.path) as engine:
        np.testing.assert_allclose(engine.embed(long_texts), model.encode(long_texts), atol=1e-6)
        with pytest.raises(InvalidRequest, match="above the model's limit of 6 tokens"):
            engine.embed(long_texts, truncate=False)
    with Engine.load(result.path, long_inputs="chunk") as engine:
        np.testing.assert_allclose(engine.embed(long_texts), whole, atol=1e-6)


def test_what_a_static_model_cannot_be_compiled_to_is_refused_by_name(tiny_dir, tmp_path):
    import shutil

    folder = tm.static_embedding_folder(tiny_dir / "static-refusals")
    for flags, named in ((dict(precision="int8"), "--precision"), (dict(target="openvino"), "--target"),
                         (dict(pooling="cls"), "--pooling"), (dict(task="score"), "--task")):
        with pytest.raises(InputError, match=f"{named}: a static embedding model has one way to run"):
            compile_model(CompileOptions(folder, tmp_path / "out", quiet=True, **flags))
    dense = shutil.copytree(folder, tmp_path / "with-dense")
    modules = json.loads((dense / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (dense / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(InputError, match="StaticEmbedding -> Normalize -> Dense; encoderrt compiles a static"):
        compile_model(CompileOptions(dense, tmp_path / "out", quiet=True))
    broken = shutil.copytree(folder, tmp_path / "broken-tokenizer")
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(InputError, match="cannot load the StaticEmbedding in .*broken-tokenizer: key must be a string"):
        compile_model(CompileOptions(broken, tmp_path / "out", quiet=True))
    assert not (tmp_path / "out").exists()


def test_the_bench_measures_a_static_model_against_sentence_transformers(tiny_dir, compile_artifact, tmp_path,
                                                                         capsys):
    """A static model multiplies no matrices: the report has no GEMM ceiling to hold it to, and its reference is
    SentenceTransformer.encode cut where the artifact cuts."""
    from encoderrt.cli import main

    folder = tm.static_embedding_folder(tiny_dir / "static-bench")
    artifact = compile_artifact(folder, tmp_path / "artifact").path
    out = tmp_path / "report"
    code = main(["bench", str(artifact), "--workload", "passages", "--mode", "engine", "--concurrency", "2",
                 "--duration", "0.3", "--scale", "0.1", "--reference", "torch", "--out", str(out)])
    assert code == 0, capsys.readouterr().err[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["ceilings"] == [] and report["flops_per_token"]["passages"] == 0
    (row,) = report["results"]
    assert row["tokens_per_s"] > 0 and row["ratio_to_reference"] > 0 and row["ceiling_fraction"] is None
    assert "No GEMM ceiling: the model multiplies no matrices." in (out / "report.md").read_text()


def test_serve_takes_a_static_model_folder(tiny_dir, tmp_path, monkeypatch):
    """A static model's folder has no config.json: `encoderrt serve` takes it by its modules.json, compiles it into
    the cache and serves it under the folder's name."""
    from sentence_transformers import SentenceTransformer

    from encoderrt.runtime import EngineConfig
    from encoderrt.server.loading import ModelSpec, load_models, plan_models
    from encoderrt.server.registry import ModelRegistry

    monkeypatch.setenv("ENCODERRT_CACHE", str(tmp_path / "cache"))
    folder = tm.static_embedding_folder(tiny_dir / "static-served")
    assert not (folder / "config.json").exists()
    registry = ModelRegistry()
    load_models(plan_models([ModelSpec(folder)]), EngineConfig(), registry)
    try:
        (served,) = registry.models()
        assert served.name == "static-served" and served.engine.info.target == "static"
        np.testing.assert_allclose(served.engine.embed(TEXTS), SentenceTransformer(str(folder)).encode(TEXTS),
                                   atol=1e-6)
    finally:
        registry.close()
