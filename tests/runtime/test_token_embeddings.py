"""Token embeddings (TEI's /embed_all): every token's final hidden state, against
`SentenceTransformer.encode(output_value="token_embeddings")`, in the engine and over HTTP."""

import json
import shutil
import threading

import httpx
import numpy as np
import pytest

import tiny_models as tm
from encoderrt import Engine
from encoderrt.runtime.errors import InvalidRequest, ResultTooLarge
from encoderrt.runtime.manifest import TOKEN_EMBEDDINGS
from encoderrt.server import ServerSettings, create_app
from server_helpers import ready_registry, running_server

TEXTS = ["where is the amazon rainforest", "the quick brown fox jumps over the lazy dog", "café 東京", "x",
         " ".join(["rivers carry sediment to the sea"] * 60)]  # past the model's limit: truncated


def _reference(model, texts, **options):
    return [t.numpy() for t in model.encode(texts, output_value="token_embeddings", batch_size=2, **options)]


def _close(got, expected, atol=1e-4):
    assert [g.shape for g in got] == [e.shape for e in expected]
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, atol=atol, rtol=1e-4)


@pytest.fixture(scope="module")
def minilm(minilm_fp32, minilm_dir):
    from sentence_transformers import SentenceTransformer

    with Engine.load(minilm_fp32.path) as engine:
        yield engine, SentenceTransformer(str(minilm_dir), device="cpu")


def test_every_token_as_sentence_transformers_returns_it(minilm):
    engine, model = minilm
    assert TOKEN_EMBEDDINGS in engine.manifest.outputs
    got, expected = engine.embed_tokens(TEXTS), _reference(model, TEXTS)
    _close(got, expected)
    assert got[-1].shape == (engine.info.max_length, 384)  # cut at the limit, and the padding's states left out
    # pooled rows in the same batches are still the pooled vectors
    np.testing.assert_allclose(engine.embed(TEXTS), model.encode(TEXTS), atol=1e-5)


def test_rows_shared_by_pooled_and_token_requests(minilm):
    """The same texts asked for pooled and per token at once share rows in the scheduler; each gets its own answer."""
    engine, model = minilm
    results = {}

    def ask(kind):
        for _ in range(5):
            results[kind] = engine.embed(TEXTS) if kind == "pooled" else engine.embed_tokens(TEXTS)

    threads = [threading.Thread(target=ask, args=(kind,)) for kind in ("pooled", "tokens")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    np.testing.assert_allclose(results["pooled"], model.encode(TEXTS), atol=1e-5)
    _close(results["tokens"], _reference(model, TEXTS))


def test_prompts_and_openvino(tiny_dir, compile_artifact, tmp_path):
    from sentence_transformers import SentenceTransformer

    folder = tm.sentence_transformers_folder(tiny_dir / "st-token-prompts", pooling="mean", normalize=True,
                                             prompts={"query": "query: "}, default_prompt_name="query")
    model = SentenceTransformer(str(folder), device="cpu")
    result = compile_artifact(folder, tmp_path / "ov", target="openvino")
    with Engine.load(result.path) as engine:
        _close(engine.embed_tokens(TEXTS), _reference(model, TEXTS))  # the default prompt's tokens included
        _close(engine.embed_tokens(TEXTS, prompt=""), _reference(model, TEXTS, prompt=""))
        assert engine.embed_tokens(["x"])[0].shape[0] == engine.embed_tokens(["x"], prompt="")[0].shape[0] + 2


def test_refusals(minilm, tiny_artifacts, minilm_fp32, tmp_path):
    engine, _ = minilm
    texts = ["the quick brown fox jumps over the lazy dog", "café 東京", "x"]
    tokens = engine.count_tokens(texts)
    with Engine.load(minilm_fp32.path, max_token_embeddings=tokens - 1) as small:
        with pytest.raises(ResultTooLarge, match=f"these inputs have {tokens} tokens; one request returns at most {tokens - 1}"):
            small.embed_tokens(texts)
        assert len(small.embed_tokens(texts[:2])) == 2
    with Engine.load(tiny_artifacts["bert-cross-encoder"]) as scorer:
        with pytest.raises(InvalidRequest, match="embed_all is not available for this score model"):
            scorer.embed_tokens(TEXTS)
    # an artifact without the output (TensorRT's, or an older compile): named, not a crash
    old = tmp_path / "old"
    shutil.copytree(minilm_fp32.path, old)
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["outputs"] = ["embeddings"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    with Engine.load(old) as stale, pytest.raises(InvalidRequest, match="has no token embeddings output"):
        stale.embed_tokens(TEXTS)


def test_embed_all_over_http(minilm, tiny_artifacts):
    engine, model = minilm
    with Engine.load(tiny_artifacts["bert-cross-encoder"]) as scorer:
        registry = ready_registry(minilm=engine, scorer=scorer)
        with running_server(create_app(ServerSettings(), registry)) as url, httpx.Client(base_url=url, timeout=60) as http:
            answer = http.post("/embed_all", json={"inputs": TEXTS[:4]})
            one = http.post("/embed_all", json={"inputs": "x", "model": "minilm"})
            wrong = http.post("/embed_all", json={"inputs": "x", "model": "scorer"})
            big = http.post("/embed_all", json={"inputs": [TEXTS[-1]] * 40, "truncate": True})
    assert answer.status_code == 200 and int(answer.headers["x-compute-tokens"]) == engine.count_tokens(TEXTS[:4])
    _close([np.array(rows, dtype=np.float32) for rows in answer.json()], _reference(model, TEXTS[:4]))
    assert np.array(one.json()).shape == (1, 3, 384)  # [CLS] x [SEP]
    assert wrong.status_code == 400 and "cannot answer embed_all" in wrong.text
    assert big.status_code == 413 and "at most 8192 token embeddings" in big.json()["error"]["message"]
