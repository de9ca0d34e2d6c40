"""Decoders (Qwen3, Qwen2, Mistral, Llama, Gemma): Qwen3-Embedding's folder (last-token pooling after the end-of-text
token its tokenizer appends, an instruction prompt for queries, Normalize) and sequence-classification and causal-LM
rerankers on tiny random checkpoints, against sentence-transformers, with the tokenizer padding on either side, mixed
lengths, texts past the limit; attention runs causal with no mask in either graph."""

import json
import shutil

import heldout_texts
import numpy as np
import onnx
import pytest
import torch

import tiny_models as tm
from artifact_runner import cosine_rows, run_artifact, torch_flops_per_token
from encoderrt import Engine
from encoderrt.bench.flops import flops_per_token
from encoderrt.runtime.errors import InvalidRequest
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
                                            ("mistral", "left"), ("llama", "left"), ("gemma", "left")])
    }
    # Qwen3-0.6B's layout: query heads x head width (4 x 16) twice the hidden size
    folders["qwen3", "score"] = tm.family_checkpoint(root / "qwen3-seq-cls", "qwen3", num_labels=1, seed=9, head_dim=16)
    return folders


COMPILED = [("qwen3", "left", "cpu"), ("qwen3", "left", "openvino"), ("qwen3", "right", "cpu"),
            ("qwen2", "left", "cpu"), ("mistral", "left", "openvino"), ("llama", "left", "cpu"),
            ("gemma", "left", "cpu"), ("gemma", "left", "openvino")]


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
def test_a_bare_decoder_folder_with_last_token_pooling_asked_for(target, sources, compile_artifact, tmp_path):
    """transformers' folder alone, `--pooling lasttoken`: compile checks it against transformers' own model, whose
    tokenizer pads on the left (the reference once pooled a padding token there and refused the artifact)."""
    from sentence_transformers import SentenceTransformer, models

    from encoderrt.compile import CompileOptions
    from encoderrt.compile.source import inspect_source

    folder = tm.family_checkpoint(tmp_path / "qwen3-bare", "qwen3", None, seed=4)
    unasked = inspect_source(CompileOptions(model_dir=folder, output_dir=tmp_path / "unused"))
    assert unasked.pooling == "mean" and any("--pooling lasttoken" in note for note in unasked.notes)
    result = compile_artifact(folder, tmp_path / "artifact", target=target, pooling="lasttoken")
    assert result.manifest.pooling == "lasttoken" and result.manifest.parity["min_cosine"] >= 0.99999
    transformer = models.Transformer(str(folder))
    assert transformer.tokenizer.padding_side == "left"
    pooling = models.Pooling(transformer.get_word_embedding_dimension(), "lasttoken")
    reference = SentenceTransformer(modules=[transformer, pooling], device="cpu").encode(TEXTS)
    with Engine.load(result.path) as engine:
        assert cosine_rows(np.array(engine.embed(TEXTS)), reference).min() >= 0.99999


@pytest.mark.parametrize("target", ["cpu", "openvino"])
def test_sequence_classification_reranker_matches_the_cross_encoder(target, sources, compile_artifact, tmp_path):
    """A decoder with a one-label head on its last token (Qwen3-Reranker converted to sequence classification), its
    heads wider than the hidden size; the bench's FLOPs per token count them (and grouped-query attention) as
    PyTorch's own counter does."""
    from sentence_transformers import CrossEncoder

    result = compile_artifact(sources["qwen3", "score"], tmp_path / "artifact", target=target)
    assert (result.manifest.task, result.manifest.activation) == ("score", "sigmoid")
    assert result.manifest.shape.attention_width == 64 == 2 * result.manifest.shape.hidden_size
    reference = torch_flops_per_token(sources["qwen3", "score"], tokens=40)
    assert flops_per_token(result.manifest.shape, 40) == pytest.approx(reference, rel=2e-3)
    assert _causal_attention_without_masks(result.path) == 2
    model = CrossEncoder(str(sources["qwen3", "score"]), device="cpu", max_length=result.manifest.max_length)
    reference = model.predict(PAIRS, activation_fn=torch.nn.Identity(), convert_to_numpy=True).reshape(-1, 1)
    logits = run_artifact(result.path, pairs=PAIRS)
    rows = np.concatenate([run_artifact(result.path, pairs=[pair]) for pair in PAIRS])
    assert np.abs(logits - reference).max() <= 1e-3 and np.abs(rows - reference).max() <= 1e-3
    assert reference.std() > 0.05


@pytest.fixture(scope="module")
def messages_cross_encoder(tiny_dir):
    """A Qwen3 sequence-classification reranker whose tokenizer has a chat template, saved by CrossEncoder."""
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer

    folder = tiny_dir / "decoders" / "qwen3-seq-cls-messages"
    bare = tm.family_checkpoint(folder.with_name(folder.name + "-bare"), "qwen3", num_labels=1, seed=11)
    tokenizer = AutoTokenizer.from_pretrained(bare)
    tokenizer.chat_template = tm.CHATML_TEMPLATE
    tokenizer.save_pretrained(bare)
    CrossEncoder(str(bare), device="cpu").save(str(folder))
    return folder


@pytest.mark.parametrize("target", ["cpu", "openvino"])
def test_a_cross_encoder_that_reads_pairs_as_chat_messages_matches_it(target, messages_cross_encoder, compile_artifact,
                                                                      tmp_path):
    """A sequence-classification reranker (Qwen3-Reranker converted to one) whose tokenizer has a chat template, saved
    by sentence-transformers 6: `CrossEncoder.predict` renders each pair as a query and a document message (the
    instruction as a system message), in the format the folder saved, and reads the head on the last token; the
    engine renders them the same way, batched and pair by pair, past the limit too."""
    from sentence_transformers import CrossEncoder

    folder = messages_cross_encoder
    assert "message" in json.loads((folder / "sentence_bert_config.json").read_text())["modality_config"]
    result = compile_artifact(folder, tmp_path / "artifact", target=target)
    assert result.manifest.text_messages in ("flat", "structured")
    model = CrossEncoder(str(folder), device="cpu", max_length=result.manifest.max_length)
    instruction = "find the passage about a fox"
    with Engine.load(result.path) as engine:
        for prompt in (None, instruction):
            expected = model.predict(PAIRS, prompt=prompt, activation_fn=torch.nn.Identity(), convert_to_numpy=True)
            batched = engine.score([q for q, _ in PAIRS], [d for _, d in PAIRS], activation=False, prompt=prompt)
            alone = [engine.score([q], [d], activation=False, prompt=prompt)[0] for q, d in PAIRS]
            assert np.abs(np.array(batched) - expected).max() <= 1e-3, prompt
            assert np.abs(np.array(alone) - expected).max() <= 1e-3, prompt
        assert np.abs(expected - model.predict(PAIRS, activation_fn=torch.nn.Identity())).max() > 1e-3


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


@pytest.mark.parametrize(("family", "message_format", "target"), [("qwen3", "flat", "cpu"),
                                                                   ("qwen3", "structured", "openvino"),
                                                                   ("gemma3", "flat", "openvino")])
def test_texts_as_chat_messages_match_sentence_transformers(family, message_format, target, tiny_dir,
                                                            compile_artifact, tmp_path):
    """A folder saved by sentence-transformers 6 from a tokenizer with a chat template (Qwen3-Embedding's carries one;
    an EmbeddingGemma fine-tune's too) reads texts as chat messages: `encode` renders each as a user message, a prompt
    as a system message, and pools whatever the template wrote. The engine renders them the same way, with and without
    a prompt, past the limit (the template's tail written back over the cut, where last-token pooling reads), and
    cuts nothing else: a text's start, or a text in chunks, is refused."""
    from sentence_transformers import SentenceTransformer

    folder = tm.sentence_transformers_folder(tiny_dir / "decoders" / f"{family}-messages-{message_format}",
                                             pooling="lasttoken" if family == "qwen3" else "mean", normalize=True,
                                             family=family, prompts=QWEN3_PROMPTS, chat_template=tm.CHATML_TEMPLATE,
                                             max_seq_length=40)
    settings_file = folder / "sentence_bert_config.json"
    settings = json.loads(settings_file.read_text())
    assert settings["modality_config"]["message"]["format"] in ("flat", "structured")  # as sentence-transformers saw it
    settings["modality_config"]["message"]["format"] = message_format  # each, whichever it chose
    settings_file.write_text(json.dumps(settings))
    result = compile_artifact(folder, tmp_path / "artifact", target=target)
    assert result.manifest.text_messages == message_format
    # a reader that skipped these would tokenise plain text: the manifest lists them, and one that does not know them
    # refuses the artifact (tests/runtime/test_manifest.py)
    written = json.loads((result.path / "manifest.json").read_text())
    assert {"text_messages", "chat_template"} <= set(written["requires"])
    reference = SentenceTransformer(str(folder), device="cpu")
    texts = TEXTS + [" ".join(tm.CORPUS_WORDS[:60])]
    with Engine.load(result.path) as engine:
        for prompt_name in (None, "query"):
            expected = reference.encode(texts, prompt_name=prompt_name)
            alone = np.concatenate([engine.embed([text], prompt_name=prompt_name) for text in texts])
            assert cosine_rows(np.array(engine.embed(texts, prompt_name=prompt_name)), expected).min() >= 0.99999
            assert cosine_rows(alone, expected).min() >= 0.99999
        with pytest.raises(InvalidRequest, match="truncation from the left .* is not available"):
            engine.embed(texts, truncation_side="left")
    settings["modality_config"].pop("message")  # the same weights reading plain texts embed differently
    settings_file.write_text(json.dumps(settings))
    plain = SentenceTransformer(str(folder), device="cpu").encode(texts)
    assert cosine_rows(plain, reference.encode(texts)).min() < 0.999
    with pytest.raises(ValueError, match="long_inputs 'chunk' is not available for this model"):
        Engine.load(result.path, long_inputs="chunk")


def test_an_empty_text_its_tokenizer_adds_nothing_to_is_refused_and_the_engine_goes_on(compile_artifact, tmp_path):
    """A Qwen2 tokenizer that appends no end-of-text token leaves an empty text no token at all: such a row once
    reached the batching loop, whose workers died on it, and every later request waited for ever."""
    folder = tm.sentence_transformers_folder(tmp_path / "qwen2-no-eos", pooling="lasttoken", normalize=True,
                                             family="qwen2", decoder_tokenizer={"append_eos": False})
    result = compile_artifact(folder, tmp_path / "artifact", target="cpu")
    with Engine.load(result.path) as engine:
        assert engine.tokenize("") == []
        for _ in range(2):  # one worker per core: each would have died on one
            with pytest.raises(InvalidRequest, match="input 1 has no tokens to run: an empty text"):
                engine.embed(["x", "", "y"])
        assert np.array(engine.embed(["x", "y"])).shape == (2, result.manifest.shape.output_dim)


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


RERANK_PAIRS = [("where is the amazon rainforest", "the amazon rainforest covers much of the amazon basin of south america"),
                ("café", "résumé naïve café"), ("x", "y"),
                ("the quick brown fox", " ".join(["fox jumps over the lazy dog"] * 30))]  # past the 320-token limit
INSTRUCTION = "find the passage about a fox"


@pytest.fixture(scope="module")
def rerankers(tiny_dir):
    root = tiny_dir / "causal-rerankers"
    return {"st": tm.causal_reranker_folder(root / "qwen3-reranker"),
            "bare": tm.causal_reranker_folder(root / "qwen3-reranker-bare", seed=4, saved_by_sentence_transformers=False),
            "gemma": tm.causal_reranker_folder(root / "gemma-reranker", seed=5, max_positions=160, family="gemma",
                                               chat_template=tm.BGE_GEMMA_RERANKER_TEMPLATE, scored_by_no=False,
                                               bos_token=tm.DECODER_SPECIAL[1])}


@pytest.mark.parametrize(("folder", "target"), [("st", "cpu"), ("st", "openvino"), ("bare", "cpu")])
def test_causal_lm_reranker_matches_the_cross_encoder(folder, target, rerankers, compile_artifact, tmp_path):
    """Qwen3-Reranker's kind: a causal LM scored by logit("yes") - logit("no") after its chat template, with and without
    an instruction, batched and pair by pair; a pair past the limit is cut and ends with the template's tail, as
    sentence-transformers cuts it. The bare folder (no sentence-transformers files) is scored with --task score."""
    from sentence_transformers import CrossEncoder

    result = compile_artifact(rerankers[folder], tmp_path / "artifact", target=target,
                              **({"task": "score"} if folder == "bare" else {}))
    manifest = result.manifest
    assert (manifest.task, manifest.activation, manifest.shape.output_dim) == ("score", "sigmoid", 1)
    assert manifest.chat_template is not None and _causal_attention_without_masks(result.path) == 2
    model = CrossEncoder(str(rerankers[folder]), device="cpu")
    queries, documents = [p[0] for p in RERANK_PAIRS], [p[1] for p in RERANK_PAIRS]
    with Engine.load(result.path) as engine:
        for prompt in (None, INSTRUCTION):
            expected = model.predict(RERANK_PAIRS, prompt=prompt)
            logits = model.predict(RERANK_PAIRS, prompt=prompt, activation_fn=torch.nn.Identity())
            np.testing.assert_allclose(engine.score(queries, documents, prompt=prompt), expected, atol=1e-5)
            np.testing.assert_allclose(engine.score(queries, documents, prompt=prompt, activation=False), logits, atol=1e-3)
            alone = [engine.score(query, document, prompt=prompt)[0] for query, document in RERANK_PAIRS]
            np.testing.assert_allclose(alone, expected, atol=1e-5)
            ranked = engine.rerank(queries[0], documents, prompt=prompt)
            assert [index for index, _ in ranked] == list(np.argsort(-model.predict([(queries[0], d) for d in documents],
                                                                                    prompt=prompt), kind="stable"))
        assert np.abs(expected - model.predict(RERANK_PAIRS)).max() > 1e-3  # the instruction made a difference
        assert expected.std() > 0.01
        cut = engine.tokenize(queries[-1], documents[-1])  # rendered, cut at the limit, the assistant's turn restored
        empty = model.tokenizer.apply_chat_template([{"role": "query", "content": ""}, {"role": "document", "content": ""}],
                                                    tokenize=True, return_dict=True)["input_ids"]
        with pytest.raises(InvalidRequest, match=f"the chat template alone take {len(empty)} tokens"):
            engine.score(queries[0], documents[0], truncate=len(empty))  # a length the template alone fills
    reference = model.preprocess([RERANK_PAIRS[-1]])["input_ids"][0].tolist()
    assert len(cut) == manifest.max_length == 320 and cut == reference
    assert model.tokenizer.decode(cut).endswith("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n")


@pytest.mark.parametrize("target", ["cpu", "openvino"])
def test_gemma_reranker_scored_by_one_token_matches_the_cross_encoder(target, rerankers, compile_artifact, tmp_path):
    """bge-reranker-v2-gemma's kind: Gemma's causal LM (GeGLU, its embeddings scaled by the square root of the hidden
    size) scored by the logit of "yes" alone (LogitScore without a false token), after a template that puts the
    instruction last and starts with the tokenizer's beginning-of-text token; with and without a request's
    instruction, batched and pair by pair, a pair past the limit cut as sentence-transformers cuts it."""
    from sentence_transformers import CrossEncoder

    folder = rerankers["gemma"]
    result = compile_artifact(folder, tmp_path / "artifact", target=target)
    manifest = result.manifest
    assert (manifest.model_type, manifest.task, manifest.activation, manifest.shape.output_dim) == (
        "gemma", "score", "sigmoid", 1)
    assert manifest.fused_ops.get("Gelu" if target == "openvino" else "FastGelu") == manifest.shape.num_layers
    assert _causal_attention_without_masks(result.path) == manifest.shape.num_layers
    model = CrossEncoder(str(folder), device="cpu")
    assert model[1].false_token_id is None
    queries, documents = [p[0] for p in RERANK_PAIRS], [p[1] for p in RERANK_PAIRS]
    with Engine.load(result.path) as engine:
        for prompt in (None, INSTRUCTION):
            logits = model.predict(RERANK_PAIRS, prompt=prompt, activation_fn=torch.nn.Identity())
            raw = engine.score(queries, documents, prompt=prompt, activation=False)
            np.testing.assert_allclose(raw, logits, atol=1e-3)
            np.testing.assert_allclose(engine.score(queries, documents, prompt=prompt),
                                       model.predict(RERANK_PAIRS, prompt=prompt), atol=1e-5)
            alone = [engine.score(query, document, prompt=prompt, activation=False)[0]
                     for query, document in RERANK_PAIRS]
            np.testing.assert_allclose(alone, logits, atol=1e-3)
        assert np.abs(logits - model.predict(RERANK_PAIRS, activation_fn=torch.nn.Identity())).max() > 1e-2
        assert logits.std() > 0.05
        cut = engine.tokenize(queries[-1], documents[-1])
    reference = model.preprocess([RERANK_PAIRS[-1]])["input_ids"][0].tolist()
    assert len(cut) == manifest.max_length == 160 and cut == reference
    assert cut[0] == model.tokenizer.bos_token_id != model.tokenizer.pad_token_id


def test_causal_lm_reranker_keeps_its_ranking_in_bf16(rerankers, compile_artifact, tmp_path):
    """On text the probes never held. (int8 misses compile's ranking tier on this random reranker, Spearman 0.79 on
    onnxruntime and 0.91 on OpenVINO, and is refused there.)"""
    from sentence_transformers import CrossEncoder

    from encoderrt.compile.parity import spearman

    result = compile_artifact(rerankers["st"], tmp_path / "artifact", target="openvino", precision="bf16")
    pairs = RERANK_PAIRS + [(query, text) for query in ("fox", "rainforest") for text in heldout_texts.TEXTS[:8]]
    reference = CrossEncoder(str(rerankers["st"]), device="cpu").predict(pairs, activation_fn=torch.nn.Identity())
    with Engine.load(result.path) as engine:
        logits = np.array(engine.score([p[0] for p in pairs], [p[1] for p in pairs], activation=False))
    assert spearman(logits, reference) >= 0.95 and np.abs(logits - reference).max() < 0.25, (
        spearman(logits, reference), np.abs(logits - reference).max())


def test_causal_lm_rerankers_it_cannot_score_are_named(rerankers, compile_artifact, tmp_path):
    """Without a chat template its pairs have no prompt to go in; without "yes" and "no" (and no LogitScore module
    naming others) there is nothing to score by; a LogitScore module reading other features than the LM's logits is
    not one encoderrt computes. Each refused in one line, nothing written."""
    from encoderrt.compile import InputError

    untemplated = tm.causal_reranker_folder(tmp_path / "untemplated", chat_template=None)
    with pytest.raises(InputError, match="has no chat template"):
        compile_artifact(untemplated, tmp_path / "a")
    unanswered = tm.causal_reranker_folder(tmp_path / "unanswered", saved_by_sentence_transformers=False, answers=False)
    with pytest.raises(InputError, match="has no 'yes' and 'no' tokens"):
        compile_artifact(unanswered, tmp_path / "b", task="score")
    elsewhere = shutil.copytree(rerankers["st"], tmp_path / "elsewhere")
    module = elsewhere / "1_LogitScore" / "config.json"
    module.write_text(json.dumps({**json.loads(module.read_text()), "module_input_name": "token_embeddings"}))
    with pytest.raises(InputError, match="reads token_embeddings"):
        compile_artifact(elsewhere, tmp_path / "c")
    assert not any((tmp_path / name).exists() for name in "abc")
