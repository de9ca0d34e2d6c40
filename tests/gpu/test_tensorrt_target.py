"""The TensorRT target's CPU-testable parts: profiles, the standard-Attention graph, engine records.

Building and running an engine needs TensorRT and an NVIDIA GPU; those tests are skipped here with
the reason, and never count as passes.
"""

import importlib.util
import json
import shutil

import numpy as np
import pytest

from encoderrt.compile.tensorrt import plan_profiles
from encoderrt.runtime.backends import BackendUnavailable, load_backend
from encoderrt.runtime.engine_record import EngineMismatch, EngineRecord, check_engine_compatibility, pick_profile
from encoderrt.runtime.manifest import read_manifest

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
requires_tensorrt = pytest.mark.skipif(not HAS_TENSORRT, reason="needs TensorRT and an NVIDIA GPU (pip install 'encoderrt[gpu]')")


def test_profiles_cover_every_batch_the_budget_allows():
    profiles = plan_profiles(max_length=512, max_batch_tokens=16384)
    assert [(p.min_length, p.max_length) for p in profiles] == [(1, 32), (33, 64), (65, 128), (129, 256), (257, 512)]
    for width in range(1, 513):
        for rows in {1, 16384 // width}:
            profile = profiles[pick_profile(profiles, rows, width)]
            assert profile.min_length <= width <= profile.max_length and rows <= profile.max_batch
    assert profiles[-1].max_batch == 16384 // 257 and profiles[-1].opt_batch == 16384 // 512
    assert EngineRecord("10.14.1", "9.0", "fp16", profiles).max_batch_tokens == 16384
    assert plan_profiles(max_length=24, max_batch_tokens=64) == plan_profiles(24, 64)[:1]
    with pytest.raises(ValueError, match="no optimisation profile covers a batch of 600 rows x 40 tokens"):
        pick_profile(profiles, 600, 40)
    with pytest.raises(ValueError, match="max_batch_tokens"):
        plan_profiles(max_length=512, max_batch_tokens=100)


def test_mismatched_engine_is_refused():
    record = EngineRecord("10.14.1", "9.0", "bf16", plan_profiles(256, 8192), 6)
    assert EngineRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    check_engine_compatibility(record, "10.14.1", "9.0")
    with pytest.raises(EngineMismatch, match=r"built for TensorRT 10.14.1 \(this machine has 10.15.0\)"):
        check_engine_compatibility(record, "10.15.0", "9.0")
    with pytest.raises(EngineMismatch, match=r"compute capability 9.0 \(this GPU is 8.0\).*rebuild it here"):
        check_engine_compatibility(record, "10.14.1", "8.0")


def test_tensorrt_graph_has_one_standard_attention_per_layer_and_runs_on_onnxruntime(tiny_models, tiny_artifacts, tmp_path):
    """The padded graph handed to TensorRT: standard non-causal Attention, with parity on onnxruntime's CPU."""
    import onnx
    import torch
    from sentence_transformers import CrossEncoder

    from artifact_runner import run_artifact, tensorrt_graph_artifact

    artifact = tensorrt_graph_artifact(tiny_models, tiny_artifacts, "bert-cross-encoder", tmp_path, layout="padded")
    ops = {node.op_type for node in onnx.load(str(artifact / "model.onnx")).graph.node}
    assert "Softmax" not in ops and "LayerNormalization" in ops and "Attention" in ops
    pairs = [("the quick fox", "the lazy dog"), ("café", "résumé naïve"), ("x", " ".join(["fox"] * 80))]
    reference = CrossEncoder(str(tiny_models["bert-cross-encoder"]), device="cpu", max_length=64).predict(
        pairs, activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(run_artifact(artifact, pairs=pairs)[:, 0], reference, atol=1e-3)


def test_tensorrt_target_without_tensorrt_is_a_clear_error(tiny_models, tmp_path, capsys):
    from encoderrt.cli import compile_model_main

    if HAS_TENSORRT:
        pytest.skip("TensorRT is installed here; this checks the message for machines without it")
    code = compile_model_main([str(tiny_models["bert-cross-encoder"]), "-o", str(tmp_path / "out"), "--target", "tensorrt",
                               "--precision", "fp16", "--quiet"])
    assert code == 2 and "needs TensorRT and an NVIDIA GPU" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_precision_must_fit_the_target(tiny_models, tmp_path, capsys):
    from encoderrt.cli import compile_model_main

    def refused(*flags):
        assert compile_model_main([str(tiny_models["bert-cross-encoder"]), "-o", str(tmp_path / "out"), "--quiet", *flags]) == 2
        return capsys.readouterr().err

    assert "--precision fp16 is not available for --target auto" in refused("--precision", "fp16")
    assert "--precision fp16 needs --target tensorrt" in refused("--precision", "fp16")
    assert ("--precision bf16 is not available for --target cpu (cpu runs fp32, int8); --precision bf16 needs "
            "--target openvino or tensorrt") in refused("--precision", "bf16", "--target", "cpu")
    assert not (tmp_path / "out").exists()


def test_gpu_backends_name_what_is_missing(tiny_artifacts, tmp_path):
    artifact = shutil.copytree(tiny_artifacts["bert-cross-encoder"], tmp_path / "a")
    manifest = read_manifest(artifact)
    from dataclasses import replace

    if not HAS_TENSORRT:
        with pytest.raises(BackendUnavailable, match="needs TensorRT and cuda-python"):
            load_backend(replace(manifest, target="tensorrt"), artifact)
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        with pytest.raises(BackendUnavailable, match="needs onnxruntime-gpu"):
            load_backend(replace(manifest, target="cuda"), artifact)


@requires_tensorrt
def test_tensorrt_engine_builds_and_matches(tiny_models, tmp_path):
    from encoderrt import Engine
    from encoderrt.compile import CompileOptions, compile_model

    result = compile_model(CompileOptions(model_dir=tiny_models["bert-cross-encoder"], output_dir=tmp_path / "trt",
                                          target="tensorrt", precision="fp16", max_batch_tokens=2048, quiet=True))
    assert result.manifest.engine["record"]["fused_attention_layers"]
    with Engine.load(result.path, max_batch_tokens=2048) as engine:
        assert len(engine.score("the fox", ["the dog", "a fox"])) == 2


@requires_tensorrt
def test_packed_tensorrt_engine_matches_sentence_transformers(minilm_dir, tmp_path):
    """The plugin path on the GPU: MiniLM (head size 32) in bf16, against SentenceTransformer.encode."""
    from sentence_transformers import SentenceTransformer

    from encoderrt import Engine
    from encoderrt.compile import CompileOptions, compile_model

    result = compile_model(CompileOptions(model_dir=minilm_dir, output_dir=tmp_path / "packed", target="tensorrt",
                                          layout="packed", precision="bf16", max_batch_tokens=4096, quiet=True))
    texts = ["a", "what is the capital of france?", "the quick brown fox jumps over the lazy dog " * 20]
    expected = SentenceTransformer(str(minilm_dir), device="cpu").encode(texts)
    with Engine.load(result.path, max_batch_tokens=4096) as engine:
        got = np.asarray(engine.embed(texts))
    assert (got * expected).sum(1).min() > 0.995


@requires_tensorrt
def test_packed_attention_plugin_registers():
    import tensorrt.plugin as trtp

    from encoderrt.kernels.tensorrt_plugin import PLUGIN_ID

    namespace, name = PLUGIN_ID.split("::")
    assert getattr(getattr(trtp.op, namespace), name) is not None
