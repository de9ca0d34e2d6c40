"""Long context: a bge-m3-shaped XLM-R (8,194 positions, CLS pooling, normalised; hidden 64, two layers) compiles
on both CPU targets (verification batches its probes by tokens: padding them all to 8,192 asked onnxruntime for
28 GiB), and the engine matches sentence-transformers at 2,048 and 8,192 tokens, in padded batches of mixed
lengths and row by row."""

import numpy as np
import pytest

import tiny_models as tm
from artifact_runner import cosine_rows
from encoderrt import Engine
from encoderrt.runtime.manifest import read_manifest

WORDS = " ".join(tm.CORPUS_WORDS)


def _text(tokenizer, tokens: int) -> str:
    """Corpus words repeated to `tokens` tokens, the special tokens counted."""
    ids = tokenizer(WORDS * (tokens // 4 + 1), add_special_tokens=False)["input_ids"][: tokens - 2]
    return tokenizer.decode(ids)


@pytest.fixture(scope="module")
def source(tiny_dir):
    return tm.sentence_transformers_folder(tiny_dir / "long-context" / "bge-m3-shaped", pooling="cls", normalize=True,
                                           max_seq_length=8192, family="xlm-roberta", max_positions=8194,
                                           hidden_size=64, intermediate_size=128)


@pytest.fixture(scope="module")
def reference(source):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(source), device="cpu")


@pytest.fixture(scope="module")
def texts(reference):
    tokenizer = reference.tokenizer
    texts = ["a short query", _text(tokenizer, 2048), "x", _text(tokenizer, 8192), _text(tokenizer, 700),
             _text(tokenizer, 8192 * 2)]  # the last is truncated to the limit
    assert [len(ids) for ids in tokenizer(texts, truncation=True, max_length=8192)["input_ids"]][1::2] == [2048, 8192, 8192]
    return texts


@pytest.mark.parametrize("target", ["cpu", "openvino"])
def test_8k_rows_match_sentence_transformers_batched_and_alone(target, source, reference, texts, compile_artifact,
                                                                 tmp_path_factory):
    result = compile_artifact(source, tmp_path_factory.mktemp("long") / target, target=target, precision="fp32")
    manifest = read_manifest(result.path)
    assert manifest.max_length == 8192 and manifest.parity["min_cosine"] >= 0.99999
    expected = reference.encode(texts, batch_size=len(texts))
    with Engine.load(result.path) as engine:
        assert engine.info.max_batch_tokens >= 8192  # a lone row of the limit fits the budget
        batched = engine.embed(texts)
        alone = np.concatenate([engine.embed([text]) for text in texts])
    assert cosine_rows(batched, expected).min() >= 0.99999
    assert cosine_rows(alone, expected).min() >= 0.99999
    assert cosine_rows(expected[3:4], expected[1:2])[0] < 0.9999  # the 8k row is not the 2k row
