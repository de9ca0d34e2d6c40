"""The TensorRT backend's own logic, on the CPU, with TensorRT and CUDA replaced by tests/fake_tensorrt.py.

The fakes run the artifact's ONNX graph where TensorRT would run the engine, so what is checked
here is the backend: staging inputs of the right dtype and shape through its buffers, picking the
profile, dropping padding and splitting packed batches, reading the output back, refusing an
engine built elsewhere. The scores are compared with sentence-transformers.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch

import fake_tensorrt
from artifact_runner import run_artifact, tensorrt_graph_artifact
from encoderrt.compile.tensorrt import plan_packed, plan_profiles
from encoderrt.runtime.engine_record import EngineMismatch, EngineRecord, pick_profile
from encoderrt.runtime.manifest import read_manifest, sha256_file

PAIRS = [("the quick fox", "the lazy dog"), ("café", "résumé naïve"), ("x", " ".join(["fox"] * 80)), ("a", "b"),
         ("who", "what and where")]


def _as_tensorrt_artifact(artifact, record: EngineRecord):
    """The graph file doubles as the 'engine' the fake TensorRT deserialises."""
    (artifact / "engine.plan").write_bytes((artifact / "model.onnx").read_bytes())
    manifest = read_manifest(artifact, verify_files=False)
    files = {**manifest.files, "engine.plan": sha256_file(artifact / "engine.plan")}
    (artifact / "manifest.json").write_text(
        replace(manifest, target="tensorrt", files=files, engine={"file": "engine.plan", "record": record.to_dict()}).to_json())
    return artifact


@pytest.fixture(scope="module")
def reference_scores(tiny_models):
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(tiny_models["bert-cross-encoder"]), device="cpu", max_length=64)
    return model.predict(PAIRS, activation_fn=torch.nn.Identity())


def test_packed_engine_drops_padding_and_splits_large_batches(tiny_models, tiny_artifacts, tmp_path, monkeypatch,
                                                              reference_scores):
    engines = fake_tensorrt.install(monkeypatch)
    artifact = tensorrt_graph_artifact(tiny_models, tiny_artifacts, "bert-cross-encoder", tmp_path, layout="packed")
    record = EngineRecord("10.14.1", "9.0", "fp16", (), 2, plan_packed(max_batch_tokens=512, max_sequences=3))
    scores = run_artifact(_as_tensorrt_artifact(artifact, record), pairs=PAIRS)[:, 0]
    np.testing.assert_allclose(scores, reference_scores, atol=1e-4)
    calls = engines[0].calls
    assert [shapes["cu_seqlens"] for _, shapes in calls] == [(4,), (3,)]  # 5 rows in runs of at most 3 sequences
    assert all(shapes["input_ids"] == shapes["token_type_ids"] for _, shapes in calls)
    import sys

    plugin = sys.modules["tensorrt"].plugin.registered["encoderrt::packed_attention"]  # registered before the engine loads
    assert set(plugin) == {"register", "autotune", "aot_impl"}


def test_padded_engine_runs_each_batch_in_the_profile_for_its_shape(tiny_models, tiny_artifacts, tmp_path, monkeypatch,
                                                                   reference_scores):
    engines = fake_tensorrt.install(monkeypatch)
    artifact = tensorrt_graph_artifact(tiny_models, tiny_artifacts, "bert-cross-encoder", tmp_path, layout="padded")
    profiles = plan_profiles(max_length=64, max_batch_tokens=512)
    record = EngineRecord("10.14.1", "9.0", "fp16", profiles, 2)
    artifact = _as_tensorrt_artifact(artifact, record)
    short = run_artifact(artifact, pairs=PAIRS[:2])[:, 0]
    everything = run_artifact(artifact, pairs=PAIRS)[:, 0]
    np.testing.assert_allclose(short, reference_scores[:2], atol=1e-3)
    np.testing.assert_allclose(everything, reference_scores, atol=1e-3)
    (engine,) = engines  # one loaded engine runs both batches, each in the profile for its shape
    (first_profile, first), (second_profile, second) = engine.calls
    assert first_profile == pick_profile(profiles, *first["input_ids"]) == 0  # short rows: the smallest bucket
    assert second_profile == pick_profile(profiles, *second["input_ids"]) == 1 and second["input_ids"][1] > 32


def test_engine_budget_stays_within_what_the_engine_was_built_for(tiny_models, tiny_artifacts, tmp_path, monkeypatch,
                                                                 reference_scores):
    """Calibration never tries a batch the engine's profile cannot hold; an explicit larger budget is refused."""
    from encoderrt import Engine

    engines = fake_tensorrt.install(monkeypatch)
    artifact = tensorrt_graph_artifact(tiny_models, tiny_artifacts, "bert-cross-encoder", tmp_path, layout="packed")
    artifact = _as_tensorrt_artifact(artifact, EngineRecord("10.14.1", "9.0", "fp16", (), 2, plan_packed(max_batch_tokens=300)))
    with Engine.load(artifact) as engine:
        assert engine.info.max_batch_tokens <= 300
        assert max(shapes["input_ids"][0] for _, shapes in engines[0].calls) <= 300
        scores = engine.score(PAIRS[0][0], [PAIRS[0][1]], activation=False)
    np.testing.assert_allclose(scores, reference_scores[:1], atol=1e-4)
    with pytest.raises(ValueError, match=r"max_batch_tokens 4096 is more than this engine was built for \(300\)"):
        Engine.load(artifact, max_batch_tokens=4096)


def test_engine_built_elsewhere_is_refused(tiny_models, tiny_artifacts, tmp_path, monkeypatch):
    fake_tensorrt.install(monkeypatch, capability=(8, 0))
    artifact = tensorrt_graph_artifact(tiny_models, tiny_artifacts, "bert-cross-encoder", tmp_path, layout="packed")
    record = EngineRecord("10.14.1", "9.0", "fp16", (), 2, plan_packed(max_batch_tokens=512))
    with pytest.raises(EngineMismatch, match=r"compute capability 9.0 \(this GPU is 8.0\)"):
        run_artifact(_as_tensorrt_artifact(artifact, record), pairs=PAIRS)


@pytest.fixture
def stand_in_builder(monkeypatch):
    """TensorRT's builder replaced: the 'engine' is the graph, which the fakes (installed by the build) run.

    Returns the build calls. The fakes come in only once the engine is 'built', as transformers
    looks for an installed tensorrt while the model loads.
    """
    from encoderrt.compile import tensorrt as tensorrt_target

    built = []

    def build_engine(onnx_path, engine_path, precision, profiles, packed, graph_inputs):
        built.append((precision, profiles, packed, graph_inputs))
        fake_tensorrt.install(monkeypatch)
        engine_path.write_bytes(onnx_path.read_bytes())
        return EngineRecord("10.14.1", "9.0", precision, profiles, 2, packed)

    monkeypatch.setattr(tensorrt_target, "check_builder", lambda precision, layout: None)
    monkeypatch.setattr(tensorrt_target, "build_engine", build_engine)
    return built


def test_compile_packed_tensorrt_artifact_with_a_stand_in_builder(tiny_dir, tmp_path, monkeypatch, stand_in_builder):
    """compile-model --target tensorrt --layout packed end to end, TensorRT's builder replaced.

    The graph's parity runs on the reference evaluator, the 'engine' parity through the TensorRT
    backend on the fakes; the artifact must record both, the layout and the engine.
    """
    import tiny_models
    from encoderrt.compile import CompileOptions, compile_model
    from encoderrt.runtime.manifest import sha256_file

    model = tiny_models.bert_checkpoint(tiny_dir / "bert-ce-head32", num_labels=1, hidden_size=64, num_attention_heads=2,
                                        intermediate_size=128)
    result = compile_model(CompileOptions(model_dir=model, output_dir=tmp_path / "trt", target="tensorrt", layout="packed",
                                          precision="fp16", max_batch_tokens=1024, quiet=True))
    manifest = read_manifest(result.path)
    assert stand_in_builder == [("fp16", (), plan_packed(1024), ("input_ids", "cu_seqlens", "token_type_ids"))]
    assert (manifest.target, manifest.layout, manifest.precision) == ("tensorrt", "packed", "fp16")
    assert manifest.fused_ops == {"PackedAttention": 2}
    assert EngineRecord.from_dict(manifest.engine["record"]).packed == plan_packed(1024)
    assert manifest.files["engine.plan"] == sha256_file(result.path / "engine.plan")
    assert manifest.parity["graph"]["max_abs_logit_diff"] < 1e-4 and manifest.parity["max_abs_logit_diff"] < 1e-4


def test_compile_int8_tensorrt_graph_of_minilm(minilm_dir, tmp_path, monkeypatch, stand_in_builder):
    """The int8 QDQ graph: SmoothQuant on the 12 LayerNorm-fed inputs, FFN down projections kept out, parity on onnxruntime."""
    import onnx

    from encoderrt.compile import CompileOptions, compile_model

    result = compile_model(CompileOptions(model_dir=minilm_dir, output_dir=tmp_path / "int8", target="tensorrt",
                                          precision="int8", max_batch_tokens=4096, quiet=True))
    manifest = read_manifest(result.path)
    graph = manifest.parity["graph"]
    assert (manifest.precision, manifest.layout, stand_in_builder[0][0]) == ("int8", "padded", "int8")
    assert graph["smoothed_inputs"] == 12 and len(graph["half_precision_nodes"]) == 6
    assert graph["min_cosine"] >= 0.98 and graph["mean_cosine"] >= 0.99
    stored = onnx.load(str(result.path / "model.onnx")).graph
    quantized_weights = [n for n in stored.node
                         if n.op_type == "DequantizeLinear" and n.input[0].endswith("_quantized")]
    assert len(quantized_weights) == 6 * 5  # Q, K, V, attention output and FFN up in each of the 6 layers
    initializers = {i.name: i for i in stored.initializer}
    assert all(onnx.numpy_helper.to_array(initializers[n.input[2]]).max() == 0 for n in quantized_weights[:3])
