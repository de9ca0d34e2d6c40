"""The onnxruntime graph runs its projections on the real tokens only (compile/unpad.py): onnxruntime's own profiler
shows each MatMul's rows, and the per-token states match transformers' row by row, with padding left at zero."""

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from encoderrt.compile.unpad import UNPADDED
from encoderrt.runtime.backends.onnxruntime_cpu import KEEP_UNFUSED
from encoderrt.runtime.manifest import read_manifest
from encoderrt.runtime.tokenizer import TextTokenizer

TEXTS = ["a", "how do rivers form when it rains for a long time in the mountains", "bread", "the quick brown fox"]


def _batch(artifact: Path):
    manifest = read_manifest(artifact)
    tokenizer = TextTokenizer.for_artifact(manifest, artifact)
    rows = tokenizer.encode(TEXTS)
    width = max(len(row.ids) for row in rows)
    feeds = {name: np.zeros((len(rows), width), np.int64) for name in manifest.inputs}
    for i, row in enumerate(rows):
        feeds["input_ids"][i, :len(row.ids)] = row.ids
        feeds["attention_mask"][i, :len(row.ids)] = 1
    return manifest, feeds, sum(len(row.ids) for row in rows)


def _projections(artifact: Path, feeds: dict, tmp_path: Path) -> list[tuple[str, int]]:
    """The op and rows of every projection kernel onnxruntime ran as the backend loads the graph (MatMul-like, or a
    MatMul fused with its bias: Gemm), from its profile."""
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    session = ort.InferenceSession(str(artifact / "model.onnx"), options, providers=["CPUExecutionProvider"],
                                   disabled_optimizers=KEEP_UNFUSED)
    session.run(None, feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    kernels = [(event["args"]["op_name"], event["args"]["input_type_shape"][0]) for event in events
               if event.get("cat") == "Node" and event["name"].endswith("_kernel_time")
               and ("MatMul" in event["args"].get("op_name", "") or event["args"].get("op_name") == "Gemm")]
    return [(op, int(np.prod(next(iter(shape.values()))[:-1]))) for op, shape in kernels]


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_minilm_projections_run_on_the_real_tokens_only(precision, minilm_fp32, minilm_int8, tmp_path):
    artifact = (minilm_fp32 if precision == "fp32" else minilm_int8).path
    manifest, feeds, real = _batch(artifact)
    padded = feeds["input_ids"].size
    assert real < 0.5 * padded  # the batch is mostly padding
    # by hand: per layer, the attention output projection and the feed-forward's two (q, k, v are inside Attention)
    layers = manifest.shape.num_layers
    assert manifest.fused_ops[UNPADDED] == 3 * layers
    projections = _projections(artifact, feeds, tmp_path)
    rows = [count for _, count in projections]
    assert len(rows) >= 3 * layers
    assert set(rows) == {real}, f"MatMul rows {sorted(set(rows))}: {real} real tokens, {padded} padded"
    if precision == "fp32":  # the rows are [tokens, width]: each projection followed by its bias is one Gemm
        assert sum(op == "Gemm" for op, _ in projections) == 2 * layers, projections  # the up projection's: BiasGelu


@pytest.fixture(scope="module")
def minilm_openvino(minilm_dir, compile_artifact, tmp_path_factory):
    return compile_artifact(minilm_dir, tmp_path_factory.mktemp("unpad") / "minilm-openvino", target="openvino")


def _token_states(artifact: Path, feeds: dict) -> np.ndarray:
    if (artifact / "model.onnx").exists():
        session = ort.InferenceSession(str(artifact / "model.onnx"), providers=["CPUExecutionProvider"])
        return session.run(["token_embeddings"], feeds)[0]
    import openvino as ov

    # the fp32 artifact in f32, as its backend runs it: on AMX OpenVINO's default would be bf16
    compiled = ov.Core().compile_model(str(artifact / "model.xml"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return compiled({name: feeds[name] for name in (i.get_any_name() for i in compiled.inputs)})["token_embeddings"]


@pytest.mark.parametrize("target", ["cpu", "openvino"])
def test_minilm_token_states_match_transformers_row_by_row(target, minilm_fp32, minilm_openvino, minilm_dir):
    """Each row's states at its real tokens are transformers' for that text alone; the padded positions are zeros."""
    import torch
    from transformers import AutoModel

    artifact = (minilm_fp32 if target == "cpu" else minilm_openvino).path
    manifest, feeds, _ = _batch(artifact)
    # by hand, per layer: the attention output and the FFN's two; q, k and v too on OpenVINO (onnxruntime fuses them)
    assert manifest.fused_ops[UNPADDED] == (3 if target == "cpu" else 6) * manifest.shape.num_layers
    states = _token_states(artifact, feeds)
    model = AutoModel.from_pretrained(minilm_dir).eval()
    for i, mask in enumerate(feeds["attention_mask"]):
        n = int(mask.sum())
        with torch.no_grad():
            expected = model(input_ids=torch.tensor(feeds["input_ids"][i:i + 1, :n])).last_hidden_state[0].numpy()
        np.testing.assert_allclose(states[i, :n], expected, atol=2e-5)
        assert not states[i, n:].any()


def test_openvino_projections_run_on_the_real_tokens_in_sixteens(minilm_openvino):
    """OpenVINO's graph runs each projection on the real tokens' rows, their count rounded up to a multiple of 16 (the
    first row repeated): batches of nearby sizes then share every internal shape (unpad.OV_ROW_BUCKET)."""
    import openvino as ov

    artifact = minilm_openvino.path
    manifest, feeds, real = _batch(artifact)
    model = ov.Core().read_model(str(artifact / "model.xml"))
    projections = [op for op in model.get_ordered_ops() if op.get_type_name() == "MatMul"
                   and op.get_input_partial_shape(0).rank.get_length() == 3 and op.get_input_partial_shape(0)[0] == 1]
    assert len(projections) == manifest.fused_ops[UNPADDED] == 6 * manifest.shape.num_layers
    model.add_outputs([op.output(0) for op in projections])
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    results = compiled({name: feeds[name] for name in (i.get_any_name() for i in compiled.inputs)})
    rows = {results[output].shape[1] for output in compiled.outputs[-len(projections):]}
    assert real % 16 and rows == {-(-real // 16) * 16}, (real, rows)
