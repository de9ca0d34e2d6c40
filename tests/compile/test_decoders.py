"""Decoders (Qwen3, Qwen2, Mistral, Llama): Qwen3-Embedding's folder (last-token pooling after the end-of-text token
its tokenizer appends, an instruction prompt for queries, Normalize) and a sequence-classification reranker on tiny
random checkpoints, against sentence-transformers, with the tokenizer padding on either side, mixed lengths, texts
past the limit; attention runs causal with no mask in either graph."""

import json
import shutil

import heldout_texts
import numpy as np
import onnx
import pytest
import torch

import tiny_models as tm
from artifact_runner import cosine_rows, run_artifact
from encoderrt import Engine
from encoderrt.runtime.manifest import read_manifest

QWEN3_PROMPTS = {"query": "Instruct: rank passages for the query\nQuery:", "document": ""}
"""Qwen3-Embedding's kind of prompts (config_sentence_transformers.json), its instruction short enough that the tiny
tokenizer leaves room for the text within 48 tokens."""
TEXTS = ["search query", "the quick brown fox jumps over a lazy dog", "привет мир", "x", "größe café 東京",
         " ".join(["rank score"] * 80)]
PAIRS = tm.PAIRS + [("привет", "как дела мир")]


@pytest.fixture(scope="module")
def sources(tiny_dir):
    root = tiny_dir / "decoders"
    folders = {
        (family, side): tm.sentence_transformers_folder(root / f"{family}-{side}", pooling="lasttoken", normalize=True,
                                                        family=family, prompts=QWEN3_PROMPTS, seed=i,
                                                        decoder_tokenizer={"padding_side": side})
        for i, (family, side) in enumerate([("qwen3", "left"), ("qwen3", "right"), ("qwen2", "left"),
                                            ("mistral", "left"), ("llama", "left")])
    }
    folders["qwen3", "score"] = tm.family_checkpoint(root / "qwen3-seq-cls", "qwen3", num_labels=1, seed=9)
    return folders


COMPILED = [("qwen3", "left", "cpu"), ("qwen3", "left", "openvino"), ("qwen3", "right", "cpu"),
            ("qwen2", "left", "cpu"), ("mistral", "left", "openvino"), ("llama", "left", "cpu")]


@pytest.fixture(scope="module")
def artifacts(sources, compile_artifact, tmp_path_factory):
    root = tmp_path_factory.mktemp("decoder-artifacts")
    return {(family, side, target): compile_artifact(sources[family, side], root / f"{family}-{side}-{target}",
                                                     target=target).path
            for family, side, target in COMPILED}


def _causal_attention_without_masks(artifact) -> int:
    """Attention ops that run causal with no mask: onnxruntime's unidirectional MultiHeadAttention with q, k and v
    alone, or OpenVINO's causal SDPA whose mask and scale inputs are scalars."""
    manifest = read_manifest(artifact)
    if manifest.target == "cpu":
        nodes = [n for n in onnx.load(artifact / "model.onnx").graph.node if n.op_type == "MultiHeadAttention"]
        return sum(len(n.input) == 3 and any(a.name == "unidirectional" and a.i == 1 for a in n.attribute) for n in nodes)
    import openvino as ov

    ops = [op for op in ov.Core().read_model(artifact / "model.xml").get_ordered_ops()
           if op.get_type_name() == "ScaledDotProductAttention"]
    return sum(op.get_attributes()["causal"] and all(i.get_partial_shape().rank.get_length() == 0 for i in op.inputs()[3:])
               for op in ops)


@pytest.mark.parametrize(("family", "side", "target"), COMPILED)
def test_last_token_embeddings_match_sentence_transformers(family, side, target, sources, artifacts):
    """With and without the instruction prompt, padded beside longer rows and alone, past Mistral's window and the
    48-token limit, where the tokenizer still ends the row with its end-of-text token (the token pooled)."""
    from sentence_transformers import SentenceTransformer

    artifact = artifacts[family, side, target]
    manifest = read_manifest(artifact)
    assert (manifest.model_type, manifest.pooling, manifest.normalize, manifest.max_length) == (family, "lasttoken", True, 48)
    # Mistral's window (16 tokens here) keeps transformers' mask; the others need none
    assert _causal_attention_without_masks(artifact) == (0 if family == "mistral" else manifest.shape.num_layers)
    reference = SentenceTransformer(str(sources[family, side]), device="cpu")
    assert reference.tokenizer.padding_side == side
    with Engine.load(artifact) as engine:
        for prompt_name in (None, "query"):
            expected = reference.encode(TEXTS, prompt_name=prompt_name)
            batched = np.array(engine.embed(TEXTS, prompt_name=prompt_name))
            alone = np.array([engine.embed([text], prompt_name=prompt_name)[0] for text in TEXTS])
            assert cosine_rows(batched, expected).min() >= 0.99999
            assert cosine_rows(alone, expected).min() >= 0.99999
            assert cosine_rows(expected[:1], expected[1:2])[0] < 0.999  # the texts, not the instruction alone, decide
        assert cosine_rows(expected[:1], reference.encode(TEXTS[:1]))[0] < 0.999  # the instruction made a difference
        truncated = engine.tokenize(TEXTS[-1])
    eos = reference.tokenizer.eos_token_id
    assert len(truncated) == 48 and truncated[-1] == eos == reference.preprocess([TEXTS[-1]])["input_ids"][0, -1]


@pytest.mark.parametrize("target", ["cpu", "openvino"])
def test_sequence_classification_reranker_matches_the_cross_encoder(target, sources, compile_artifact, tmp_path):
    """A decoder with a one-label head on its last token (Qwen3-Reranker converted to sequence classification)."""
    from sentence_transformers import CrossEncoder

    result = compile_artifact(sources["qwen3", "score"], tmp_path / "artifact", target=target)
    assert (result.manifest.task, result.manifest.activation) == ("score", "sigmoid")
    assert _causal_attention_without_masks(result.path) == 2
    model = CrossEncoder(str(sources["qwen3", "score"]), device="cpu", max_length=result.manifest.max_length)
    reference = model.predict(PAIRS, activation_fn=torch.nn.Identity(), convert_to_numpy=True).reshape(-1, 1)
    logits = run_artifact(result.path, pairs=PAIRS)
    rows = np.concatenate([run_artifact(result.path, pairs=[pair]) for pair in PAIRS])
    assert np.abs(logits - reference).max() <= 1e-3 and np.abs(rows - reference).max() <= 1e-3
    assert reference.std() > 0.05


@pytest.mark.parametrize(("target", "precision"), [("openvino", "bf16"), ("openvino", "int8"), ("cpu", "int8")])
def test_lossy_precisions_stay_close_to_sentence_transformers(target, precision, sources, compile_artifact, tmp_path):
    from sentence_transformers import SentenceTransformer

    source = sources["qwen3", "left"]
    result = compile_artifact(source, tmp_path / "artifact", target=target, precision=precision)
    assert result.manifest.precision == precision
    texts = TEXTS + list(heldout_texts.TEXTS)  # beside the short ones, text neither calibration nor probes hold
    reference = SentenceTransformer(str(source), device="cpu").encode(texts, prompt_name="query")
    with Engine.load(result.path) as engine:
        similarity = cosine_rows(np.array(engine.embed(texts, prompt_name="query")), reference)
    floor = 0.999 if precision == "bf16" else 0.98
    assert similarity.min() >= floor and similarity.mean() >= 0.995, (similarity.min(), similarity.mean())


def test_a_folder_with_its_own_model_code_is_refused(sources, compile_artifact, tmp_path):
    """gte-Qwen2's folder names code of its own (auto_map) that attends bidirectionally; transformers' Qwen2 class
    would serve other vectors, so it is refused by name, and nothing is written."""
    from encoderrt.compile import InputError

    folder = shutil.copytree(sources["qwen2", "left"], tmp_path / "remote-code")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModel": "modeling_qwen.Qwen2Model"}}))
    with pytest.raises(InputError, match=r"own model code \(modeling_qwen.Qwen2Model"):
        compile_artifact(folder, tmp_path / "artifact")
    assert not (tmp_path / "artifact").exists()
