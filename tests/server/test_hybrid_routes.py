"""A bge-m3-shaped model served: its dense vector on the embedding routes, its lexical weights on TEI's /embed_sparse,
its colbert vectors and all three at once on vLLM's /pooling, and its hybrid score on every score and rerank route,
against bge-m3's formulas in plain PyTorch (tests/bge_m3_reference.py) and through real clients' own packages."""

import base64

import cohere
import httpx
import numpy as np
import openai
import pytest
from bge_m3_reference import hybrid_score, reference

import tiny_models as tm
from encoderrt import Engine
from encoderrt.server import ServerSettings, create_app
from server_helpers import ready_registry, running_server

QUERY = "where is the quick fox?"
DOCUMENTS = ["the quick brown fox jumps over a lazy dog.", "the amazon rainforest, in south america", "café", "a fox"]


@pytest.fixture(scope="module")
def bge_m3(tiny_dir):
    folder = tm.bge_m3_folder(tiny_dir / "served-bge-m3", seed=11)
    return folder, reference(folder, [QUERY, *DOCUMENTS])


@pytest.fixture(scope="module")
def url(bge_m3, compile_artifact, tmp_path_factory):
    artifact = compile_artifact(bge_m3[0], tmp_path_factory.mktemp("served-bge-m3") / "m3", target="cpu", precision="fp32")
    with Engine.load(artifact.path) as engine, running_server(create_app(ServerSettings(), ready_registry(m3=engine))) as served:
        yield served


def test_the_dense_vector_on_openais_route_and_the_lexical_weights_on_teis(bge_m3, url):
    _, expected = bge_m3
    embedded = openai.OpenAI(base_url=f"{url}/v1", api_key="unused").embeddings.create(model="m3", input=DOCUMENTS)
    np.testing.assert_allclose([d.embedding for d in embedded.data], [e[0] for e in expected[1:]], atol=1e-5)
    sparse = httpx.post(f"{url}/embed_sparse", json={"inputs": DOCUMENTS}, timeout=60)
    assert sparse.status_code == 200, sparse.text
    for got, (_, lexical, _) in zip(sparse.json(), expected[1:]):
        assert {item["index"] for item in got} == lexical.keys()
        np.testing.assert_allclose([item["value"] for item in got], [lexical[item["index"]] for item in got], atol=1e-5)
    info = httpx.get(f"{url}/info", timeout=60).json()
    assert info["model_type"] == {"embedding": {"pooling": "cls"}}


def test_all_three_outputs_from_one_pooling_request(bge_m3, url):
    _, expected = bge_m3
    body = {"model": "m3", "input": DOCUMENTS, "outputs": ["dense", "sparse", "colbert"]}
    pooled = httpx.post(f"{url}/pooling", json=body, timeout=60)
    assert pooled.status_code == 200, pooled.text
    assert pooled.json()["usage"]["prompt_tokens"] == sum(len(e[2]) + 1 for e in expected[1:])  # each text ran once
    for item, (dense, lexical, colbert) in zip(pooled.json()["data"], expected[1:]):
        np.testing.assert_allclose(item["data"]["dense"], dense, atol=1e-5)
        assert {entry["index"] for entry in item["data"]["sparse"]} == lexical.keys()
        np.testing.assert_allclose(item["data"]["colbert"], colbert, atol=1e-5)
    compact = httpx.post(f"{url}/pooling", json={**body, "outputs": ["colbert"], "encoding_format": "base64",
                                                 "embed_dtype": "float16"}, timeout=60)
    assert compact.status_code == 200, compact.text
    for item, (_, _, colbert) in zip(compact.json()["data"], expected[1:]):
        assert set(item["data"]) == {"colbert"}
        vectors = np.frombuffer(base64.b64decode(item["data"]["colbert"]), "<f2").reshape(colbert.shape)
        np.testing.assert_allclose(vectors, colbert, atol=2e-3)
    tokens = httpx.post(f"{url}/pooling", json={"model": "m3", "input": DOCUMENTS[:1], "task": "token_embed"}, timeout=60)
    assert tokens.status_code == 200, tokens.text
    np.testing.assert_allclose(tokens.json()["data"][0]["data"], expected[1][2], atol=1e-5)


def test_every_rerank_and_score_route_answers_with_the_hybrid_score(bge_m3, url):
    _, expected = bge_m3
    query, documents = expected[0], expected[1:]
    scores = np.array([hybrid_score(query, document) for document in documents])
    order = list(np.argsort(-scores, kind="stable"))
    ranked = cohere.ClientV2(base_url=url, api_key="unused").rerank(model="m3", query=QUERY, documents=DOCUMENTS)
    assert [r.index for r in ranked.results] == order
    np.testing.assert_allclose([r.relevance_score for r in ranked.results], scores[order], atol=1e-4)
    tei = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": DOCUMENTS}, timeout=60)
    assert tei.status_code == 200 and [r["index"] for r in tei.json()] == order
    weights = {"dense": 1.0, "sparse": 0.3, "colbert": 1.0}  # FlagEmbedding's training weights, in a request
    weighted = np.array([hybrid_score(query, document, (1.0, 0.3, 1.0)) for document in documents])
    score = httpx.post(f"{url}/v1/score", json={"model": "m3", "text_1": QUERY, "text_2": DOCUMENTS,
                                                "hybrid_weights": weights}, timeout=60)
    assert score.status_code == 200, score.text
    np.testing.assert_allclose([d["score"] for d in score.json()["data"]], weighted, atol=1e-4)
    jina = httpx.post(f"{url}/v1/rerank", json={"model": "m3", "query": QUERY, "documents": DOCUMENTS, "top_n": 2,
                                                "hybrid_weights": {"sparse": 1.0}}, timeout=60)
    assert jina.status_code == 200, jina.text
    lexical = np.array([hybrid_score(query, document, (0.0, 1.0, 0.0)) for document in documents])
    assert [r["index"] for r in jina.json()["results"]] == list(np.argsort(-lexical, kind="stable")[:2])


@pytest.mark.parametrize(("body", "message"), [
    ({"input": ["a"], "outputs": ["dense", "bm25"]}, "outputs.1: Input should be 'dense', 'sparse' or 'colbert'"),
    ({"input": ["a"], "outputs": []}, "outputs must be a non-empty list of dense, sparse, colbert"),
    ({"input": ["a"], "outputs": ["dense"], "side": "query"}, "outputs take texts, without task, side, dimensions"),
    ({"input": ["a"], "outputs": ["dense"], "use_activation": False},
     "without task, side, dimensions or use_activation"),
    ({"input": [[5, 6]], "outputs": ["dense"]}, "outputs take texts, not token ids"),
])
def test_bad_pooling_requests_are_400s_naming_the_problem(url, body, message):
    answer = httpx.post(f"{url}/pooling", json=body, timeout=60)
    assert answer.status_code == 400 and message in answer.text, answer.text


def test_bad_weights_are_400s_naming_the_problem(url):
    answer = httpx.post(f"{url}/v1/score", json={"text_1": "a", "text_2": ["b"], "hybrid_weights": {"colbert": "x"}},
                        timeout=60)
    assert answer.status_code == 400 and "hybrid_weights.colbert" in answer.text, answer.text
    answer = httpx.post(f"{url}/v2/rerank", json={"query": "a", "documents": ["b"], "hybrid_weights": {"dense": -1}},
                        timeout=60)
    assert answer.status_code == 400 and "hybrid_weights['dense'] must be a number of at least 0" in answer.text
