"""A model past protobuf's 2 GB, as bge-m3, jina-embeddings-v3, Qwen3-Embedding-0.6B and EuroBERT-610m are in fp32:
onnx cannot write such a graph as one message, and onnxruntime's optimizer, given it whole, took 16 GB.

The checkpoint is a 3-layer BERT whose embedding table is padded to 520,000 rows (as checkpoints pad theirs, far
longer here): 2.29 GB of weights at a small model's compute, so the test takes about a minute."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from artifact_runner import cosine_rows
from encoderrt import Engine
from encoderrt.runtime.manifest import read_manifest
from tiny_models import bert_checkpoint

PROTOBUF_LIMIT = 2**31
TEXTS = ["search query", "the quick brown fox jumps over a lazy dog", "x", " ".join(["rank score"] * 40)]


@pytest.fixture
def large_model(tmp_path):
    folder = bert_checkpoint(tmp_path / "model", None, max_positions=128, vocab_rows=520_000, hidden_size=1024,
                             num_hidden_layers=3, num_attention_heads=16, intermediate_size=4096,
                             initializer_range=0.02)
    yield folder
    shutil.rmtree(tmp_path)  # ~5 GB of model and artifact: not kept with pytest's last runs


def test_a_model_past_2_gb_compiles_for_onnxruntime_and_matches_sentence_transformers(large_model, tmp_path):
    from sentence_transformers import SentenceTransformer

    weights = (large_model / "model.safetensors").stat().st_size
    assert weights > PROTOBUF_LIMIT
    artifact = tmp_path / "artifact"
    compile_command = [sys.executable, "-m", "encoderrt.cli", "compile", str(large_model), "--output", str(artifact),
                       "--target", "cpu", "--precision", "fp32", "--quiet"]
    process = subprocess.Popen(compile_command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    assert process.returncode == 0, output
    peak = usage.ru_maxrss * 1024
    assert peak < 4 * weights, f"compile peaked at {peak / 1e9:.1f} GB for {weights / 1e9:.2f} GB of weights"

    assert (artifact / "model.onnx.data").stat().st_size > PROTOBUF_LIMIT
    assert (artifact / "model.onnx").stat().st_size < 1e6  # the graph alone; every weight beside it
    manifest = read_manifest(artifact)
    assert manifest.fused_ops["Attention"] == 3 and manifest.parity["min_cosine"] >= 0.99999

    reference = SentenceTransformer(str(large_model), device="cpu").encode(TEXTS)
    with Engine.load(artifact) as engine:
        embeddings = engine.embed(TEXTS)
    assert cosine_rows(embeddings, reference).min() >= 0.99999
    assert cosine_rows(reference[:1], reference[1:2])[0] < 0.999  # distinct inputs, distinct vectors
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), np.linalg.norm(reference, axis=1), rtol=1e-3)
