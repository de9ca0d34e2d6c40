"""A ColBERT model served: every rerank and score route answers with MaxSim, against sentence-transformers'
MultiVectorEncoder and its own similarity (Cohere's client, Jina's /v1/rerank, TEI's /rerank, vLLM's /score)."""

import cohere
import httpx
import numpy as np
import pytest

import tiny_models as tm
from encoderrt import Engine
from encoderrt.server import ServerSettings, create_app
from server_helpers import ready_registry, running_server

QUERY = "where is the quick fox?"
DOCUMENTS = ["the quick brown fox jumps over a lazy dog.", "the amazon rainforest, in south america", "café", "a"]


@pytest.fixture(scope="module")
def colbert(tiny_dir):
    from sentence_transformers import MultiVectorEncoder

    folder = tm.colbert_folder(tiny_dir / "served-colbert")
    return folder, MultiVectorEncoder(str(folder), device="cpu")


@pytest.fixture(scope="module")
def url(colbert, compile_artifact, tmp_path_factory):
    artifact = compile_artifact(colbert[0], tmp_path_factory.mktemp("served-colbert") / "colbert", target="openvino")
    with Engine.load(artifact.path) as engine, running_server(create_app(ServerSettings(), ready_registry(colbert=engine))) as served:
        yield served


def test_every_rerank_and_score_route_answers_with_maxsim(colbert, url):
    _, reference = colbert
    expected = reference.similarity(reference.encode_query([QUERY]), reference.encode_document(DOCUMENTS)).numpy()[0]
    order = list(np.argsort(-expected, kind="stable"))

    ranked = cohere.ClientV2(base_url=url, api_key="unused").rerank(model="colbert", query=QUERY, documents=DOCUMENTS)
    assert [r.index for r in ranked.results] == order
    np.testing.assert_allclose([r.relevance_score for r in ranked.results], expected[order], atol=1e-3)
    jina = httpx.post(f"{url}/v1/rerank", json={"model": "colbert", "query": QUERY, "documents": DOCUMENTS, "top_n": 2},
                      timeout=60)
    assert jina.status_code == 200, jina.text
    assert [r["index"] for r in jina.json()["results"]] == order[:2]
    tei = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": DOCUMENTS}, timeout=60)
    assert tei.status_code == 200, tei.text
    assert [r["index"] for r in tei.json()] == order
    score = httpx.post(f"{url}/v1/score", json={"model": "colbert", "text_1": QUERY, "text_2": DOCUMENTS}, timeout=60)
    assert score.status_code == 200, score.text
    np.testing.assert_allclose([d["score"] for d in score.json()["data"]], expected, atol=1e-3)


def test_a_verb_the_model_has_not_is_a_400_naming_what_it_answers(url):
    embedded = httpx.post(f"{url}/v1/embeddings", json={"model": "colbert", "input": ["fox"]}, timeout=60)
    assert embedded.status_code == 400
    assert "a multi_vector model and cannot answer embed (it answers score, rerank, embed_all, pooling, tokenize)" in embedded.text
    pooled = httpx.post(f"{url}/pooling", json={"input": ["fox"], "task": "embed"}, timeout=60)
    assert pooled.status_code == 400 and "it pools with task 'token_embed'" in pooled.text


def test_token_vectors_through_vllm_pooling_on_each_side(colbert, url):
    """vLLM's token_embed task: one [tokens, dim] array per text, the query side's with its expansion, the document
    side's without punctuation; base64 is the float32 array row by row."""
    import base64

    _, reference = colbert
    for side, expected in (("query", reference.encode_query(DOCUMENTS)), ("document", reference.encode_document(DOCUMENTS))):
        pooled = httpx.post(f"{url}/pooling", json={"input": DOCUMENTS, "task": "token_embed", "side": side}, timeout=60)
        assert pooled.status_code == 200, pooled.text
        for row, vectors in zip(pooled.json()["data"], expected):
            np.testing.assert_allclose(np.array(row["data"]), vectors.numpy(), atol=1e-4)
    packed = httpx.post(f"{url}/pooling", json={"input": DOCUMENTS[:1], "encoding_format": "base64"}, timeout=60)
    assert packed.status_code == 200, packed.text
    vectors = np.frombuffer(base64.b64decode(packed.json()["data"][0]["data"]), dtype="<f4").reshape(-1, 24)
    np.testing.assert_allclose(vectors, reference.encode_document(DOCUMENTS[:1])[0].numpy(), atol=1e-4)
    half = httpx.post(f"{url}/pooling", json={"input": DOCUMENTS[:1], "encoding_format": "base64",
                                              "embed_dtype": "float16"}, timeout=60)
    assert half.status_code == 200, half.text
    halves = np.frombuffer(base64.b64decode(half.json()["data"][0]["data"]), dtype="<f2").reshape(-1, 24)
    assert halves.nbytes * 2 == vectors.nbytes
    # the model's own vectors: no activation to turn off (it was accepted and ignored)
    raw = httpx.post(f"{url}/pooling", json={"input": DOCUMENTS[:1], "use_activation": False}, timeout=60)
    assert raw.status_code == 400 and "task 'token_embed' returns the model's own vectors" in raw.text, raw.text
    np.testing.assert_allclose(halves.astype(np.float32), vectors, rtol=1e-3, atol=1e-3)
    # documents pooled as PyLate's pool_factor and sentence-transformers' per-call token pooling pool them
    from sentence_transformers.multi_vector_encoder.modules import HierarchicalTokenPooling

    halved = httpx.post(f"{url}/pooling", json={"input": DOCUMENTS, "task": "token_embed", "pool_factor": 2},
                        timeout=60)
    assert halved.status_code == 200, halved.text
    expected = reference.encode_document(DOCUMENTS, token_pooling=HierarchicalTokenPooling(pool_factor=2))
    for row, vectors in zip(halved.json()["data"], expected, strict=True):
        np.testing.assert_allclose(np.array(row["data"]), vectors.numpy(), atol=1e-4)
    cut = httpx.post(f"{url}/pooling", json={"input": DOCUMENTS, "task": "token_embed", "dimensions": 8}, timeout=60)
    assert cut.status_code == 200, cut.text
    for row, vectors in zip(cut.json()["data"], reference.encode_document(DOCUMENTS, truncate_dim=8), strict=True):
        np.testing.assert_allclose(np.array(row["data"]), vectors.numpy(), atol=1e-4)
    for body, message in (({"pool_factor": 0.5}, "pool_factor must be a finite number of at least 1, got 0.5"),
                          ({"pool_factor": 2, "side": "query"}, "pool_factor applies to documents")):
        refused = httpx.post(f"{url}/pooling", json={"input": DOCUMENTS, **body}, timeout=60)
        assert refused.status_code == 400 and message in refused.text, refused.text


def test_teis_embed_all_returns_the_document_vectors(colbert, url):
    """TEI's /embed_all: a ColBERT model's token embeddings are its vectors, as encode_document returns them."""
    _, reference = colbert
    answer = httpx.post(f"{url}/embed_all", json={"inputs": DOCUMENTS}, timeout=60)
    assert answer.status_code == 200, answer.text
    for rows, vectors in zip(answer.json(), reference.encode_document(DOCUMENTS)):
        np.testing.assert_allclose(np.array(rows), vectors.numpy(), atol=1e-4)
    left = httpx.post(f"{url}/embed_all", json={"inputs": DOCUMENTS, "truncation_direction": "Left"}, timeout=60)
    assert left.status_code == 400 and "truncation_direction must be Right" in left.text
    assert httpx.get(f"{url}/info", timeout=60).json()["model_type"] == {"embedding": {"pooling": "none"}}
