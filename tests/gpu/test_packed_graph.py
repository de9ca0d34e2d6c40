"""The packed (padding-free) TensorRT graph, checked on the CPU.

Its attention nodes are the GPU plugin; onnx's reference evaluator runs them with the numpy
implementation (backend "onnx-reference"), so the whole graph (positions and pooling computed from
cu_seqlens, both classifier heads) is compared with sentence-transformers / transformers here.
"""

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from artifact_runner import run_artifact, tensorrt_graph_artifact
from encoderrt.runtime.backends import BackendUnavailable, Batch, load_backend
from encoderrt.runtime.engine_record import EngineRecord, PackedShapes
from encoderrt.runtime.manifest import read_manifest
from encoderrt.runtime.tokenizer import Tokens

PAIRS = [("the quick fox", "the lazy dog"), ("café", "résumé naïve"), ("x", " ".join(["fox"] * 80)), ("a", "b")]
TEXTS = ["hello", "the quick brown fox jumps over the lazy dog " * 8, "café naïve", "x"]


@pytest.mark.parametrize("name", ["bert-cross-encoder", "roberta-cross-encoder"])
def test_packed_cross_encoders_match_cross_encoder(name, tiny_models, tiny_artifacts, tmp_path):
    """BERT's pooler head with segment ids, and RoBERTa's first-token head with offset positions."""
    from sentence_transformers import CrossEncoder

    artifact = tensorrt_graph_artifact(tiny_models, tiny_artifacts, name, tmp_path)
    reference = CrossEncoder(str(tiny_models[name]), device="cpu", max_length=64).predict(PAIRS, activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(run_artifact(artifact, pairs=PAIRS)[:, 0], reference, atol=1e-4)
    if name == "bert-cross-encoder":  # the segment ids reach the packed graph: zeroing them changes the scores
        dropped = run_artifact(artifact, pairs=PAIRS, drop_token_type_ids=True)[:, 0]
        assert np.abs(dropped - reference).max() > 1e-3


def test_packed_classifier_matches_transformers(tiny_models, tiny_artifacts, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    artifact = tensorrt_graph_artifact(tiny_models, tiny_artifacts, "bert-classifier", tmp_path)
    folder = tiny_models["bert-classifier"]
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = model(**tokenizer(TEXTS, padding=True, truncation=True, max_length=64, return_tensors="pt")).logits.numpy()
    np.testing.assert_allclose(run_artifact(artifact, texts=TEXTS), expected, atol=1e-4)


def test_packed_cls_embeddings_match_sentence_transformers(tiny_models, tiny_artifacts, tmp_path):
    from sentence_transformers import SentenceTransformer

    artifact = tensorrt_graph_artifact(tiny_models, tiny_artifacts, "st-cls", tmp_path)
    expected = SentenceTransformer(str(tiny_models["st-cls"]), device="cpu").encode(TEXTS)
    got = run_artifact(artifact, texts=TEXTS)
    got /= np.linalg.norm(got, axis=1, keepdims=True)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_packed_mean_pooling_matches_transformers(tiny_models, tiny_artifacts, tmp_path):
    """XLM-RoBERTa with mean pooling: per-sequence means from cu_seqlens, positions from padding_idx + 1."""
    from transformers import AutoModel, AutoTokenizer

    artifact = tensorrt_graph_artifact(tiny_models, tiny_artifacts, "xlm-roberta-encoder", tmp_path)
    folder = tiny_models["xlm-roberta-encoder"]
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    batch = tokenizer(TEXTS, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    expected = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    np.testing.assert_allclose(run_artifact(artifact, texts=TEXTS), expected, atol=1e-4)


def test_a_batch_packs_its_rows_by_hand_without_padding_them():
    rows = [Tokens([101, 7, 8, 102], [0, 0, 1, 1]), Tokens([101, 9, 102], [0, 1, 1]), Tokens([101, 102], [0, 0])]

    def refuse_to_pad(rows):
        raise AssertionError("a packed run must not pad")

    batch = Batch(rows, refuse_to_pad)
    packed = batch.packed()
    assert packed["input_ids"].tolist() == [101, 7, 8, 102, 101, 9, 102, 101, 102]
    assert packed["token_type_ids"].tolist() == [0, 0, 1, 1, 0, 1, 1, 0, 0]
    assert packed["cu_seqlens"].tolist() == [0, 4, 7, 9] and packed["cu_seqlens"].dtype == np.int32
    assert (batch.real_tokens, batch.padded_tokens) == (9, 12)
    assert [len(part.rows) for part in batch.split(2)] == [2, 1]


def test_numpy_plugin_matches_torch_reference():
    """The CPU stand-in for the plugin against the kernels' PyTorch reference (lengths 1 to 40, 3 heads)."""
    from encoderrt.kernels.reference import reference_attention
    from encoderrt.runtime.backends.onnx_reference import packed_attention

    lengths = [1, 40, 7, 2]
    generator = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(sum(lengths), 3, 32, generator=generator) for _ in range(3))
    cu_seqlens = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32)
    expected = reference_attention(q, k, v, cu_seqlens, 0.2).numpy()
    got = packed_attention(q.numpy(), k.numpy(), v.numpy(), cu_seqlens.numpy(), 0.2)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_plugin_nodes_carry_what_tensorrt_needs(tiny_models, tiny_artifacts, tmp_path):
    import onnx

    artifact = tensorrt_graph_artifact(tiny_models, tiny_artifacts, "bert-cross-encoder", tmp_path)
    graph = onnx.load(str(artifact / "model.onnx")).graph
    assert [i.name for i in graph.input] == ["input_ids", "cu_seqlens", "token_type_ids"]
    nodes = [n for n in graph.node if n.op_type == "packed_attention"]
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert attributes == {"max_seqlen": 64, "num_heads": 4, "head_dim": 8, "plugin_namespace": b"encoderrt",
                          "plugin_version": b"1", "sm_scale": pytest.approx(8 ** -0.5)}


def test_padded_backends_refuse_a_packed_graph(tiny_models, tiny_artifacts, tmp_path):
    artifact = tensorrt_graph_artifact(tiny_models, tiny_artifacts, "bert-cross-encoder", tmp_path)
    manifest = replace(read_manifest(artifact), target="cpu")
    with pytest.raises(BackendUnavailable, match="the cpu target runs padded graphs; this artifact's graph is packed"):
        load_backend(manifest, artifact)


def test_packed_layout_needs_tensorrt_half_precision_and_a_kernel_head_size(tiny_models, minilm_dir, tmp_path, capsys):
    from encoderrt.cli import compile_model_main

    def refused(model, *flags):
        assert compile_model_main([str(model), "-o", str(tmp_path / "out"), "--layout", "packed", "--quiet", *flags]) == 2
        return capsys.readouterr().err

    assert "--layout packed needs --target tensorrt" in refused(minilm_dir)
    assert ("--precision fp32 is not available for --target tensorrt --layout packed; choose fp16, bf16"
            in refused(minilm_dir, "--target", "tensorrt", "--precision", "fp32"))
    assert "supports head sizes (32, 64); this model's is 8" in refused(tiny_models["bert-cross-encoder"], "--target", "tensorrt")
    assert list(tmp_path.iterdir()) == []


def test_packed_engine_record_round_trips():
    from encoderrt.compile.tensorrt import optimisation_profiles, plan_packed

    shapes = plan_packed(max_batch_tokens=16384)
    assert shapes == PackedShapes(max_tokens=16384, max_sequences=512)
    record = EngineRecord("10.14.1", "9.0", "bf16", (), 6, shapes)
    assert EngineRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    (profile,) = optimisation_profiles((), shapes, ("input_ids", "cu_seqlens"))
    assert profile == {"input_ids": ((1,), (8192,), (16384,)), "cu_seqlens": ((2,), (65,), (513,))}
    assert plan_packed(max_batch_tokens=100).max_sequences == 100


def test_plugin_compiles_the_kernel_ahead_of_time_for_hopper():
    """What the TensorRT plugin embeds in the engine: PTX for the model's shape, and the launch grid.

    The plugin's ahead-of-time function runs against tests/fake_tensorrt.py's stand-in for
    tensorrt.plugin; Triton lowers to PTX without a GPU. It runs in a child process because the
    tests' interpreter mode (TRITON_INTERPRET=1) replaces Triton's compiler.
    """
    code = """
import json, re, sys, types
import fake_tensorrt

class Patch:
    def setitem(self, mapping, key, value): mapping[key] = value
    def delitem(self, mapping, key, raising=True): mapping.pop(key, None)

fake_tensorrt.install(Patch())
import functools
from encoderrt.kernels import aot
aot.compile_packed_attention = functools.partial(aot.compile_packed_attention, compute_capability=(9, 0))  # no GPU here
import encoderrt.kernels.tensorrt_plugin
plugin = sys.modules["tensorrt"].plugin.registered["encoderrt::packed_attention"]
out = {}
for dtype, head_dim in (("bfloat16", 64), ("float16", 32)):
    q = types.SimpleNamespace(dtype=dtype, shape_expr=["tokens", 12, head_dim])
    cu_seqlens = types.SimpleNamespace(dtype="int32", shape_expr=[9])
    formats = plugin["autotune"](q, q, q, cu_seqlens, 512, head_dim ** -0.5, 12, head_dim, (q,))
    name, ptx, launch, extra = plugin["aot_impl"](q, q, q, cu_seqlens, 512, head_dim ** -0.5, 12, head_dim, (q,), 0)
    params = re.search(r"\\.entry (\\w+)\\((.*?)\\)", ptx, re.S).group(2).count(".param")
    out[dtype] = [name, params, "wgmma" in ptx, [launch.grid_x, launch.grid_y, launch.grid_z, launch.block_x],
                  launch.shared_mem, list(extra), list(formats[0])]
print(json.dumps(out))
"""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    compiled = json.loads(result.stdout.strip().splitlines()[-1])
    for name, params, tensor_cores, grid, shared, extra, formats in compiled.values():
        assert name == "packed_attention_kernel" and params >= 5 and tensor_cores  # Hopper's wgmma instructions
        assert grid == [512 // 64, 8, 12, 4 * 32]  # query blocks of the longest sequence, 8 sequences, 12 heads; 4 warps
        assert 0 < shared <= 227 * 1024 and extra == ["SymIntExprs", 0]
        assert formats == ["FP16|BF16, FP16|BF16, FP16|BF16, INT32, FP16|BF16", "LINEAR"]
