"""jina-embeddings-v3's task adapters: a tiny jina-v3 folder with a PEFT LoRA folder per task (ranks 4 and 2, on
the projections and the word embeddings) compiles into one graph; each request's prompt_name picks its task's
prompt and adapter, and the engine matches sentence-transformers with PEFT's adapter of that task active, at
every precision, in padded batches (tasks mixed) and row by row. A LoRA variant the graph would compute
differently is refused in one line."""

import asyncio
import json
import shutil

import numpy as np
import pytest

import tiny_models as tm
from artifact_runner import cosine_rows
from encoderrt import Engine
from encoderrt.compile import CompileOptions, compile_model
from encoderrt.compile.errors import InputError
from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.manifest import read_manifest

TEXTS = ["how do rivers form", "the quick brown fox jumps over a lazy dog", "größe café 東京 привет", "x",
         " ".join(tm.CORPUS_WORDS[:60])]  # the last is cut at the folder's 48 tokens
TASKS = (None, *tm.JINA_TASKS)


@pytest.fixture(scope="module")
def source(jina_v3):
    return jina_v3


@pytest.fixture(scope="module")
def expected(source):
    """sentence-transformers' vectors per task (None: no adapter, no prompt), PEFT's adapter of the task active."""
    model, use = tm.peft_sentence_transformer(source)
    vectors = {}
    for task in TASKS:
        use(task)
        vectors[task] = model.encode(TEXTS, prompt_name=task) if task else model.encode(TEXTS, prompt="")
    for task in tm.JINA_TASKS:  # each adapter moves the vectors
        assert cosine_rows(vectors[task], vectors[None]).max() < 0.999
    return vectors


@pytest.mark.parametrize(("target", "precision", "floor"), [
    ("cpu", "fp32", 0.99999), ("openvino", "fp32", 0.99999), ("openvino", "bf16", 0.999),
    ("cpu", "int8", 0.98), ("openvino", "int8", 0.98),
])
def test_each_task_matches_sentence_transformers_with_its_peft_adapter(target, precision, floor, source, expected,
                                                                       compile_artifact, tmp_path):
    result = compile_artifact(source, tmp_path / "jina", target=target, precision=precision)
    manifest = read_manifest(result.path)
    assert manifest.model_type == "jina_embeddings_v3" and set(manifest.adapters) == set(tm.JINA_TASKS)
    assert "adapter" in manifest.inputs and "token_type_ids" not in manifest.inputs
    with Engine.load(result.path) as engine:
        for task in TASKS:
            prompt = {"prompt_name": task} if task else {"prompt": ""}
            batched = engine.embed(TEXTS, **prompt)
            alone = np.concatenate([engine.embed([text], **prompt) for text in TEXTS])
            assert cosine_rows(batched, expected[task]).min() >= floor, task
            assert cosine_rows(alone, expected[task]).min() >= floor, task

        async def every_task_at_once():  # rows of every task in the scheduler's batches together
            return await asyncio.gather(*(engine.aembed(TEXTS, prompt_name=task) for task in tm.JINA_TASKS))

        for task, vectors in zip(tm.JINA_TASKS, asyncio.run(every_task_at_once())):
            assert cosine_rows(vectors, expected[task]).min() >= floor, task


def test_the_default_task_and_unknown_tasks(source, expected, compile_artifact, tmp_path):
    """No prompt_name: the folder's default (here none, so no adapter), or the one the server is told; an unknown
    task is refused, naming the model's."""
    path = compile_artifact(source, tmp_path / "jina").path
    with Engine.load(path) as engine:
        assert cosine_rows(engine.embed(TEXTS), expected[None]).min() >= 0.99999
        with pytest.raises(InvalidRequest, match="unknown prompt_name 'retrieval'; this model's tasks are: classification, "
                                                 "document, query, retrieval.passage, retrieval.query, separation, "
                                                 "text-matching$"):
            engine.embed(TEXTS, prompt_name="retrieval")
    with Engine.load(path, default_prompt_name="retrieval.passage") as engine:
        assert cosine_rows(engine.embed(TEXTS), expected["retrieval.passage"]).min() >= 0.99999


def _altered(source, tmp_path, change) -> object:
    folder = tmp_path / "altered"
    shutil.copytree(source, folder)
    change(folder)
    return folder


def test_a_lora_variant_the_graph_would_compute_differently_is_refused(source, tmp_path):
    def dora(folder):
        path = folder / "separation" / "adapter_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "use_dora": True}))

    folder = _altered(source, tmp_path, dora)
    with pytest.raises(InputError, match=r"separation/adapter_config.json: use_dora is set; encoderrt compiles plain "
                                         "LoRA task adapters"):
        compile_model(CompileOptions(model_dir=folder, output_dir=tmp_path / "out", quiet=True))
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_adapter_weights_for_a_module_the_model_lacks_are_refused(source, tmp_path):
    from safetensors.torch import load_file, save_file

    def misnamed(folder):
        path = folder / "classification" / "adapter_model.safetensors"
        weights = load_file(path)
        save_file({key.replace("layers.0.mlp.fc1", "layers.0.mlp.fc9"): value for key, value in weights.items()}, path)

    folder = _altered(source, tmp_path, misnamed)
    with pytest.raises(InputError, match="the task adapters' weights name 'layers.0.mlp.fc9', which is no module of "
                                         "the model"):
        compile_model(CompileOptions(model_dir=folder, output_dir=tmp_path / "out", quiet=True))


def test_the_remote_code_checkpoint_is_refused_rather_than_loaded_as_xlm_roberta(tiny_models, tmp_path):
    """jina-v3's hub folder says xlm-roberta with rotary positions: transformers would load it as XLM-R, its
    rotary and LoRA weights missing, and serve other vectors."""
    folder = tmp_path / "remote-code"
    shutil.copytree(tiny_models["xlm-roberta-encoder"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "position_embedding_type": "rotary",
                                                    "lora_adaptations": list(tm.JINA_TASKS)}))
    with pytest.raises(InputError, match="rotary positions \\(jina-embeddings-v3's remote-code checkpoint\\); encoderrt "
                                         "compiles it as transformers' jina_embeddings_v3"):
        compile_model(CompileOptions(model_dir=folder, output_dir=tmp_path / "out", quiet=True))
