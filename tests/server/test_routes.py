"""Every route over a real uvicorn server: response shapes field by field, values against Engine."""

import base64

import numpy as np
import openai
import pytest

TEXTS = ["how do rivers form", "Rivers form when water flows downhill from a source such as a spring.", "café ☕"]


def test_openai_client_default_base64_matches_engine(url, engines):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    response = client.embeddings.create(model="minilm", input=TEXTS)
    expected = engines["minilm"].embed(TEXTS)
    assert response.model == "minilm" and response.object == "list"
    assert [d.index for d in response.data] == [0, 1, 2]
    np.testing.assert_allclose(np.array([d.embedding for d in response.data]), expected, atol=1e-6)
    tokens = sum(len(engines["minilm"].tokenize(t)) for t in TEXTS)
    assert response.usage.prompt_tokens == tokens and response.usage.total_tokens == tokens


def test_openai_client_float_and_dimensions(url, engines):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    response = client.embeddings.create(model="minilm", input="one text", encoding_format="float", dimensions=32)
    assert len(response.data) == 1 and len(response.data[0].embedding) == 32
    np.testing.assert_allclose(response.data[0].embedding, engines["minilm"].embed(["one text"], dimensions=32)[0], atol=1e-6)


def test_embeddings_raw_shape_and_token_ids(client, engines):
    ids = engines["minilm"].tokenize("token ids work too")
    body = client.post("/v1/embeddings", json={"input": [ids], "encoding_format": "base64"}).json()
    assert set(body) == {"object", "data", "model", "usage"}
    assert body["data"][0]["object"] == "embedding" and body["data"][0]["index"] == 0
    vector = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vector, engines["minilm"].embed(["token ids work too"])[0], atol=1e-6)
    single = client.post("/v1/embeddings", json={"input": ids}).json()
    np.testing.assert_allclose(single["data"][0]["embedding"], vector, atol=1e-6)
    assert body["usage"] == {"prompt_tokens": len(ids), "total_tokens": len(ids)}


def test_vllm_score_shapes(client, engines):
    for path in ("/score", "/v1/score"):
        response = client.post(path, json={"model": "reranker", "text_1": "the fox", "text_2": ["the dog", "a fox", "café"]})
        assert response.status_code == 200
        body = response.json()
        assert set(body) == {"id", "object", "created", "model", "data", "usage"}
        assert body["object"] == "list" and body["model"] == "reranker" and body["id"].startswith("score-")
        assert isinstance(body["created"], int)
        assert [d["index"] for d in body["data"]] == [0, 1, 2] and {d["object"] for d in body["data"]} == {"score"}
        expected = engines["reranker"].score("the fox", ["the dog", "a fox", "café"])
        assert [d["score"] for d in body["data"]] == pytest.approx(expected, abs=1e-6)
        assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    pairwise = client.post("/score", json={"model": "reranker", "text_1": ["a", "b"], "text_2": ["c", "d"]}).json()
    assert [d["score"] for d in pairwise["data"]] == pytest.approx(engines["reranker"].score(["a", "b"], ["c", "d"]), abs=1e-6)
    one = client.post("/score", json={"model": "reranker", "text_1": "a", "text_2": "c"}).json()
    assert len(one["data"]) == 1


@pytest.mark.parametrize(("first", "second"), [("queries", "documents"), ("queries", "items"), ("data_1", "data_2")])
def test_vllm_score_accepts_every_body_shape(first, second, client, engines):
    """vLLM's other score bodies pair the same way as text_1 / text_2 (1:N here, N:N below)."""
    documents = ["the dog", "a fox", "café"]
    one_to_many = client.post("/v1/score", json={"model": "reranker", first: "the fox", second: documents})
    assert one_to_many.status_code == 200
    assert [d["score"] for d in one_to_many.json()["data"]] == pytest.approx(
        engines["reranker"].score("the fox", documents), abs=1e-6)
    pairwise = client.post("/score", json={"model": "reranker", first: ["a", "b"], second: ["c", "d"]}).json()
    assert [d["score"] for d in pairwise["data"]] == pytest.approx(engines["reranker"].score(["a", "b"], ["c", "d"]), abs=1e-6)


def test_vllm_use_activation_false_gives_raw_logits(client, engines):
    body = {"model": "reranker", "text_1": "the fox", "text_2": ["the dog", "a fox"]}
    raw = client.post("/score", json={**body, "use_activation": False}).json()
    activated = client.post("/score", json={**body, "use_activation": True}).json()
    logits = engines["reranker"].score("the fox", ["the dog", "a fox"], activation=False)
    assert [d["score"] for d in raw["data"]] == pytest.approx(logits, abs=1e-6)
    assert [d["score"] for d in activated["data"]] == pytest.approx(1 / (1 + np.exp(-np.array(logits))), abs=1e-6)


def test_vllm_score_body_without_one_pair_is_named(client):
    missing = client.post("/score", json={"model": "reranker", "text_1": "a"})
    both = client.post("/score", json={"model": "reranker", "text_1": "a", "text_2": "b", "queries": "a", "documents": "b"})
    for response in (missing, both):
        assert response.status_code == 400
        assert "exactly one of text_1 + text_2, queries + documents, queries + items, data_1 + data_2" in response.text
    assert "gives none" in missing.text and "gives text_1 + text_2, queries + documents" in both.text


def test_score_without_model_prefers_the_cross_encoder(client, engines):
    body = client.post("/score", json={"text_1": "fox", "text_2": "dog"}).json()
    assert body["model"] == "reranker"
    embedding_score = client.post("/score", json={"model": "minilm", "text_1": "fox", "text_2": "dog"}).json()
    assert embedding_score["data"][0]["score"] == pytest.approx(engines["minilm"].score("fox", "dog")[0], abs=1e-6)


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_jina_and_cohere_rerank(client, engines, path):
    documents = ["the lazy dog", "quick brown fox jumps", {"text": "the fox"}, "café"]
    texts = ["the lazy dog", "quick brown fox jumps", "the fox", "café"]
    body = client.post(path, json={"model": "reranker", "query": "the quick fox", "documents": documents, "top_n": 3}).json()
    assert set(body) == {"id", "model", "usage", "results"} and body["model"] == "reranker"
    expected = engines["reranker"].rerank("the quick fox", texts, top_n=3)
    assert [(r["index"], r["relevance_score"]) for r in body["results"]] == [(i, pytest.approx(s, abs=1e-6)) for i, s in expected]
    assert [r["document"]["text"] for r in body["results"]] == [texts[i] for i, _ in expected]
    assert body["usage"]["total_tokens"] > 0
    bare = client.post(path, json={"query": "fox", "documents": texts, "return_documents": False}).json()
    assert len(bare["results"]) == 4 and all(set(r) == {"index", "relevance_score"} for r in bare["results"])


def test_vllm_pooling_embeds_and_classifies(client, engines):
    body = client.post("/pooling", json={"model": "minilm", "input": TEXTS}).json()
    assert set(body) == {"id", "object", "created", "model", "data", "usage"} and body["id"].startswith("pool-")
    assert [(d["index"], d["object"]) for d in body["data"]] == [(0, "pooling"), (1, "pooling"), (2, "pooling")]
    np.testing.assert_allclose(np.array([d["data"] for d in body["data"]]), engines["minilm"].embed(TEXTS), atol=1e-6)
    raw = client.post("/pooling", json={"model": "minilm", "input": TEXTS[0], "use_activation": False, "dimensions": 64,
                                        "encoding_format": "base64"}).json()
    vector = np.frombuffer(base64.b64decode(raw["data"][0]["data"]), dtype="<f4")
    np.testing.assert_allclose(vector, engines["minilm"].embed(TEXTS[:1], normalize=False, dimensions=64)[0], atol=1e-5)
    assert abs(np.linalg.norm(vector) - 1) > 1e-3  # not normalised

    for name in ("classifier", "reranker"):
        expected = engines[name].classify(TEXTS)
        probs = client.post("/pooling", json={"model": name, "input": TEXTS}).json()["data"]
        assert [d["data"] for d in probs] == [pytest.approx(c.probs, abs=1e-6) for c in expected]
        logits = client.post("/pooling", json={"model": name, "input": TEXTS, "use_activation": False}).json()["data"]
        assert [d["data"] for d in logits] == [pytest.approx(c.logits, abs=1e-5) for c in expected]
    assert len(probs[0]["data"]) == 1  # a one-label cross-encoder: [sigmoid(logit)]


@pytest.mark.parametrize("body, fragment", [
    ({"model": "minilm", "input": "x", "task": "token_embed"}, "per-token outputs are pooled away"),
    ({"model": "classifier", "input": "x", "task": "embed"}, "it pools with task 'classify'"),
    ({"model": "minilm", "messages": [{"role": "user", "content": "x"}]}, "chat `messages` are for decoder models"),
    ({"model": "minilm", "input": []}, "input must not be empty"),
    # side was ignored outside token_embed
    ({"model": "minilm", "input": "x", "side": "query"}, "side applies to task 'token_embed'"),
    ({"model": "classifier", "input": "x", "side": "query"}, "side applies to task 'token_embed'"),
    ({"model": "minilm", "input": "x", "pool_factor": 2}, "pool_factor applies to task 'token_embed'"),
])
def test_vllm_pooling_refusals(client, body, fragment):
    response = client.post("/pooling", json=body)
    assert response.status_code == 400 and fragment in response.json()["error"]["message"], response.text


def test_raw_scores_of_an_embedding_model_are_refused_naming_why(client, engines):
    """An embedder scores by cosine: raw scores were accepted and the cosine returned as if they were logits."""
    with pytest.raises(Exception, match="raw scores"):
        engines["minilm"].score("the fox", ["the dog"], activation=False)
    raw = {"model": "minilm", "text_1": "the fox", "use_activation": False}
    for path, body in (("/score", {**raw, "text_2": ["the dog"]}), ("/v1/score", {**raw, "text_2": "the dog"})):
        refused = client.post(path, json=body)
        assert refused.status_code == 400, refused.text
        assert "raw scores (no activation) apply to a cross-encoder's logits" in refused.text
    kept = client.post("/score", json={"model": "minilm", "text_1": "the fox", "text_2": ["the dog"]}).json()
    expected = engines["minilm"].score("the fox", ["the dog"])
    assert [d["score"] for d in kept["data"]] == pytest.approx(expected, abs=1e-6)


def test_tei_rerank_shape(client, engines):
    texts = ["the lazy dog", "quick brown fox", "café"]
    body = client.post("/rerank", json={"query": "fox", "texts": texts, "return_text": True}).json()
    expected = engines["reranker"].rerank("fox", texts)
    assert [(r["index"], r["score"], r["text"]) for r in body] == [(i, pytest.approx(s, abs=1e-6), texts[i]) for i, s in expected]
    raw = client.post("/rerank", json={"query": "fox", "texts": texts, "raw_scores": True}).json()
    logits = engines["reranker"].score("fox", texts, activation=False)
    assert sorted(r["score"] for r in raw) == pytest.approx(sorted(logits), abs=1e-5)
    assert all(set(r) == {"index", "score"} for r in raw)


def test_classify(client, engines):
    body = client.post("/classify", json={"model": "classifier", "input": ["the fox", "привет"]}).json()
    assert set(body) == {"id", "object", "created", "model", "data", "usage"}
    expected = engines["classifier"].classify(["the fox", "привет"])
    for item, want in zip(body["data"], expected):
        assert item["label"] == want.label and item["num_classes"] == 3
        assert item["probs"] == pytest.approx(want.probs, abs=1e-6)
    assert [d["index"] for d in body["data"]] == [0, 1]


def test_tei_embed_and_predict(client, engines):
    body = client.post("/embed", json={"inputs": TEXTS}).json()
    np.testing.assert_allclose(np.array(body), engines["minilm"].embed(TEXTS), atol=1e-6)
    raw = client.post("/embed", json={"inputs": "x", "normalize": False, "dimensions": 8}).json()
    np.testing.assert_allclose(raw[0], engines["minilm"].embed(["x"], normalize=False, dimensions=8)[0], atol=1e-6)
    single = client.post("/predict", json={"inputs": "the fox"}).json()
    want = engines["classifier"].classify(["the fox"])[0]
    assert [p["score"] for p in single] == pytest.approx(sorted(want.probs, reverse=True), abs=1e-6)
    assert single[0]["label"] == want.label
    batch = client.post("/predict", json={"inputs": [["the fox"], ["dog"]]}).json()
    assert len(batch) == 2 and len(batch[0]) == 3


def test_predict_pairs_on_a_cross_encoder(tiny_artifacts):
    import httpx

    from encoderrt import Engine
    from encoderrt.server import ServerSettings, create_app
    from server_helpers import ready_registry, running_server

    engine = Engine.load(tiny_artifacts["bert-cross-encoder"], max_batch_tokens=512)
    with running_server(create_app(ServerSettings(), ready_registry(ce=engine))) as base:
        pair = httpx.post(f"{base}/predict", json={"inputs": ["the fox", "the dog"]}).json()
        assert pair == [{"score": pytest.approx(engine.score("the fox", "the dog")[0], abs=1e-6), "label": "LABEL_0"}]
        batch = httpx.post(f"{base}/predict", json={"inputs": [["a", "b"], ["c", "d"]], "raw_scores": True}).json()
        assert [p[0]["score"] for p in batch] == pytest.approx(engine.score(["a", "c"], ["b", "d"], activation=False), abs=1e-5)


def test_tokenize_models_health(client, engines):
    body = client.post("/tokenize", json={"model": "minilm", "prompt": "hello world"}).json()
    assert body == {"count": 4, "max_model_len": 256, "tokens": engines["minilm"].tokenize("hello world")}
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert {m["id"]: m["task"] for m in models["data"]} == {"minilm": "embed", "reranker": "score", "classifier": "classify"}
    assert client.get("/health").json() == {"status": "ok", "models": ["minilm", "reranker", "classifier"]}


def test_headers_carry_request_id_and_timings(client):
    response = client.post("/v1/embeddings", json={"model": "minilm", "input": "x"}, headers={"x-request-id": "abc-123"})
    assert response.headers["x-request-id"] == "abc-123"
    for header in ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time", "x-compute-tokens"):
        assert int(response.headers[header]) >= 0
    assert len(client.get("/health").headers["x-request-id"]) == 32


def test_metrics(client):
    client.post("/v1/embeddings", json={"model": "minilm", "input": ["metrics"]})
    client.post("/v1/embeddings", json={"model": "nope", "input": ["metrics"]})
    text = client.get("/metrics").text
    assert 'encoderrt_http_requests_total{route="/v1/embeddings",status="200"}' in text
    assert 'encoderrt_http_requests_total{route="/v1/embeddings",status="404"}' in text
    assert 'encoderrt_http_request_duration_seconds_bucket{le="0.005",route="/v1/embeddings"}' in text
    for name in ('encoderrt_queue_depth{model="minilm"}', 'encoderrt_padding_efficiency{model="minilm"}',
                 'encoderrt_tokens_processed_total{model="minilm"}',
                 'encoderrt_batch_tokens_total{kind="padded",model="minilm"}',
                 'encoderrt_failed_batches_total{model="minilm"} 0.0',
                 'encoderrt_overloaded_total{model="minilm"} 0.0'):
        assert name in text
    assert "encoderrt_result_cache_bytes{" not in text  # a figure the engine does not have is left out


def test_docs_work_offline(client):
    page = client.get("/docs").text
    assert "/docs-assets/swagger-ui-bundle.js" in page and "cdn" not in page.lower()
    assert client.get("/docs-assets/swagger-ui-bundle.js").status_code == 200
    assert client.get("/docs-assets/swagger-ui.css").status_code == 200
    schema = client.get("/openapi.json").json()
    assert {"/v1/embeddings", "/score", "/v1/score", "/rerank", "/v2/rerank", "/classify", "/embed", "/predict"} <= set(schema["paths"])


def test_concurrent_clients_get_their_own_results(url, engines):
    import asyncio

    import httpx

    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            bodies = [[f"client {i} text {j}" for j in range(3)] for i in range(32)]
            responses = await asyncio.gather(*(http.post("/v1/embeddings", json={"model": "minilm", "input": b}) for b in bodies))
            return bodies, responses

    bodies, responses = asyncio.run(main())
    for texts, response in zip(bodies, responses):
        assert response.status_code == 200
        got = np.array([d["embedding"] for d in response.json()["data"]])
        np.testing.assert_allclose(got, engines["minilm"].embed(texts), atol=1e-5)


@pytest.mark.parametrize(("path", "body", "task", "verb"), [
    ("/embed", {"model": "reranker", "inputs": ["x"]}, "score", "embed"),
    ("/v1/embeddings", {"model": "classifier", "input": ["x"]}, "classify", "embed"),
    ("/rerank", {"model": "classifier", "query": "q", "documents": ["a"]}, "classify", "rerank"),
    ("/predict", {"model": "minilm", "inputs": "x"}, "embed", "classify"),
    ("/score", {"model": "classifier", "text_1": "a", "text_2": "b"}, "classify", "score"),
])
def test_a_named_model_of_the_wrong_task_is_refused_on_every_dialect(path, body, task, verb, client):
    response = client.post(path, json=body)
    assert response.status_code == 400
    assert f"is {'an' if task == 'embed' else 'a'} {task} model and cannot answer {verb}" in response.json()["error"]["message"]


def test_openapi_describes_what_the_server_sends(client):
    spec = client.get("/openapi.json").json()
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            assert "422" not in operation["responses"], (method, path)  # invalid bodies are 400s here
            if method == "post":
                error = operation["responses"]["400"]["content"]["application/json"]["schema"]
                assert error["properties"]["error"]["required"] == ["message", "type", "code"]
    invalid = client.post("/v1/embeddings", json={"input": 3.5})
    assert invalid.status_code == 400 and set(invalid.json()["error"]) == {"message", "type", "code"}
    metrics = spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == [client.get("/metrics").headers["content-type"]]


def test_a_wrong_method_is_405_with_allow(client):
    response = client.get("/v1/embeddings")
    assert response.status_code == 405 and response.headers["allow"] == "POST"
    assert response.json()["error"]["message"] == "GET is not allowed on /v1/embeddings; it takes POST"
