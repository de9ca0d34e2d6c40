"""The openvino target at fp32, bf16 and int8, against sentence-transformers and CrossEncoder, on the bundled
model and the tiny checkpoints; the bf16 fallback on a CPU without bf16; refusals that write nothing."""

import numpy as np
import pytest
import torch

from artifact_runner import cosine_rows, run_artifact
from encoderrt import Engine
from encoderrt.bench import workloads
from encoderrt.compile import ParityError
from encoderrt.compile.openvino import SMOOTHING_ALPHA, SMOOTHING_ALPHA_7BIT
from encoderrt.runtime.backends import openvino as openvino_backend
from encoderrt.runtime.cpu import int8_dot_products
from encoderrt.runtime.manifest import read_manifest

pytest.importorskip("openvino", reason="the openvino target needs OpenVINO (a default dependency)")

PAIRS = [
    ("where is the amazon rainforest", "the amazon rainforest covers much of the amazon basin of south america"),
    ("where is the amazon rainforest", "der schnelle braune fuchs springt über den hund"),
    ("café", "résumé naïve café"),
    ("东京", "东京 日本 首都"),
    ("the quick brown fox", " ".join(["fox jumps over the lazy dog"] * 30)),
    ("how do rivers form", "rivers form when water flows downhill"),
    ("how do rivers form", "bread is baked in an oven"),
]
# passages the parity probes and the calibration texts never saw, with a long tail, plus short queries
TEXTS = workloads.passages(48, seed=11) + workloads.queries(16, seed=12) + ["a", "Привет, мир", "東京は日本の首都です。"]


@pytest.fixture(scope="module")
def st_embeddings(minilm_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu").encode(TEXTS, convert_to_numpy=True)


@pytest.fixture(scope="module")
def minilm_openvino(minilm_dir, tmp_path_factory, compile_artifact):
    root = tmp_path_factory.mktemp("openvino")
    return {p: compile_artifact(minilm_dir, root / p, target="openvino", precision=p) for p in ("fp32", "bf16", "int8")}


def _embed(result):
    with Engine.load(result.path) as engine:
        return engine.embed(TEXTS), engine.info


def test_fp32_matches_sentence_transformers(minilm_openvino, st_embeddings):
    result = minilm_openvino["fp32"]
    manifest = read_manifest(result.path)
    assert (manifest.target, manifest.precision, manifest.model_file) == ("openvino", "fp32", "model.xml")
    assert {"model.xml", "model.bin", "tokenizer.json"} <= set(manifest.files)
    assert manifest.fused_ops["ScaledDotProductAttention"] == 6 and manifest.fused_ops["MVN"] == 13
    embeddings, info = _embed(result)
    assert cosine_rows(embeddings, st_embeddings).min() >= 0.99999
    assert "f32" in info.execution and info.parallel_runs >= 1


def test_bf16_meets_the_lossless_tier_against_sentence_transformers(minilm_openvino, st_embeddings):
    result = minilm_openvino["bf16"]
    assert result.manifest.parity["lossless"] is True
    embeddings, info = _embed(result)
    cosines = cosine_rows(embeddings, st_embeddings)
    assert cosines.min() >= 0.9999
    if openvino_backend.native_bf16():
        assert info.execution.startswith("openvino bf16")
        fp32, _ = _embed(minilm_openvino["fp32"])
        assert not np.array_equal(embeddings, fp32)  # bf16 really ran: it rounds differently from f32


def test_bf16_falls_back_to_f32_on_a_cpu_without_bf16_and_says_so(minilm_openvino, st_embeddings, monkeypatch):
    monkeypatch.setattr(openvino_backend, "_has_bf16", lambda core: False)
    embeddings, info = _embed(minilm_openvino["bf16"])
    assert info.precision == "bf16" and "openvino f32 (bf16 asked for; this CPU has no bf16 instructions)" in info.execution
    assert cosine_rows(embeddings, st_embeddings).min() >= 0.99999  # f32 execution: exact again


def test_int8_meets_its_quality_floor_on_unseen_passages(minilm_openvino, st_embeddings):
    result = minilm_openvino["int8"]
    assert result.manifest.fused_ops["FakeQuantize"] > 0
    parity = result.manifest.parity
    if int8_dot_products():  # VNNI / AMX: every GEMM but attention int8 unless the probes ask for more
        assert parity["smooth_quant_alpha"] == SMOOTHING_ALPHA and len(parity["kept_nodes"]) in (0, 6)
        assert len(parity["attempts"]) == (1 if parity["kept_nodes"] else 0)
    else:  # 7-bit weights: the FFN down projections kept from the start, milder smoothing
        assert parity["smooth_quant_alpha"] == SMOOTHING_ALPHA_7BIT and len(parity["kept_nodes"]) == 6
        assert parity["attempts"] == []
        # per layer: Q/K/V's shared input, the attention output, the FFN up and (unless kept) the FFN down projection
        assert result.manifest.fused_ops["FakeQuantize"] == (3 if parity["kept_nodes"] else 4) * 6
    embeddings, _ = _embed(result)
    cosines = cosine_rows(embeddings, st_embeddings)
    assert cosines.mean() >= 0.995 and cosines.min() >= 0.98


def _cross_encoder_logits(folder, max_length):
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(folder), device="cpu", max_length=max_length)
    return model.predict(PAIRS, activation_fn=torch.nn.Identity(), convert_to_numpy=True).reshape(len(PAIRS), -1)


@pytest.mark.parametrize("name", ["bert-cross-encoder", "roberta-cross-encoder"])
def test_cross_encoders_match_cross_encoder_predict(name, tiny_models, compile_artifact, tmp_path):
    fp32 = compile_artifact(tiny_models[name], tmp_path / "fp32", target="openvino", precision="fp32")
    bf16 = compile_artifact(tiny_models[name], tmp_path / "bf16", target="openvino", precision="bf16")
    reference = _cross_encoder_logits(tiny_models[name], fp32.manifest.max_length)
    assert reference.std() > 0.05
    assert np.abs(run_artifact(fp32.path, pairs=PAIRS) - reference).max() <= 1e-3
    half = run_artifact(bf16.path, pairs=PAIRS)
    # bf16 keeps 7 mantissa bits: logits move by a few hundredths, near-ties may swap, the shape stays
    assert np.abs(half - reference).max() <= 0.15 and np.corrcoef(half.ravel(), reference.ravel())[0, 1] >= 0.99
    with Engine.load(fp32.path) as engine:  # the served scores apply the model's sigmoid
        scores = engine.score(PAIRS[0][0], [d for q, d in PAIRS[:2]])
    np.testing.assert_allclose(scores, 1 / (1 + np.exp(-reference[:2, 0])), atol=1e-4)


def test_openvino_graph_reads_token_type_ids(tiny_models, compile_artifact, tmp_path):
    result = compile_artifact(tiny_models["bert-cross-encoder"], tmp_path / "ce", target="openvino", precision="fp32")
    wired = run_artifact(result.path, pairs=PAIRS)
    dropped = run_artifact(result.path, pairs=PAIRS, drop_token_type_ids=True)
    assert np.abs(wired - dropped).max() > 1e-2


def test_tiny_embedding_models_at_every_precision(tiny_models, compile_artifact, tmp_path):
    from sentence_transformers import SentenceTransformer

    texts = TEXTS[:20]
    reference = SentenceTransformer(str(tiny_models["st-cls"]), device="cpu").encode(texts, convert_to_numpy=True)
    floors = {"fp32": (0.99999, 0.99999), "bf16": (0.995, 0.999), "int8": (0.98, 0.995)}
    for precision, (least, mean) in floors.items():
        result = compile_artifact(tiny_models["st-cls"], tmp_path / precision, target="openvino", precision=precision)
        cosines = cosine_rows(run_artifact(result.path, texts=texts), reference)
        assert cosines.min() >= least and cosines.mean() >= mean, (precision, cosines.min(), cosines.mean())


def test_int8_below_its_floor_is_refused_and_writes_nothing(tiny_models, compile_artifact, tmp_path, monkeypatch):
    """A floor int8 cannot meet (logits within 1e-6 of PyTorch's) refuses the artifact and leaves no folder behind.
    (A random tiny cross-encoder's ranking fell under the real floor, Spearman 0.99, until calibration saw the real
    tokens only: compile/unpad.py.)"""
    from encoderrt.compile import parity

    unreachable = parity.Tolerance(max_abs_logit_diff=1e-6)
    monkeypatch.setitem(parity.TARGET_TOLERANCES, ("openvino", "logits", "int8"), unreachable)
    with pytest.raises(ParityError, match=r"logit"):
        compile_artifact(tiny_models["bert-cross-encoder"], tmp_path / "out", cached=False, target="openvino",
                         precision="int8")
    assert list(tmp_path.iterdir()) == []


def test_bad_precision_target_pairs_name_the_problem_and_write_nothing(tiny_models, tmp_path, capsys):
    from encoderrt.cli import compile_model_main

    out = tmp_path / "out"
    code = compile_model_main([str(tiny_models["st-cls"]), "-o", str(out), "--target", "cpu", "--precision", "bf16", "-q"])
    assert code == 2 and "needs --target openvino or tensorrt" in capsys.readouterr().err
    code = compile_model_main([str(tiny_models["st-cls"]), "-o", str(out), "--target", "openvino", "--precision", "fp16", "-q"])
    assert code == 2 and "--precision fp16 needs --target tensorrt" in capsys.readouterr().err
    assert not out.exists() and list(tmp_path.iterdir()) == []
