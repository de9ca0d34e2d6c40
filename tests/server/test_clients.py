"""Framework clients, unmodified, against a real server: the lines the README's clients section shows."""

import numpy as np

from artifact_runner import cosine_rows

TEXTS = ["how do rivers form", "Rivers form when rain water flows downhill.", "café 東京"]


def test_langchain_openai_embeddings(url, engines):
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: otherwise langchain counts tokens with tiktoken, which downloads OpenAI's
    # vocabulary first (and counts in the wrong vocabulary for this model anyway)
    embeddings = OpenAIEmbeddings(model="minilm", base_url=f"{url}/v1", api_key="unused", check_embedding_ctx_length=False)
    expected = engines["minilm"].embed(TEXTS)
    assert cosine_rows(np.array(embeddings.embed_documents(TEXTS)), expected).min() >= 0.99999
    assert cosine_rows(np.array([embeddings.embed_query(TEXTS[0])]), expected[:1])[0] >= 0.99999


def test_llama_index_openai_embedding(url, engines):
    from llama_index.embeddings.openai import OpenAIEmbedding

    embedding = OpenAIEmbedding(model_name="minilm", api_base=f"{url}/v1", api_key="unused")
    expected = engines["minilm"].embed(TEXTS)
    assert cosine_rows(np.array(embedding.get_text_embedding_batch(TEXTS)), expected).min() >= 0.99999
    assert cosine_rows(np.array([embedding.get_query_embedding(TEXTS[0])]), expected[:1])[0] >= 0.99999
