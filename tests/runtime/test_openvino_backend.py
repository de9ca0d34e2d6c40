"""The OpenVINO backend served cold: the first batches of a fresh server start on all streams at once."""

import shutil
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from encoderrt.bench import workloads
from encoderrt.bench.runners import served

pytest.importorskip("openvino", reason="the openvino target needs OpenVINO (a default dependency)")
pytestmark = pytest.mark.every_core  # streams, and lone batches on every core


def test_a_cold_server_answers_its_first_concurrent_requests(tiny_models, compile_artifact, tmp_path):
    """With a fixed token budget the engine skips calibration, so its streams' first runs start together. OpenVINO's
    Python layer initialises C++ statics on a request's first run, and two threads doing it at once hung a server in
    CI (both in __cxa_guard_acquire); the backend now warms each request up, one at a time, at load."""
    artifact = compile_artifact(tiny_models["st-cls"], tmp_path / "ov", target="openvino", precision="fp32").path
    texts = workloads.passages(64, seed=5)
    for _ in range(2):  # a fresh server each time: the race is at a process's first runs
        with served(artifact, max_batch_tokens=128) as server, ThreadPoolExecutor(8) as pool:
            bodies = [{"input": texts[i::8]} for i in range(8)]
            responses = list(pool.map(lambda b: httpx.post(f"{server.url}/v1/embeddings", json=b, timeout=60), bodies))
        assert [r.status_code for r in responses] == [200] * 8
        assert all(len(r.json()["data"]) == 8 for r in responses)


def test_a_lone_batch_runs_on_every_thread_and_gives_the_streams_answer(tiny_models, compile_artifact, tmp_path):
    """With more than one stream the backend runs lone batches on one stream over all threads, for a batch that is
    the only work. It must give what the streams give (fp32: the same numbers up to summation order). In a fresh
    process: OpenVINO counts the cores it may use once per process, and this worker's were its share (conftest.py)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    artifact = compile_artifact(tiny_models["st-cls"], tmp_path / "ov", target="openvino", precision="fp32").path
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as process:
        process.submit(_lone_and_split_runs, artifact).result()


def _lone_and_split_runs(artifact):
    import numpy as np

    from encoderrt.runtime.backends import BackendOptions, Batch, first_output, load_backend
    from encoderrt.runtime.manifest import read_manifest
    from encoderrt.runtime.tokenizer import TOKENIZER_FILE, TextTokenizer

    manifest = read_manifest(artifact)
    tokenizer = TextTokenizer(artifact / TOKENIZER_FILE, manifest.max_length, manifest.pad_token_id, manifest.inputs)
    rows = tokenizer.encode(workloads.passages(5, seed=9))
    split = load_backend(manifest, artifact, BackendOptions(2))
    assert split.parallel_runs == 2 and "a lone batch on all 2" in split.execution and split.capabilities.runs_alone
    np.testing.assert_allclose(first_output(split, Batch(rows, tokenizer.pad, alone=True)),
                               first_output(split, Batch(rows, tokenizer.pad)), atol=1e-5)
    single = load_backend(manifest, artifact, BackendOptions(1))  # one thread, one stream: nothing to gain
    assert single.parallel_runs == 1 and not single.capabilities.runs_alone
    streams_only = load_backend(manifest, artifact, BackendOptions(2, lone_runs=False))  # compile's: no lone copy
    assert streams_only.parallel_runs == 2 and not streams_only.capabilities.runs_alone
    assert "a lone batch" not in streams_only.execution


_IMPORT_AND_COUNT_EVENTS = """
import json, os, sys
import openvino_telemetry.utils.sender as sender
sent = []
sender.TelemetrySender.send = lambda self, backend, message: sent.append(message)  # what would leave the machine
if sys.argv[1] == "encoderrt":
    from encoderrt.runtime.backends.openvino import import_openvino
    import_openvino()
else:
    import openvino
import openvino_telemetry
print(json.dumps({"events": len(sent), "client_id_written": os.path.exists(os.path.expanduser("~/intel")),
                  "telemetry_importable": sys.modules["openvino_telemetry"] is openvino_telemetry}))
"""


@pytest.mark.parametrize("importer", ["openvino", "encoderrt"])
def test_importing_openvino_sends_no_usage_event(importer, tmp_path):
    """`import openvino` sends a usage event (and writes a client id under ~/intel) unless the user opted out or the
    process runs in CI; encoderrt's import of it sends nothing and leaves openvino_telemetry importable. Plain
    `import openvino` in the same setting is the check that the setting would send."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("openvino_telemetry", reason="OpenVINO's telemetry package is not installed")
    environment = {k: v for k, v in os.environ.items() if k not in ("CI", "TF_BUILD", "JENKINS_URL")}
    result = subprocess.run([sys.executable, "-c", _IMPORT_AND_COUNT_EVENTS, importer], capture_output=True, text=True,
                            env={**environment, "HOME": str(tmp_path)}, timeout=120, check=True)
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["telemetry_importable"]
    if importer == "openvino":
        assert seen["events"] == 1 and seen["client_id_written"]
    else:
        assert seen == {"events": 0, "client_id_written": False, "telemetry_importable": True}


@pytest.mark.parametrize("family", ["eurobert", "gemma3"])  # SwiGLU (Swish gate), GeGLU (GELU gate)
def test_gated_ffns_run_in_bf16_on_single_thread_streams(family, tiny_dir, compile_artifact, tmp_path):
    """On AMX in bf16, OpenVINO's CPU plugin fused a gated FFN into an `LLMMLP` node that divides its work by half a
    stream's threads: a stream of one thread (two streams on two cores, or one core) killed the process with SIGFPE as
    the model compiled. The backend keeps the FFNs unfused, for an IR as compile writes it and for one written
    before compile did it (its down projections with transpose_b, as exported), on one thread and on two streams,
    and gives what fp32 gives. In a fresh process, so that OpenVINO sees every core and a crash is a failure here.
    On a CPU without AMX the plugin never fuses, and this checks the values only."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    import tiny_models as tm

    source = tm.sentence_transformers_folder(tiny_dir / f"gated-{family}", pooling="mean", family=family)
    artifact = compile_artifact(source, tmp_path / "ov", target="openvino", precision="fp32").path
    exported = tmp_path / "as-exported"
    shutil.copytree(artifact, exported)
    assert _restore_transposed_down_projections(exported / "model.xml") > 0
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as process:
        for folder in (artifact, exported):
            process.submit(_bf16_matches_fp32_on_single_thread_streams, folder).result(timeout=300)


def _restore_transposed_down_projections(path) -> int:
    """The IR at `path` as export wrote it before the backend's rewrite: each gated FFN's down projection with its
    weight stored as the PyTorch Linear's ([out, in], transpose_b)."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    from encoderrt.runtime.backends.openvino import gated_product

    model = ov.Core().read_model(str(path))
    restored = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "MatMul" or node.get_attributes()["transpose_b"]:
            continue
        weight = node.input_value(1).get_node()
        if gated_product(node.input_value(0).get_node()) and weight.get_type_name() == "Constant":
            down = ops.matmul(node.input_value(0), ops.constant(np.ascontiguousarray(weight.get_data().T)), False, True)
            node.output(0).replace(down.output(0))
            restored += 1
    ov.save_model(model, str(path.with_name("restored.xml")), compress_to_fp16=False)
    for suffix in (".xml", ".bin"):
        path.with_name("restored" + suffix).replace(path.with_suffix(suffix))
    return restored


def _bf16_matches_fp32_on_single_thread_streams(artifact):
    import dataclasses

    import numpy as np

    from encoderrt.runtime.backends import BackendOptions, Batch, first_output, load_backend
    from encoderrt.runtime.manifest import read_manifest
    from encoderrt.runtime.tokenizer import TOKENIZER_FILE, TextTokenizer

    manifest = read_manifest(artifact, verify_files=False)  # the restored IR is not the one its manifest hashed
    tokenizer = TextTokenizer(artifact / TOKENIZER_FILE, manifest.max_length, manifest.pad_token_id, manifest.inputs)
    batch = Batch(tokenizer.encode(workloads.passages(6, seed=4)), tokenizer.pad)
    expected = first_output(load_backend(manifest, artifact, BackendOptions(1)), batch)
    bf16 = dataclasses.replace(manifest, precision="bf16")
    for threads in (1, 2):  # one stream of one thread; two streams of one thread each on two cores
        got = first_output(load_backend(bf16, artifact, BackendOptions(threads)), batch)
        cosine = (got * expected).sum(-1) / np.linalg.norm(got, axis=-1) / np.linalg.norm(expected, axis=-1)
        assert cosine.min() > 0.99, (threads, cosine)


def test_feeds_are_padded_to_a_multiple_of_16_tokens_and_answer_as_sentence_transformers(tiny_models, compile_artifact,
                                                                                        tmp_path):
    """OpenVINO prepares its nodes again for every input shape it has not just run; the backend pads a batch's feeds
    to a multiple of 16 tokens (WIDTH_BUCKET) with the padding's own ids and mask, so nearby lengths share a shape
    and the answers are those of the batch."""
    from sentence_transformers import SentenceTransformer

    from encoderrt.runtime.backends import BackendOptions, Batch, first_output, load_backend
    from encoderrt.runtime.manifest import read_manifest
    from encoderrt.runtime.tokenizer import TextTokenizer

    artifact = compile_artifact(tiny_models["st-cls"], tmp_path / "ov", target="openvino", precision="fp32").path
    manifest = read_manifest(artifact)
    tokenizer = TextTokenizer.for_artifact(manifest, artifact)
    texts = ["a short one", "rivers form when it rains", "x"]
    rows = tokenizer.encode(texts)
    width = max(len(row.ids) for row in rows)
    assert width % 16
    backend = load_backend(manifest, artifact, BackendOptions(1))
    fed = []
    infer = backend._infer
    backend._infer = lambda feeds, outputs, requests: fed.append(feeds) or infer(feeds, outputs, requests)
    vectors = first_output(backend, Batch(rows, tokenizer.pad))
    ids, mask = fed[0]["input_ids"], fed[0]["attention_mask"]
    assert ids.shape == mask.shape == (3, -(-width // 16) * 16)
    assert backend.capabilities.width_multiple == 16  # what the scheduler counts rows at
    assert (ids[:, width:] == manifest.pad_token_id).all() and not mask[:, width:].any()
    reference = SentenceTransformer(str(tiny_models["st-cls"]), device="cpu").encode(texts)
    cosine = (vectors * reference).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.99999


def test_the_engine_cuts_batches_at_the_width_openvino_runs_them(tiny_models, compile_artifact, tmp_path, monkeypatch):
    """Rows of 17-30 tokens run 32 wide: a 256-token budget holds 8 of them, every batch fed to OpenVINO stays
    within the budget, and the full batches share one shape (OpenVINO prepares its nodes on every change of shape).
    Counted at their own lengths, 15 rows of 17 tokens would be fed as 15 x 32."""
    from sentence_transformers import SentenceTransformer

    from encoderrt import Engine
    from encoderrt.runtime.backends.openvino import OpenVinoBackend

    artifact = compile_artifact(tiny_models["st-cls"], tmp_path / "ov", target="openvino", precision="fp32").path
    texts = [" ".join("a" * words) for words in range(15, 29)] * 3  # [CLS] + words + [SEP]: 17-30 tokens
    shapes = []
    infer = OpenVinoBackend._infer
    monkeypatch.setattr(OpenVinoBackend, "_infer", lambda self, feeds, outputs, requests: shapes.append(
        feeds["input_ids"].shape) or infer(self, feeds, outputs, requests))
    with Engine.load(artifact, max_batch_tokens=256, deep_batch_tokens=0, lone_runs=False) as engine:
        shapes.clear()  # the load's own runs
        vectors = engine.embed(texts)
    assert sum(rows for rows, _ in shapes) == len(set(texts))  # identical texts run once
    assert all(rows * width <= 256 for rows, width in shapes), shapes
    assert sorted(shapes)[-1] == (8, 32) and sorted(shapes).count((8, 32)) == len(shapes) - 1, shapes
    reference = SentenceTransformer(str(tiny_models["st-cls"]), device="cpu").encode(texts)
    cosine = (vectors * reference).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.99999
