"""Tiny random BERT / RoBERTa / XLM-R checkpoints: every task, against independent references."""

import numpy as np
import pytest
import torch

from artifact_runner import cosine_rows, run_artifact
from encoderrt.runtime.manifest import read_manifest
from tiny_models import PAIRS

TEXTS = ["search query", "the quick brown fox jumps over a lazy dog", "привет мир", "x", " ".join(["rank score"] * 80)]


def _cross_encoder_logits(folder, pairs, max_length):
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(folder), device="cpu", max_length=max_length)
    return model.predict(pairs, activation_fn=torch.nn.Identity(), convert_to_numpy=True).reshape(len(pairs), -1)


@pytest.mark.parametrize("name", ["bert-cross-encoder", "roberta-cross-encoder"])
def test_cross_encoder_logits_match_sentence_transformers(name, tiny_models, tiny_artifacts):
    manifest = read_manifest(tiny_artifacts[name])
    assert manifest.task == "score" and manifest.activation == "sigmoid" and manifest.labels == ("LABEL_0",)
    logits = run_artifact(tiny_artifacts[name], pairs=PAIRS)
    reference = _cross_encoder_logits(tiny_models[name], PAIRS, manifest.max_length)
    assert np.abs(logits - reference).max() <= 1e-3
    assert reference.std() > 0.05  # the random model separates inputs, so the comparison means something


def test_bert_cross_encoder_needs_token_type_ids(tiny_artifacts):
    """Dropping segment ids (a common serving bug) must visibly change scores for this model."""
    wired = run_artifact(tiny_artifacts["bert-cross-encoder"], pairs=PAIRS)
    dropped = run_artifact(tiny_artifacts["bert-cross-encoder"], pairs=PAIRS, drop_token_type_ids=True)
    assert np.abs(wired - dropped).max() > 1e-2


def test_roberta_takes_no_segment_input_and_ignores_padding(tiny_artifacts):
    manifest = read_manifest(tiny_artifacts["roberta-cross-encoder"])
    assert manifest.inputs == ("input_ids", "attention_mask") and manifest.pad_token_id == 1
    assert manifest.max_length == 64  # 66 positions minus padding_idx + 1
    batched = run_artifact(tiny_artifacts["roberta-cross-encoder"], pairs=PAIRS)
    single = np.concatenate([run_artifact(tiny_artifacts["roberta-cross-encoder"], pairs=[p]) for p in PAIRS])
    np.testing.assert_allclose(batched, single, atol=1e-4)


def test_classifier_logits_match_transformers(tiny_models, tiny_artifacts):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    manifest = read_manifest(tiny_artifacts["bert-classifier"])
    assert manifest.task == "classify" and manifest.activation == "softmax"
    assert manifest.labels == ("LABEL_0", "LABEL_1", "LABEL_2") and manifest.shape.output_dim == 3
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["bert-classifier"])
    model = AutoModelForSequenceClassification.from_pretrained(tiny_models["bert-classifier"]).eval()
    with torch.inference_mode():
        batch = tokenizer(TEXTS, padding=True, truncation=True, max_length=manifest.max_length, return_tensors="pt")
        reference = model(**batch).logits.numpy()
    np.testing.assert_allclose(run_artifact(tiny_artifacts["bert-classifier"], texts=TEXTS), reference, atol=1e-3)


def test_sentence_transformers_cls_pooling(tiny_models, tiny_artifacts):
    from sentence_transformers import SentenceTransformer

    manifest = read_manifest(tiny_artifacts["st-cls"])
    assert (manifest.pooling, manifest.normalize, manifest.max_length) == ("cls", True, 48)
    reference = SentenceTransformer(str(tiny_models["st-cls"]), device="cpu").encode(TEXTS)
    embeddings = run_artifact(tiny_artifacts["st-cls"], texts=TEXTS)
    assert cosine_rows(embeddings, reference).min() >= 0.99999
    assert cosine_rows(reference[:1], reference[1:2])[0] < 0.999  # distinct inputs, distinct vectors


def test_bare_xlm_roberta_encoder_defaults_to_mean_pooling(tiny_models, tiny_artifacts):
    from transformers import AutoModel, AutoTokenizer

    manifest = read_manifest(tiny_artifacts["xlm-roberta-encoder"])
    assert (manifest.task, manifest.pooling, manifest.model_type) == ("embed", "mean", "xlm-roberta")
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["xlm-roberta-encoder"])
    model = AutoModel.from_pretrained(tiny_models["xlm-roberta-encoder"]).eval()
    with torch.inference_mode():
        batch = tokenizer(TEXTS, padding=True, truncation=True, max_length=manifest.max_length, return_tensors="pt")
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        reference = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    assert cosine_rows(run_artifact(tiny_artifacts["xlm-roberta-encoder"], texts=TEXTS), reference).min() >= 0.99999


def test_pooling_override_and_max_length(tiny_models, compile_artifact, tmp_path):
    result = compile_artifact(tiny_models["st-cls"], tmp_path / "mean", pooling="mean", max_length=32, normalize=False)
    manifest = result.manifest
    assert (manifest.pooling, manifest.normalize, manifest.max_length) == ("mean", False, 32)
    assert manifest.parity["reference"] == "transformers"  # the folder's own pooling no longer applies


def test_int8_cross_encoder_keeps_ranking(tiny_models, compile_artifact, tmp_path):
    result = compile_artifact(tiny_models["bert-cross-encoder"], tmp_path / "ce-int8", precision="int8")
    parity = result.manifest.parity
    assert parity["spearman"] >= 0.98
    # every attempt is on record: a plain int8 graph that missed tolerance is retried with FFN down projections in fp32
    for attempt in parity["attempts"]:
        assert attempt["failures"] and not attempt["fp32_nodes"]
    logits = run_artifact(result.path, pairs=PAIRS)
    reference = _cross_encoder_logits(tiny_models["bert-cross-encoder"], PAIRS, result.manifest.max_length)
    assert np.corrcoef(logits.ravel(), reference.ravel())[0, 1] > 0.95


def test_declared_activation_is_respected(tiny_models, compile_artifact, tmp_path):
    """A cross-encoder saved with an Identity activation reports raw logits by default (sentence-transformers' rule)."""
    from sentence_transformers import CrossEncoder

    folder = tmp_path / "ce-identity"
    CrossEncoder(str(tiny_models["bert-cross-encoder"]), device="cpu", activation_fn=torch.nn.Identity()).save_pretrained(str(folder))
    result = compile_artifact(folder, tmp_path / "ce-identity-artifact")
    assert result.manifest.task == "score" and result.manifest.activation == "identity"


def test_int8_keeps_ffn_down_projections_fp32_when_parity_asks(tiny_models, compile_artifact, tmp_path, monkeypatch):
    import onnx

    from encoderrt.compile import parity

    real_check = parity.check_parity
    calls = []

    def first_attempt_fails(*args, **kwargs):
        figures, failures = real_check(*args, **kwargs)
        calls.append(figures)
        return figures, (["injected failure"] if len(calls) == 1 else failures)

    monkeypatch.setattr(parity, "check_parity", first_attempt_fails)
    result = compile_artifact(tiny_models["bert-cross-encoder"], tmp_path / "ce-int8-mixed", cached=False,
                              precision="int8")
    kept = result.manifest.parity["fp32_nodes"]
    assert len(calls) == 2 and len(kept) == 2  # one FFN down projection per layer
    assert result.manifest.parity["attempts"][0]["failures"] == ["injected failure"]
    nodes = {node.name: node.op_type for node in onnx.load(str(result.path / "model.onnx")).graph.node}
    assert all(nodes[name] == "MatMul" for name in kept)
    assert "MatMulInteger" in nodes.values() and "QAttention" in nodes.values()


def _quantised_weight_types(model_path):
    import onnx

    graph = onnx.load(str(model_path)).graph
    return {onnx.TensorProto.DataType.Name(init.data_type) for init in graph.initializer if init.name.endswith("_quantized")}


def test_int8_weights_follow_the_cpu(tiny_models, compile_artifact, tmp_path):
    """u8 x s8 saturates without VNNI/AMX (runtime/cpu.py): there compile quantises weights to uint8 instead,
    records which, and parity holds either way (this test runs on whichever kind of CPU CI has)."""
    from encoderrt.runtime.cpu import int8_dot_products

    result = compile_artifact(tiny_models["bert-cross-encoder"], tmp_path / "ce-int8", precision="int8")
    expected = "int8" if int8_dot_products() else "uint8"
    assert result.manifest.parity["weights"] == expected
    assert _quantised_weight_types(result.path / "model.onnx") == {expected.upper()}
    assert result.manifest.parity["spearman"] >= 0.98


@pytest.mark.parametrize("unsigned, expected", [(False, {"INT8"}), (True, {"UINT8"})])
def test_quantiser_writes_the_weight_type_asked_for(unsigned, expected, tiny_artifacts, tmp_path):
    from encoderrt.compile.quantize import quantize_int8

    quantize_int8(tiny_artifacts["bert-cross-encoder"] / "model.onnx", tmp_path / "q.onnx", unsigned_weights=unsigned)
    assert _quantised_weight_types(tmp_path / "q.onnx") == expected


@pytest.mark.parametrize("problem_type", ["multi_label_classification", "single_label_classification"])
def test_a_classifier_scores_labels_as_the_text_classification_pipeline_does(problem_type, tiny_dir, compile_artifact,
                                                                             tmp_path):
    """A multi-label classifier (toxicity, emotions: config's problem_type) scores each label by its sigmoid, a
    single-label one by softmax: the scores transformers' text-classification pipeline returns."""
    import json

    from transformers import pipeline

    import tiny_models as tm
    from encoderrt import Engine

    folder = tm.bert_checkpoint(tiny_dir / f"classifier-{problem_type}", num_labels=4, seed=11)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "problem_type": problem_type}))
    classifier = pipeline("text-classification", model=str(folder), top_k=None, device="cpu")
    expected = classifier(TEXTS, truncation=True)
    result = compile_artifact(folder, tmp_path / "artifact")
    multi_label = problem_type == "multi_label_classification"
    assert result.manifest.activation == ("sigmoid" if multi_label else "softmax")
    with Engine.load(result.path) as engine:
        classified = engine.classify(TEXTS)
    for got, reference in zip(classified, expected, strict=True):
        scores = {item["label"]: item["score"] for item in reference}
        np.testing.assert_allclose(got.probs, [scores[label] for label in result.manifest.labels], atol=1e-5)
        assert got.label == reference[0]["label"]
    sums = [sum(got.probs) for got in classified]
    assert (min(abs(total - 1) for total in sums) > 0.05) if multi_label else np.allclose(sums, 1)
