"""long_inputs="chunk": an over-long text is embedded in chunks and merged, checked against the same computation
done by hand through sentence-transformers' own modules on the bundled model."""

import numpy as np
import pytest
import torch

from artifact_runner import cosine_rows
from encoderrt import Engine
from encoderrt.bench import workloads
from encoderrt.runtime.tasks import EmbedRequest

LONG = " ".join(workloads.passages(30, seed=5))  # well past 256 tokens
TEXTS = [LONG, "a short query", LONG[: len(LONG) // 3]]


def _by_hand(model, text):
    """Chunks of max_seq_length tokens ([CLS] + content + [SEP]), Transformer + Pooling per chunk, the token-weighted
    mean of the chunk vectors, then sentence-transformers' Normalize."""
    tokenizer = model.tokenizer
    content = tokenizer(text, add_special_tokens=False)["input_ids"]
    size = model.max_seq_length - 2
    chunks = [[tokenizer.cls_token_id, *content[i : i + size], tokenizer.sep_token_id] for i in range(0, len(content), size)]
    vectors = []
    with torch.inference_mode():
        for ids in chunks:
            features = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
                        "token_type_ids": torch.zeros(1, len(ids), dtype=torch.long)}
            vectors.append(model[1](model[0](features))["sentence_embedding"][0].numpy())
    weights = np.array([len(ids) for ids in chunks], dtype=np.float64)
    merged = (np.stack(vectors) * weights[:, None]).sum(0) / weights.sum()
    return merged / np.linalg.norm(merged), int(weights.sum())


@pytest.fixture(scope="module")
def model(minilm_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")


def test_chunked_embeddings_match_the_computation_by_hand(minilm_fp32, model):
    expected = [_by_hand(model, text) for text in TEXTS]
    assert expected[0][1] > 2 * 256  # the long text spans three chunks
    with Engine.load(minilm_fp32.path, long_inputs="chunk") as engine:
        completion = engine.run(EmbedRequest(TEXTS))
        refused_nothing = engine.embed([LONG], truncate=False)  # nothing is too long when chunking
        cut = engine.embed([LONG], truncate=64)  # a per-request length still truncates
    with Engine.load(minilm_fp32.path) as plain:
        cut_plain = plain.embed([LONG], truncate=64)
    assert cosine_rows(completion.value, np.stack([v for v, _ in expected])).min() >= 0.99999
    assert completion.prompt_tokens == sum(n for _, n in expected)  # usage counts every chunk's tokens
    assert cosine_rows(refused_nothing, completion.value[:1])[0] >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(completion.value, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(cut, cut_plain, atol=1e-5)


def test_truncation_stays_the_default(minilm_fp32, model):
    with Engine.load(minilm_fp32.path) as engine:
        truncated = engine.embed([LONG])
    assert cosine_rows(truncated, model.encode([LONG]))[0] >= 0.99999  # sentence-transformers truncates too
    assert cosine_rows(truncated, _by_hand(model, LONG)[0][None])[0] < 0.999  # and chunking differs


def test_unknown_long_inputs_mode_is_refused(minilm_fp32):
    with pytest.raises(ValueError, match="long_inputs must be 'truncate' or 'chunk'"):
        Engine.load(minilm_fp32.path, long_inputs="split")
