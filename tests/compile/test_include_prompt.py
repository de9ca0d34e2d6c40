"""Pooling that leaves the prompt out (sentence-transformers' `include_prompt: false`), against
`SentenceTransformer.encode`, for every pooling mode it changes, on onnxruntime and OpenVINO."""

import numpy as np
import pytest

import tiny_models as tm
from artifact_runner import cosine_rows
from encoderrt import Engine
from encoderrt.compile.errors import InputError
from encoderrt.runtime.tokenizer import POOLING_START

PROMPTS = {"query": "query: ", "instruct": "Instruct: retrieve passages that answer the question\nQuery: "}
TEXTS = ["where is the amazon rainforest", "the quick brown fox jumps over the lazy dog", "café 東京", "x"]
CASES = [("mean", "cpu"), ("mean", "openvino"), ("cls", "cpu"), ("lasttoken", "cpu"), ("weightedmean", "cpu"),
         ("max", "openvino")]


def _folder(tiny_dir, pooling):
    folder = tiny_dir / f"st-no-prompt-{pooling}"
    if (folder / "modules.json").is_file():
        return folder
    return tm.sentence_transformers_folder(folder, pooling=pooling, normalize=True,
                                           prompts=PROMPTS, default_prompt_name="query", include_prompt=False)


@pytest.fixture(scope="module", params=CASES, ids=[f"{p}-{t}" for p, t in CASES])
def case(request, tiny_dir, compile_artifact, tmp_path_factory):
    from sentence_transformers import SentenceTransformer

    pooling, target = request.param
    folder = _folder(tiny_dir, pooling)
    model = SentenceTransformer(str(folder), device="cpu")
    assert model[1].include_prompt is False
    result = compile_artifact(folder, tmp_path_factory.mktemp("no-prompt") / f"{pooling}-{target}", target=target)
    assert POOLING_START in result.manifest.inputs
    with Engine.load(result.path) as engine:
        yield engine, model


def test_prompts_are_left_out_of_pooling_as_in_encode(case):
    engine, model = case
    for name in PROMPTS:
        assert cosine_rows(engine.embed(TEXTS, prompt_name=name), model.encode(TEXTS, prompt_name=name)).min() >= 0.99999
    assert cosine_rows(engine.embed(TEXTS), model.encode(TEXTS)).min() >= 0.99999  # the default prompt
    assert cosine_rows(engine.embed(TEXTS, prompt=""), model.encode(TEXTS, prompt="")).min() >= 0.99999
    given = "Represent this sentence: "
    assert cosine_rows(engine.embed(TEXTS, prompt=given), model.encode(TEXTS, prompt=given)).min() >= 0.99999


def test_the_same_tokens_pool_differently_with_and_without_the_prompt(case):
    """'query: x' typed by the user pools every token; 'x' under the query prompt pools only 'x': the engine
    must not serve one as the other (its duplicate-row check includes where pooling starts)."""
    engine, model = case
    typed = ["query: " + text for text in TEXTS]
    with_prompt, without = engine.embed(TEXTS, prompt_name="query"), engine.embed(typed, prompt="")
    assert cosine_rows(without, model.encode(typed, prompt="")).min() >= 0.99999
    if engine.info.pooling != "lasttoken":  # the last token is the same either way
        assert cosine_rows(with_prompt, without).min() < 0.9999


def test_it_matters(case):
    """The reference with the prompt pooled is far from the engine's vectors, so the tests above can fail."""
    engine, model = case
    model[1].include_prompt = True
    try:
        pooled_prompt = model.encode(TEXTS, prompt_name="instruct")
    finally:
        model[1].include_prompt = False
    cosines = cosine_rows(engine.embed(TEXTS, prompt_name="instruct"), pooled_prompt)
    if engine.info.pooling == "lasttoken":  # the last token is never the prompt's: the same vectors
        assert cosines.min() >= 0.99999
    else:
        assert cosines.min() < 0.9999


def test_plain_folders_keep_their_inputs(tiny_dir, compile_artifact, tmp_path):
    folder = tm.sentence_transformers_folder(tiny_dir / "st-with-prompt", pooling="mean", prompts=PROMPTS)
    assert POOLING_START not in compile_artifact(folder, tmp_path / "a").manifest.inputs


def test_tensorrt_refuses_by_name(tiny_dir, compile_artifact, tmp_path):
    with pytest.raises(InputError, match="include_prompt: false"):
        compile_artifact(_folder(tiny_dir, "mean"), tmp_path / "trt", target="tensorrt")
    assert not (tmp_path / "trt").exists()


def test_chunks_leave_the_prompt_out_of_the_first_chunk_only(tiny_dir, compile_artifact, tmp_path):
    """A long input in chunks: the prompt sits in its first chunk, so only that chunk's pooling starts after it.
    Checked against the chunks embedded one by one through sentence-transformers' own modules."""
    import torch
    from sentence_transformers import SentenceTransformer

    folder = _folder(tiny_dir, "mean")
    model = SentenceTransformer(str(folder), device="cpu")
    result = compile_artifact(folder, tmp_path / "chunks")
    text = " ".join(["the amazon rainforest covers much of the basin"] * 12)
    with Engine.load(result.path, long_inputs="chunk") as engine:
        vector = engine.embed([text], prompt_name="instruct")[0]
        rows = engine._tokenizer.encode_chunks([PROMPTS["instruct"] + text])[0]
        start = engine._tokenizer.prompt_length(PROMPTS["instruct"])
    assert len(rows) >= 2
    pooled = []
    with torch.inference_mode():
        for index, row in enumerate(rows):
            features = {"input_ids": torch.tensor([row.ids]), "attention_mask": torch.ones(1, len(row.ids), dtype=torch.long),
                        "token_type_ids": torch.tensor([row.type_ids])}
            if index == 0:
                features["prompt_length"] = start
            features = model[1](model[0](features))
            pooled.append(features["sentence_embedding"][0].numpy() * len(row.ids))
    expected = np.sum(pooled, axis=0)
    assert cosine_rows(vector[None], expected[None]).min() >= 0.99999
    with Engine.load(result.path, long_inputs="chunk") as engine:  # the prompt pooled: measurably elsewhere
        assert cosine_rows(engine.embed([PROMPTS["instruct"] + text], prompt="")[0][None], expected[None]).min() < 0.99999
