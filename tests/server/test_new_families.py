"""The 2025-26 encoder families served: NomicBERT, EmbeddingGemma and EmbeddingGemma 2 embedders with their prompts
through the OpenAI SDK (prompt_name in extra_body; a Matryoshka width) and Cohere's (input_type), a GTE reranker
through Cohere's and the Jina/vLLM rerank route, UltraBERT's embedder and mean-pooled reranker through TEI and vLLM,
each against sentence-transformers; jina-embeddings-v3's task per request through each dialect's way of naming it,
against sentence-transformers with PEFT's adapter of that task; the decoders, Qwen3-Embedding's kind with its
instruction prompt and Qwen3-Reranker's with an instruction per request, on every route that serves them."""

import cohere
import httpx
import numpy as np
import openai
import pytest

import tiny_models as tm
from artifact_runner import cosine_rows
from encoderrt import Engine
from encoderrt.server import ServerSettings, create_app
from server_helpers import ready_registry, running_server

TEXTS = ["how do rivers form", "the quick brown fox jumps over a lazy dog", "größe café 東京", "x"]
QUERY = "which fox is quick"


@pytest.fixture(scope="module")
def sources(tiny_dir, jina_v3):
    root = tiny_dir / "served-families"
    return {
        "nomic": tm.sentence_transformers_folder(root / "nomic", pooling="mean", normalize=True, family="nomic_bert",
                                                 prompts={"search_query": "search_query: ",
                                                          "search_document": "search_document: "}),
        "gemma": tm.sentence_transformers_folder(root / "gemma", pooling="mean", normalize=True, family="gemma3",
                                                 dense=((48, "Identity"),),
                                                 prompts=tm.EMBEDDINGGEMMA_PROMPTS),
        "gemma2": tm.sentence_transformers_folder(root / "gemma2", pooling="mean", normalize=True,
                                                  family="embedding_gemma2",
                                                  prompts=tm.EMBEDDINGGEMMA_PROMPTS),
        "gte-reranker": tm.family_checkpoint(root / "gte-reranker", "gte", num_labels=1, seed=7),
        "ultrabert": tm.sentence_transformers_folder(root / "ultrabert", pooling="mean", normalize=True,
                                                     family="ultrabert"),
        "ultrabert-reranker": tm.family_checkpoint(root / "ultrabert-reranker", "ultrabert", num_labels=1, seed=8,
                                                   classifier_pooling="mean"),
        "jina": jina_v3,
        "qwen3": tm.sentence_transformers_folder(root / "qwen3", pooling="lasttoken", normalize=True, family="qwen3",
                                                 prompts={"query": "Instruct: rank passages for the query\nQuery:",
                                                          "document": ""}),
        "qwen3-reranker": tm.causal_reranker_folder(root / "qwen3-reranker"),
    }


@pytest.fixture(scope="module")
def url(sources, compile_artifact, tmp_path_factory):
    root = tmp_path_factory.mktemp("served-families")
    targets = {"nomic": "cpu", "gemma": "openvino", "gemma2": "cpu", "gte-reranker": "cpu", "ultrabert": "openvino",
               "ultrabert-reranker": "cpu", "jina": "cpu",
               "qwen3": "openvino", "qwen3-reranker": "cpu"}
    engines = {name.replace("-", "_"): Engine.load(compile_artifact(source, root / name, target=targets[name]).path)
               for name, source in sources.items()}
    with running_server(create_app(ServerSettings(), ready_registry(**engines))) as served:
        yield served
    for engine in engines.values():
        engine.close()


def test_embedders_answer_with_their_prompts_through_openai_and_cohere(sources, url):
    from sentence_transformers import SentenceTransformer

    nomic = SentenceTransformer(str(sources["nomic"]), device="cpu")
    reply = openai.OpenAI(base_url=f"{url}/v1", api_key="unused").embeddings.create(
        model="nomic", input=TEXTS, extra_body={"prompt_name": "search_query"})
    served = np.array([item.embedding for item in reply.data], dtype=np.float32)
    assert cosine_rows(served, nomic.encode(TEXTS, prompt_name="search_query")).min() >= 0.99999
    assert cosine_rows(served, nomic.encode(TEXTS)).min() < 0.9999  # the prompt made a difference

    gemma = SentenceTransformer(str(sources["gemma"]), device="cpu")
    embedded = cohere.ClientV2(base_url=url, api_key="unused").embed(
        model="gemma", texts=TEXTS, input_type="search_document", embedding_types=["float"])
    vectors = np.array(embedded.embeddings.float_, dtype=np.float32)
    assert vectors.shape == (len(TEXTS), 48)
    assert cosine_rows(vectors, gemma.encode(TEXTS, prompt_name="document")).min() >= 0.99999

    gemma2 = SentenceTransformer(str(sources["gemma2"]), device="cpu")  # its first 16 widths, as Matryoshka asks
    reply = openai.OpenAI(base_url=f"{url}/v1", api_key="unused").embeddings.create(
        model="gemma2", input=TEXTS, dimensions=16, extra_body={"prompt_name": "query"})
    served = np.array([item.embedding for item in reply.data], dtype=np.float32)
    assert served.shape == (len(TEXTS), 16)
    assert cosine_rows(served, gemma2.encode(TEXTS, prompt_name="query", truncate_dim=16)).min() >= 0.99999


def test_gte_reranker_ranks_as_the_cross_encoder_through_cohere_and_jina(sources, url):
    from sentence_transformers import CrossEncoder

    expected = CrossEncoder(str(sources["gte-reranker"]), device="cpu").predict([(QUERY, text) for text in TEXTS])
    ranked = cohere.ClientV2(base_url=url, api_key="unused").rerank(model="gte_reranker", query=QUERY, documents=TEXTS)
    by_index = {result.index: result.relevance_score for result in ranked.results}
    np.testing.assert_allclose([by_index[i] for i in range(len(TEXTS))], expected, atol=1e-5)
    jina = httpx.post(f"{url}/v1/rerank", json={"model": "gte_reranker", "query": QUERY, "documents": TEXTS}, timeout=60)
    assert jina.status_code == 200, jina.text
    assert [r["index"] for r in jina.json()["results"]] == list(np.argsort(-expected, kind="stable"))


def test_ultrabert_embeds_and_reranks_as_sentence_transformers_through_tei_and_vllm(sources, url):
    """Texts past its 8-token windows, through TEI's /embed and /rerank (raw scores) and vLLM's /score."""
    from sentence_transformers import CrossEncoder, SentenceTransformer

    texts = TEXTS + [" ".join(tm.CORPUS_WORDS[:30])]
    embedded = httpx.post(f"{url}/embed", json={"model": "ultrabert", "inputs": texts}, timeout=60)
    assert embedded.status_code == 200, embedded.text
    expected = SentenceTransformer(str(sources["ultrabert"]), device="cpu").encode(texts)
    assert cosine_rows(np.array(embedded.json(), dtype=np.float32), expected).min() >= 0.99999

    reranker = CrossEncoder(str(sources["ultrabert-reranker"]), device="cpu")
    logits = reranker.predict([(QUERY, text) for text in texts], activation_fn=__import__("torch").nn.Identity())
    tei = httpx.post(f"{url}/rerank", json={"model": "ultrabert_reranker", "query": QUERY, "texts": texts,
                                            "raw_scores": True}, timeout=60)
    assert tei.status_code == 200, tei.text
    np.testing.assert_allclose([r["score"] for r in sorted(tei.json(), key=lambda r: r["index"])], logits, atol=1e-3)
    score = httpx.post(f"{url}/v1/score", json={"model": "ultrabert_reranker", "text_1": QUERY, "text_2": texts},
                       timeout=60)
    assert score.status_code == 200, score.text
    np.testing.assert_allclose([d["score"] for d in score.json()["data"]], 1 / (1 + np.exp(-logits)), atol=1e-5)
    assert np.std(logits) > 0.05


def test_jina_v3_takes_its_task_from_each_dialect(sources, url):
    """OpenAI's extra_body (Jina's API's `task`), Cohere's input_type, TEI's prompt_name; an unknown task, or two
    names that disagree, is a 400 naming the problem."""
    model, use = tm.peft_sentence_transformer(sources["jina"])
    expected = {}
    for task in ("retrieval.query", "retrieval.passage", "text-matching"):
        use(task)
        expected[task] = model.encode(TEXTS, prompt_name=task)

    reply = openai.OpenAI(base_url=f"{url}/v1", api_key="unused").embeddings.create(
        model="jina", input=TEXTS, extra_body={"task": "text-matching"})
    served = np.array([item.embedding for item in reply.data], dtype=np.float32)
    assert cosine_rows(served, expected["text-matching"]).min() >= 0.99999

    client = cohere.ClientV2(base_url=url, api_key="unused")
    for input_type, task in (("search_query", "retrieval.query"), ("search_document", "retrieval.passage")):
        embedded = client.embed(model="jina", texts=TEXTS, input_type=input_type, embedding_types=["float"])
        assert cosine_rows(np.array(embedded.embeddings.float_, dtype=np.float32), expected[task]).min() >= 0.99999

    tei = httpx.post(f"{url}/embed", json={"model": "jina", "inputs": TEXTS, "prompt_name": "retrieval.query"},
                     timeout=60)
    assert tei.status_code == 200, tei.text
    assert cosine_rows(np.array(tei.json(), dtype=np.float32), expected["retrieval.query"]).min() >= 0.99999

    unknown = httpx.post(f"{url}/v1/embeddings", json={"model": "jina", "input": TEXTS, "task": "retrieval"}, timeout=60)
    assert unknown.status_code == 400 and "unknown prompt_name 'retrieval'; this model's tasks are: " in unknown.text
    assert "retrieval.passage, retrieval.query" in unknown.text
    both = httpx.post(f"{url}/v1/embeddings", json={"model": "jina", "input": TEXTS, "task": "retrieval.query",
                                                    "prompt_name": "separation"}, timeout=60)
    assert both.status_code == 400 and "prompt_name 'separation' and task 'retrieval.query' disagree" in both.text


def test_qwen3_embedder_answers_with_its_instruction_and_refuses_what_it_cannot_serve(sources, url):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(sources["qwen3"]), device="cpu")
    reply = openai.OpenAI(base_url=f"{url}/v1", api_key="unused").embeddings.create(
        model="qwen3", input=TEXTS, extra_body={"prompt_name": "query"}, dimensions=16)
    served = np.array([item.embedding for item in reply.data], dtype=np.float32)
    expected = model.encode(TEXTS, prompt_name="query", truncate_dim=16)
    assert cosine_rows(served, expected).min() >= 0.99999
    embedded = cohere.ClientV2(base_url=url, api_key="unused").embed(
        model="qwen3", texts=TEXTS, input_type="search_query", embedding_types=["float"])
    assert cosine_rows(np.array(embedded.embeddings.float_, dtype=np.float32), model.encode(TEXTS, prompt_name="query")).min() >= 0.99999
    sparse = httpx.post(f"{url}/embed_sparse", json={"model": "qwen3", "inputs": TEXTS}, timeout=60)
    assert sparse.status_code == 400 and "model 'qwen3' is an embed model and cannot answer embed_sparse" in sparse.text
    rerank = httpx.post(f"{url}/v1/rerank", json={"model": "qwen3_reranker", "query": QUERY, "documents": TEXTS,
                                                  "prompt_name": "query"}, timeout=60)
    assert rerank.status_code == 400 and "unknown prompt_name 'query'; this model's prompts are: none" in rerank.text


def test_qwen3_reranker_takes_an_instruction_on_each_rerank_and_score_route(sources, url):
    """Cohere's client (the folder's default instruction), Jina's /v1/rerank and TEI's /rerank with `prompt`, vLLM's
    /score with `prompt` and raw logits, each against CrossEncoder.predict."""
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(sources["qwen3-reranker"]), device="cpu")
    pairs = [(QUERY, text) for text in TEXTS]
    instruction = "find the passage about a fox"
    plain, instructed = model.predict(pairs), model.predict(pairs, prompt=instruction)
    assert np.abs(plain - instructed).max() > 1e-3

    ranked = cohere.ClientV2(base_url=url, api_key="unused").rerank(model="qwen3_reranker", query=QUERY, documents=TEXTS)
    np.testing.assert_allclose([r.relevance_score for r in sorted(ranked.results, key=lambda r: r.index)], plain, atol=1e-5)
    jina = httpx.post(f"{url}/v1/rerank", json={"model": "qwen3_reranker", "query": QUERY, "documents": TEXTS,
                                                "prompt": instruction}, timeout=60)
    assert jina.status_code == 200, jina.text
    np.testing.assert_allclose([r["relevance_score"] for r in sorted(jina.json()["results"], key=lambda r: r["index"])],
                               instructed, atol=1e-5)
    tei = httpx.post(f"{url}/rerank", json={"model": "qwen3_reranker", "query": QUERY, "texts": TEXTS,
                                            "prompt": instruction}, timeout=60)
    assert tei.status_code == 200, tei.text
    assert [r["index"] for r in tei.json()] == list(np.argsort(-instructed, kind="stable"))
    score = httpx.post(f"{url}/v1/score", json={"model": "qwen3_reranker", "text_1": QUERY, "text_2": TEXTS,
                                                "prompt": instruction, "use_activation": False}, timeout=60)
    assert score.status_code == 200, score.text
    logits = model.predict(pairs, prompt=instruction, activation_fn=__import__("torch").nn.Identity())
    np.testing.assert_allclose([d["score"] for d in score.json()["data"]], logits, atol=1e-3)


@pytest.mark.parametrize(("route", "body"), [("/classify", {"input": ""}), ("/predict", {"inputs": ""})])
def test_an_empty_text_a_decoders_tokenizer_leaves_no_token_is_a_400_and_the_server_goes_on(route, body, url):
    """Qwen3-Reranker's tokenizer adds no token of its own: an empty text on a route that runs a lone text is a row of
    no tokens, which once killed the batching workers and left every later request waiting. Sent once per worker."""
    for _ in range(2):
        refused = httpx.post(f"{url}{route}", json={"model": "qwen3_reranker", **body}, timeout=30)
        assert refused.status_code == 400, refused.text
        assert "input 0 has no tokens to run: an empty text" in refused.json()["error"]["message"]
    answered = httpx.post(f"{url}/rerank", json={"model": "qwen3_reranker", "query": QUERY, "texts": TEXTS}, timeout=30)
    assert answered.status_code == 200 and len(answered.json()) == len(TEXTS)
