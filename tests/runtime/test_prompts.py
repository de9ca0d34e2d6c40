"""Prompts as SentenceTransformer.encode applies them: the folder's default, a named one, an explicit one, none;
in the engine and over TEI's and OpenAI's embedding routes."""

import httpx
import numpy as np
import pytest

import tiny_models as tm
from artifact_runner import cosine_rows
from encoderrt import Engine
from encoderrt.runtime.errors import InvalidRequest
from encoderrt.server import ServerSettings, create_app
from server_helpers import ready_registry, running_server

PROMPTS = {"query": "query: ", "passage": "passage: ", "nearest": "Represent this sentence for searching relevant passages: "}
TEXTS = ["where is the amazon rainforest", "the quick brown fox", "café 東京", "x"]


@pytest.fixture(scope="module")
def folder(tiny_dir):
    return tm.sentence_transformers_folder(tiny_dir / "st-prompts", pooling="mean", normalize=True, prompts=PROMPTS,
                                           default_prompt_name="query")


@pytest.fixture(scope="module")
def model(folder):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu")


@pytest.fixture(scope="module", params=["cpu", "openvino"])
def artifact(request, folder, model, compile_artifact, tmp_path_factory):
    result = compile_artifact(folder, tmp_path_factory.mktemp("prompts") / request.param, target=request.param)
    assert result.manifest.prompts == model.prompts and result.manifest.default_prompt_name == "query"
    assert PROMPTS.items() <= model.prompts.items()  # sentence-transformers adds its own (an empty "document")
    return result.path


@pytest.fixture(scope="module")
def engine(artifact):
    with Engine.load(artifact) as engine:
        yield engine


def test_default_prompt_applies_as_in_encode(engine, model):
    assert cosine_rows(engine.embed(TEXTS), model.encode(TEXTS)).min() >= 0.99999
    # and it matters: without it the vectors are far from what encode returns
    assert cosine_rows(engine.embed(TEXTS, prompt=""), model.encode(TEXTS)).min() < 0.999


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_named_prompts(engine, model, name):
    assert cosine_rows(engine.embed(TEXTS, prompt_name=name), model.encode(TEXTS, prompt_name=name)).min() >= 0.99999


def test_explicit_and_empty_prompts(engine, model):
    assert cosine_rows(engine.embed(TEXTS, prompt=""), model.encode(TEXTS, prompt="")).min() >= 0.99999
    given = "search_document: "
    assert cosine_rows(engine.embed(TEXTS, prompt=given, prompt_name="passage"),
                       model.encode(TEXTS, prompt=given)).min() >= 0.99999


def test_unknown_prompt_name_lists_the_known_ones(engine):
    with pytest.raises(InvalidRequest, match="unknown prompt_name 'passages'.*document, nearest, passage, query"):
        engine.embed(TEXTS, prompt_name="passages")


def test_prompt_name_over_http(engine, model):
    registry = ready_registry(prompted=engine)
    with running_server(create_app(ServerSettings(), registry)) as url, httpx.Client(base_url=url, timeout=60) as http:
        tei = http.post("/embed", json={"inputs": TEXTS, "prompt_name": "passage"})
        openai = http.post("/v1/embeddings", json={"input": TEXTS, "model": "prompted", "prompt_name": "passage"})
        default = http.post("/v1/embeddings", json={"input": TEXTS, "model": "prompted"})
        unknown = http.post("/embed", json={"inputs": TEXTS, "prompt_name": "nope"})
    reference = model.encode(TEXTS, prompt_name="passage")
    assert cosine_rows(np.array(tei.json()), reference).min() >= 0.99999
    assert cosine_rows(np.array([d["embedding"] for d in openai.json()["data"]]), reference).min() >= 0.99999
    assert cosine_rows(np.array([d["embedding"] for d in default.json()["data"]]), model.encode(TEXTS)).min() >= 0.99999
    assert unknown.status_code == 400 and "unknown prompt_name 'nope'" in unknown.text


def test_served_default_prompt_overrides_the_folder(artifact, model):
    """TEI's --default-prompt-name: another of the model's prompts, or "" for none; an unknown one fails at load."""
    with Engine.load(artifact, default_prompt_name="passage") as engine:
        assert cosine_rows(engine.embed(TEXTS), model.encode(TEXTS, prompt_name="passage")).min() >= 0.99999
    with Engine.load(artifact, default_prompt_name="") as engine:
        assert cosine_rows(engine.embed(TEXTS), model.encode(TEXTS, prompt="")).min() >= 0.99999
    with pytest.raises(ValueError, match="'passages' is not one of this model's prompts: document, nearest"):
        Engine.load(artifact, default_prompt_name="passages")
