"""Long context: a bge-m3-shaped XLM-R (8,194 positions, CLS pooling, normalised; hidden 64, two heads, two
layers) compiles on both CPU targets (verification batches its probes by tokens: padding them all to 8,192 asked
onnxruntime for 28 GiB), and the engine matches sentence-transformers at 2,048 and 8,192 tokens, in padded batches
of mixed lengths and row by row; a lone 8k row costs OpenVINO at most 1.5x the memory it costs transformers (a
windowed family's too: UltraBERT's), and auto leaves onnxruntime's S x S scores out."""

import os

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
                                           hidden_size=64, num_attention_heads=2, intermediate_size=128)


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


@pytest.fixture(scope="module")
def expected(reference, texts):
    return reference.encode(texts, batch_size=1)  # unpadded: PyTorch's fast attention (compile/parity.py)


@pytest.mark.parametrize("target", ["cpu", "openvino"])
def test_8k_rows_match_sentence_transformers_batched_and_alone(target, source, texts, expected, compile_artifact,
                                                                 tmp_path_factory):
    result = compile_artifact(source, tmp_path_factory.mktemp("long") / target, target=target, precision="fp32")
    manifest = read_manifest(result.path)
    assert manifest.max_length == 8192 and manifest.parity["min_cosine"] >= 0.99999
    with Engine.load(result.path) as engine:
        assert engine.info.max_batch_tokens >= 8192  # a lone row of the limit fits the budget
        batched = engine.embed(texts)
        alone = np.concatenate([engine.embed([text]) for text in texts])
    assert cosine_rows(batched, expected).min() >= 0.99999
    assert cosine_rows(alone, expected).min() >= 0.99999
    assert cosine_rows(expected[3:4], expected[1:2])[0] < 0.9999  # the 8k row is not the 2k row


PEAK = """
import sys
def status(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key)) / 1024
kind, path, text = sys.argv[1], sys.argv[2], sys.argv[3]
if kind == "transformers":
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(path, device="cpu")
    model.encode(["warm"])
    run = lambda: model.encode([text])
else:
    from encoderrt import Engine
    engine = Engine.load(path)
    engine.embed(["warm"])
    run = lambda: engine.embed([text])
before = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # VmHWM from here
run()
print(status("VmHWM") - before)
"""


def _peak_increase(kind: str, path, text: str) -> float:
    """MB that one embedding of `text` adds to the peak resident memory of a process that has already loaded the
    model and embedded a short text."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PEAK, kind, str(path), text], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CI": "true"})
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.split()[-1])


def test_a_lone_8k_row_takes_openvino_no_more_memory_than_transformers_and_a_half(source, texts, compile_artifact,
                                                                                  tmp_path_factory):
    """No [B, 1, S, S] mask per layer: the exported masks are the padding alone, [B, 1, 1, S] (transformers built
    [B, 1, S, S], 256 MiB of floats at 8k, which OpenVINO computed and kept)."""
    result = compile_artifact(source, tmp_path_factory.mktemp("long") / "openvino", target="openvino", precision="fp32")
    reference = _peak_increase("transformers", source, texts[3])
    engine = _peak_increase("engine", result.path, texts[3])
    assert engine <= 1.5 * max(reference, 64), (engine, reference)


def test_a_windowed_family_matches_at_8k_and_takes_openvino_no_more_memory_than_transformers_and_a_half(
        tiny_dir, compile_artifact, tmp_path_factory):
    """UltraBERT's layout (a 128-token window on each side, every third layer global; its position table reaches 32k):
    the windowed layers' masks stay [B, 1, S, S] (padding-only masks are for global attention), yet a lone 8k row
    costs OpenVINO less than it costs transformers, and the rows match sentence-transformers' at 2k and 8k."""
    from sentence_transformers import SentenceTransformer

    source = tm.sentence_transformers_folder(
        tiny_dir / "long-context" / "ultrabert", pooling="mean", normalize=True, max_seq_length=8192,
        family="ultrabert", max_positions=8194, hidden_size=64, num_attention_heads=2, intermediate_size=128,
        num_hidden_layers=3, sliding_window=128, global_every=3)
    reference = SentenceTransformer(str(source), device="cpu")
    texts = ["a short query", _text(reference.tokenizer, 2048), _text(reference.tokenizer, 8192)]
    result = compile_artifact(source, tmp_path_factory.mktemp("long") / "ultrabert", target="openvino",
                              precision="fp32")
    with Engine.load(result.path) as engine:
        assert cosine_rows(engine.embed(texts), reference.encode(texts, batch_size=1)).min() >= 0.99999
    expected = _peak_increase("transformers", source, texts[2])
    assert _peak_increase("engine", result.path, texts[2]) <= 1.5 * max(expected, 64), expected


def test_onnxruntime_gives_way_to_openvino_under_auto_for_long_rows(source, compile_artifact, tmp_path_factory, minilm_fp32):
    """The rule auto applies between built candidates: onnxruntime's CPU attention holds [heads, S, S] scores per row,
    so from 4,096 tokens on it is not eligible beside OpenVINO, with the size said."""
    from encoderrt.compile.selection import long_rows_reason

    result = compile_artifact(source, tmp_path_factory.mktemp("long") / "cpu", target="cpu", precision="fp32")
    # two heads x 8,192^2 float32 scores
    assert long_rows_reason(read_manifest(result.path)) == ("onnxruntime's attention holds 0.5 GiB of scores for one "
                                                            "8192-token row; OpenVINO's streams them")
    assert long_rows_reason(read_manifest(minilm_fp32.path)) is None
