"""The bundled all-MiniLM-L6-v2 compiled fp32 and int8, checked against sentence-transformers."""

import json

import numpy as np
import onnx
import pytest

from artifact_runner import cosine_rows, run_artifact
from encoderrt.runtime.manifest import read_manifest, sha256_file

# Chosen here, not the compiler's own probes: the check must hold on text compile never saw.
TEXTS = [
    "How many people live in Berlin?",
    "Berlin has a population of 3,520,031 registered inhabitants in an area of 891.82 square kilometers.",
    "the",
    "Machine learning models that turn sentences into vectors are called sentence encoders, and they power semantic "
    "search, clustering and retrieval-augmented generation in many production systems today.",
    "Ça va? Très bien, merci. 北京欢迎你 🎉",
    " ".join(["retrieval"] * 400),  # past the 256-token limit: must be truncated exactly as sentence-transformers does
]


@pytest.fixture(scope="module")
def reference(minilm_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu").encode(TEXTS, convert_to_numpy=True)


def test_fp32_manifest_records_fusion_and_parity(minilm_fp32):
    manifest = read_manifest(minilm_fp32.path)
    assert manifest.task == "embed" and manifest.architecture == "bert"
    assert (manifest.pooling, manifest.normalize, manifest.max_length) == ("mean", True, 256)
    assert manifest.shape.output_dim == 384 and manifest.shape.num_layers == 6
    assert manifest.fused_ops["Attention"] == 6
    assert manifest.fused_ops["LayerNormalization"] == 12 and manifest.fused_ops["BiasGelu"] == 6
    assert manifest.parity["min_cosine"] >= 0.99999
    assert manifest.inputs == ("input_ids", "attention_mask", "token_type_ids")
    assert manifest.target == "cpu" and manifest.precision == "fp32"
    assert {"torch", "transformers", "onnxruntime"} <= set(manifest.versions)
    for name, digest in manifest.files.items():
        assert sha256_file(minilm_fp32.path / name) == digest
    assert {"model.onnx", "tokenizer.json"} <= set(manifest.files)


def test_fp32_graph_has_one_fused_attention_per_layer(minilm_fp32):
    graph = onnx.load(str(minilm_fp32.path / "model.onnx")).graph
    ops = [node.op_type for node in graph.node]
    assert ops.count("Attention") == 6
    assert "Softmax" not in ops  # no attention left unfused
    dims = graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param for d in dims] == ["batch", "sequence"]


def test_fp32_matches_sentence_transformers(minilm_fp32, reference):
    embeddings = run_artifact(minilm_fp32.path, texts=TEXTS)
    assert embeddings.shape == (len(TEXTS), 384)
    assert cosine_rows(embeddings, reference).min() >= 0.99999


def test_int8_is_quantised_and_within_tolerance(minilm_int8, reference):
    manifest = read_manifest(minilm_int8.path)
    assert manifest.precision == "int8"
    assert manifest.parity["mean_cosine"] >= 0.995 and manifest.parity["min_cosine"] >= 0.98
    ops = {node.op_type for node in onnx.load(str(minilm_int8.path / "model.onnx")).graph.node}
    assert "MatMulInteger" in ops  # (attention and FFN down projections stay fp32 where the probes ask for it)
    kept = set(manifest.parity["fp32_nodes"])
    assert ("QAttention" in ops) == (not any("Attention" in name for name in kept))
    cosines = cosine_rows(run_artifact(minilm_int8.path, texts=TEXTS), reference)
    assert cosines.mean() >= 0.995 and cosines.min() >= 0.98


def test_ffn_down_projections_are_found_by_structure(minilm_fp32):
    from encoderrt.compile.quantize import ffn_down_projections

    names = ffn_down_projections(minilm_fp32.path / "model.onnx")
    assert len(names) == 6 and all("output/dense" in name and "attention" not in name for name in names)


def test_manifest_is_plain_json(minilm_fp32):
    data = json.loads((minilm_fp32.path / "manifest.json").read_text())
    assert data["schema_version"] == 2 and data["parity"]["reference"].startswith("sentence-transformers")
    assert np.isfinite(data["parity"]["min_cosine"])
