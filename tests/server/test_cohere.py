"""Cohere embed (v1 and v2) through the cohere SDK itself, against a real server; sentence-transformers is the reference
for the vectors, for prompts by input_type, for truncation, and for the quantised embedding types."""

import base64

import cohere
import httpx
import numpy as np
import pytest

import tiny_models as tm
from artifact_runner import cosine_rows
from encoderrt import Engine
from encoderrt.runtime.texts import calibration_texts
from encoderrt.server import ServerSettings, create_app
from server_helpers import ready_registry, running_server

TEXTS = ["how do rivers form", "Rivers form when rain water flows downhill and carves a channel.", "café 東京", "x"]
PROMPTS = {"query": "query: ", "passage": "passage: "}
LONG = "filler words go here " * 150 + "and the ending that a start-truncation keeps"


@pytest.fixture(scope="module")
def prompts_folder(tiny_dir):
    return tm.sentence_transformers_folder(tiny_dir / "st-cohere-prompts", pooling="mean", normalize=True, prompts=PROMPTS,
                                           default_prompt_name="query")


@pytest.fixture(scope="module")
def served(minilm_fp32, prompts_folder, compile_artifact, tmp_path_factory):
    prompts = compile_artifact(prompts_folder, tmp_path_factory.mktemp("cohere") / "prompts", target="cpu").path
    engines = {"minilm": Engine.load(minilm_fp32.path, max_batch_tokens=1024), "e5-like": Engine.load(prompts)}
    with running_server(create_app(ServerSettings(), ready_registry(**engines))) as url:
        yield url, engines


@pytest.fixture(scope="module")
def v1(served):
    return cohere.Client(base_url=served[0], api_key="unused")


@pytest.fixture(scope="module")
def v2(served):
    return cohere.ClientV2(base_url=served[0], api_key="unused")


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")


def test_v1_floats_match_sentence_transformers(v1, served, minilm):
    response = v1.embed(texts=TEXTS, model="minilm", input_type="search_document")
    assert response.response_type == "embeddings_floats" and response.texts == TEXTS
    np.testing.assert_allclose(np.array(response.embeddings), minilm.encode(TEXTS), atol=1e-5)
    assert response.meta.billed_units.input_tokens == served[1]["minilm"].count_tokens(TEXTS)


def test_v2_every_embedding_type(v2, served, minilm):
    from sentence_transformers.util.quantization import quantize_embeddings

    kinds = ["float", "base64", "int8", "uint8", "binary", "ubinary"]
    response = v2.embed(texts=TEXTS, model="minilm", input_type="search_query", embedding_types=kinds)
    got = response.embeddings
    floats = np.array(got.float_)
    np.testing.assert_allclose(floats, minilm.encode(TEXTS), atol=1e-5)
    decoded = np.array([np.frombuffer(base64.b64decode(s), "<f4") for s in got.base64])
    np.testing.assert_array_equal(decoded, floats.astype(np.float32))
    calibration = served[1]["minilm"].embed(calibration_texts())  # the model's own ranges, as the server calibrates
    for kind in ("int8", "uint8"):
        expected = quantize_embeddings(floats, precision=kind, calibration_embeddings=calibration)
        np.testing.assert_array_equal(np.array(getattr(got, kind)), expected)
    for kind in ("binary", "ubinary"):
        expected = quantize_embeddings(floats, precision=kind)
        assert np.array(getattr(got, kind)).shape == (len(TEXTS), 384 // 8)
        np.testing.assert_array_equal(np.array(getattr(got, kind)), expected)
    assert response.response_type == "embeddings_by_type" and response.meta.billed_units.input_tokens > 0


def test_input_type_picks_the_models_prompt(v2, v1, prompts_folder):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(prompts_folder), device="cpu")
    for input_type, prompt_name in (("search_query", "query"), ("search_document", "passage")):
        got = np.array(v2.embed(texts=TEXTS, model="e5-like", input_type=input_type, embedding_types=["float"]).embeddings.float_)
        assert cosine_rows(got, model.encode(TEXTS, prompt_name=prompt_name)).min() >= 0.99999, input_type
    plain = np.array(v1.embed(texts=TEXTS, model="e5-like").embeddings)  # no input_type: the folder's default prompt
    assert cosine_rows(plain, model.encode(TEXTS)).min() >= 0.99999
    passages = model.encode(TEXTS, prompt_name="passage")
    assert cosine_rows(plain, passages).min() < 0.9999  # and the prompts differ enough for this to tell


def test_truncation_start_end_none_and_max_tokens(v2, minilm, served):
    url = served[0]
    start = np.array(v2.embed(texts=[LONG], model="minilm", input_type="search_document", truncate="START",
                              embedding_types=["float"]).embeddings.float_)
    minilm.tokenizer.truncation_side = "left"
    try:
        keeps_end = minilm.encode([LONG])
    finally:
        minilm.tokenizer.truncation_side = "right"
    np.testing.assert_allclose(start, keeps_end, atol=1e-5)
    tei = httpx.post(f"{url}/embed", json={"model": "minilm", "inputs": [LONG], "truncate": True,
                                           "truncation_direction": "Left"}).json()
    np.testing.assert_allclose(np.array(tei), keeps_end, atol=1e-5)  # TEI's name for the same cut
    end = np.array(v2.embed(texts=[LONG], model="minilm", input_type="search_document", truncate="END",
                            embedding_types=["float"]).embeddings.float_)
    np.testing.assert_allclose(end, minilm.encode([LONG]), atol=1e-5)
    assert cosine_rows(start, end)[0] < 0.99

    short = np.array(v2.embed(texts=TEXTS[1:2], model="minilm", input_type="search_document", max_tokens=8,
                              embedding_types=["float"]).embeddings.float_)
    limit = minilm.max_seq_length
    minilm.max_seq_length = 8
    try:
        np.testing.assert_allclose(short, minilm.encode(TEXTS[1:2]), atol=1e-5)
    finally:
        minilm.max_seq_length = limit

    with pytest.raises(cohere.errors.BadRequestError, match="256"):
        v2.embed(texts=[LONG], model="minilm", input_type="search_document", truncate="NONE", embedding_types=["float"])


def test_truncate_none_refuses_past_max_tokens(v2, served, minilm):
    """NONE with max_tokens: a text longer than max_tokens is an error, not cut; one within it is embedded whole."""
    engine = served[1]["minilm"]
    text = TEXTS[1]
    length = len(minilm.tokenizer(text)["input_ids"])  # special tokens included, as max_tokens counts them
    with pytest.raises(cohere.errors.BadRequestError, match=f"{length} tokens long, above the request's limit of {length - 1}"):
        v2.embed(texts=[text], model="minilm", input_type="clustering", truncate="NONE", max_tokens=length - 1,
                 embedding_types=["float"])
    whole = v2.embed(texts=[text], model="minilm", input_type="clustering", truncate="NONE", max_tokens=length,
                     embedding_types=["float"]).embeddings.float_
    np.testing.assert_allclose(np.array(whole), engine.embed([text]), atol=1e-6)


def test_output_dimension_and_v2_inputs(v2, served):
    engine = served[1]["minilm"]
    response = v2.embed(inputs=[{"content": [{"type": "text", "text": t}]} for t in TEXTS], model="minilm",
                        input_type="clustering", output_dimension=128, embedding_types=["float"])
    np.testing.assert_allclose(np.array(response.embeddings.float_), engine.embed(TEXTS, dimensions=128), atol=1e-6)


@pytest.mark.parametrize("body, message", [
    ({"texts": ["a"], "images": ["data:image/png;base64,AAAA"]}, "images are not supported"),
    ({"texts": ["a"], "input_type": "image"}, "images are not supported"),
    ({"texts": ["a"], "input_type": "search"}, "unknown input_type 'search'"),
    ({"texts": ["a"], "embedding_types": ["float16"]}, "embedding_types must list some of"),
    ({"texts": ["a"], "embedding_types": []}, "embedding_types must list some of"),
    ({}, "give texts or inputs"),
    ({"inputs": [{"content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "only {'type': 'text'"),
    ({"texts": ["a"], "max_tokens": 0}, "max_tokens must be a positive"),
    ({"texts": ["a"], "output_dimension": 1000}, "dimensions"),
])
def test_bad_bodies_are_400s_naming_the_field(served, body, message):
    for path in ("/v1/embed", "/v2/embed"):
        response = httpx.post(f"{served[0]}{path}", json={"model": "minilm", **body})
        assert response.status_code == 400, (path, response.text)
        assert message in response.text
