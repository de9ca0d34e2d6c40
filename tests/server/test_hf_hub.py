"""huggingface_hub's InferenceClient, unmodified, against a real server: it posts every task to the base URL."""

import httpx
import numpy as np
import pytest

from artifact_runner import cosine_rows


@pytest.fixture
def hub_client(url, monkeypatch):
    """The client with offline mode off for this test only: huggingface_hub refuses every request, loopback included,
    while HF_HUB_OFFLINE is set (the suite sets it so that nothing reaches the Hub)."""
    import huggingface_hub
    from huggingface_hub import InferenceClient

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return InferenceClient(base_url=url)


def test_feature_extraction(hub_client, engines):
    vectors = hub_client.feature_extraction("how do rivers form")
    assert vectors.shape == (1, 384)
    assert cosine_rows(vectors, engines["minilm"].embed(["how do rivers form"]))[0] >= 0.99999


def test_sentence_similarity(hub_client, engines):
    sentences = ["rivers form when water flows downhill", "bread is baked in an oven"]
    scores = hub_client.sentence_similarity("how do rivers form", other_sentences=sentences)
    assert scores == pytest.approx(engines["minilm"].score("how do rivers form", sentences), abs=1e-6)
    assert scores[0] > scores[1]


def test_text_classification(hub_client, engines):
    results = hub_client.text_classification("the quick brown fox")
    expected = engines["classifier"].classify(["the quick brown fox"])[0]
    assert {r.label for r in results} == set(engines["classifier"].info.labels)
    assert [r.score for r in results] == pytest.approx(sorted(expected.probs, reverse=True), abs=1e-6)
    top = hub_client.text_classification("the quick brown fox", top_k=1, function_to_apply="none")
    assert len(top) == 1 and top[0].score == pytest.approx(max(expected.logits), abs=1e-5)


def test_decode_and_info(url, engines):
    ids = engines["minilm"].tokenize("how do rivers form")
    decoded = httpx.post(f"{url}/decode", json={"ids": ids}).json()
    assert decoded == ["how do rivers form"]
    assert httpx.post(f"{url}/decode", json={"ids": [ids, ids[:3]], "skip_special_tokens": False}).json()[0].startswith("[CLS]")
    assert httpx.post(f"{url}/decode", json={"ids": [10 ** 9]}).status_code == 400
    info = httpx.get(f"{url}/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "mean"}} and info["max_input_length"] == 256


def test_root_route_names_a_bad_body(url):
    response = httpx.post(f"{url}/", json={"inputs": {"source_sentence": "x"}})
    assert response.status_code == 400 and "inputs.sentences" in response.text


LONG = "rivers carve valleys over many years " * 80  # about 480 tokens, past MiniLM's 256


def test_over_long_input_is_truncated_unless_truncate_is_false(hub_client, url, engines):
    """TEI truncates by default (--auto-truncate, on since 1.9; /info says auto_truncate: true); only an explicit
    `"truncate": false` refuses an over-long input."""
    from huggingface_hub.errors import HfHubHTTPError

    cut = engines["minilm"].embed([LONG], truncate=True)
    assert cosine_rows(hub_client.feature_extraction(LONG), cut)[0] >= 0.99999
    with pytest.raises(HfHubHTTPError) as refused:
        hub_client.feature_extraction(LONG, truncate=False)
    assert refused.value.response.status_code == 400 and "limit of 256" in refused.value.response.text
    assert httpx.get(f"{url}/info").json()["auto_truncate"] is True

    # the bodies a curl user sends (as the README's examples), with and without "truncate"
    unset = httpx.post(f"{url}/embed", content=f'{{"inputs": ["{LONG}"]}}', headers={"content-type": "application/json"})
    assert unset.status_code == 200 and cosine_rows(np.array(unset.json()), cut)[0] >= 0.99999
    assert httpx.post(f"{url}/embed", json={"inputs": [LONG], "truncate": None}).status_code == 200
    rerank = {"model": "reranker", "query": "rivers", "texts": [LONG, "bread"]}
    predict = {"model": "classifier", "inputs": LONG}
    for route, body in (("/embed", {"inputs": [LONG]}), ("/rerank", rerank), ("/predict", predict)):
        assert httpx.post(f"{url}{route}", json=body).status_code == 200, route
        refused_body = httpx.post(f"{url}{route}", json={**body, "truncate": False})
        assert refused_body.status_code == 400 and "tokens" in refused_body.text, route
    ranked = httpx.post(f"{url}/rerank", json=rerank).json()
    expected = engines["reranker"].rerank("rivers", [LONG, "bread"])
    assert [r["index"] for r in ranked] == [i for i, _ in expected]
    assert [r["score"] for r in ranked] == pytest.approx([s for _, s in expected], abs=1e-6)
