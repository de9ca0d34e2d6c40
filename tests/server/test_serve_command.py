"""`encoderrt serve` as a user runs it: compile-on-first-use into the cache (the bundled model's candidates measured
and the fastest exact one kept), readiness, SIGTERM."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from encoderrt import Engine
from encoderrt.bench import workloads
from encoderrt.compile.cache import content_key
from encoderrt.compile.selection import LONE_GAIN, THROUGHPUT_TIE, speed
from encoderrt.runtime.backends import openvino as openvino_backend
from encoderrt.runtime.manifest import read_manifest
from encoderrt.runtime.postprocess import cosine_pairs
from server_helpers import free_port, metric, wait_for


def _start(args, env):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "encoderrt.cli", "serve", *args, "--port", str(port)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return process, f"http://127.0.0.1:{port}"


def _wait_healthy(process, url, timeout=180, bodies=None):
    statuses = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read()
        try:
            status = httpx.get(f"{url}/health", timeout=2)
        except httpx.TransportError:
            time.sleep(0.05)
            continue
        statuses.append(status.status_code)
        if bodies is not None:
            bodies.append(status.json())
        if status.status_code == 200:
            return statuses
        time.sleep(0.1)
    raise AssertionError("server never became healthy")


def _chosen_by_measurement(manifest, log: str) -> None:
    """The bundled default (--target auto --precision auto) is the fastest candidate measured here of those that
    are exact or lossless, or one as fast that answers a lone query much sooner; each candidate's speed in the log."""
    chosen = manifest.selection["chosen"]
    assert (chosen["target"], chosen["precision"]) == (manifest.target, manifest.precision)
    assert f"note: chosen {manifest.precision} on {manifest.target}: " in log
    for candidate in manifest.selection["candidates"]:
        assert candidate["eligible"] is (candidate["precision"] == "fp32" or candidate["lossless"])
        assert f"{candidate['precision']} on {candidate['target']}: {speed(candidate)}" in log
    fastest = max((c for c in manifest.selection["candidates"] if c["eligible"]), key=lambda c: c["tokens_per_s"])
    if chosen != fastest:
        assert chosen["tokens_per_s"] >= (1 - THROUGHPUT_TIE) * fastest["tokens_per_s"]
        assert fastest["lone_query_ms"] >= LONE_GAIN * chosen["lone_query_ms"]
    if openvino_backend.native_bf16():
        assert ("openvino", "bf16") in {(c["target"], c["precision"]) for c in manifest.selection["candidates"]}
    if manifest.precision == "bf16":
        assert manifest.parity["min_cosine"] >= 0.9999


def test_bundled_model_compiles_once_then_serves_and_drains_on_sigterm(tmp_path):
    env = {**os.environ, "ENCODERRT_CACHE": str(tmp_path / "cache")}
    # 4 x 60 passages are ~6 s of work on a 2-core AVX2 CPU in fp32 (~1 s on AMX in bf16), still running at the
    # SIGTERM; past the default 5 s queue limit there would be 429s, which tests/server/test_overload.py covers,
    # and here every request must be served through the drain
    process, url = _start(["--max-batch-tokens", "512", "--max-queue-seconds", "120"], env)
    try:
        bodies = []
        statuses = _wait_healthy(process, url, bodies=bodies)
        assert 503 in statuses  # /health answered while the model compiled, naming the model's step
        steps = {b["steps"]["all-MiniLM-L6-v2"] for b in bodies if b["status"] == "loading"}
        assert {"compiling: export", "compiling: verify"} <= steps
        (artifact,) = (tmp_path / "cache").iterdir()
        assert read_manifest(artifact).source["name"] == "all-MiniLM-L6-v2"
        texts = workloads.passages(60)
        with Engine.load(artifact, max_batch_tokens=512) as engine:
            expected = engine.embed(texts[:3])

        def post():
            response = httpx.post(f"{url}/v1/embeddings", json={"input": texts}, timeout=120)
            return response, time.monotonic()

        with ThreadPoolExecutor(4) as pool:
            inflight = [pool.submit(post) for _ in range(4)]
            # a connection still in the listen backlog at the SIGTERM is reset, as by any server: signal once all
            # four requests are in the engine
            wait_for(lambda: metric(url, "encoderrt_engine_items_total", 'model="all-MiniLM-L6-v2"') >= 4 * len(texts), 60,
                     "the four requests never reached the engine")
            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            responses, finished = zip(*(f.result() for f in inflight))
        assert [r.status_code for r in responses] == [200] * 4
        assert max(finished) > signalled  # work was still running at the SIGTERM, and the drain finished it
        exact = read_manifest(artifact).precision == "fp32"  # bf16 rounds differently in other batch shapes
        for response in responses:
            got = np.array([d["embedding"] for d in response.json()["data"][:3]])
            assert cosine_pairs(got, expected).min() >= 0.9999
            if exact:
                np.testing.assert_allclose(got, expected, atol=1e-5)
            assert response.json()["model"] == "all-MiniLM-L6-v2"
        assert process.wait(60) == 0
        log = process.stdout.read()
        assert "all-MiniLM-L6-v2: ✓ export" in log and "all-MiniLM-L6-v2: ✓ verify" in log  # compile-model's steps
        _chosen_by_measurement(read_manifest(artifact), log)
    finally:
        if process.poll() is None:
            process.kill()

    # named as a model and served under another name, the bundled one is the same content: the cached artifact
    again, url = _start(["all-MiniLM-L6-v2", "--served-model-name", "minilm", "--max-batch-tokens", "512"], env)
    try:
        start = time.monotonic()
        _wait_healthy(again, url, timeout=60)
        assert time.monotonic() - start < 20
        assert list((tmp_path / "cache").iterdir()) == [artifact]
        assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == ["minilm"]
    finally:
        again.send_signal(signal.SIGTERM)
        assert again.wait(30) == 0


def test_serve_names_several_models(minilm_fp32, tiny_artifacts):
    process, url = _start([str(minilm_fp32.path), str(tiny_artifacts["bert-cross-encoder"]),
                           "--served-model-name", "embedder", "--served-model-name", "ce", "--max-batch-tokens", "512"],
                          dict(os.environ))
    try:
        _wait_healthy(process, url, timeout=60)
        assert {m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]} == {"embedder", "ce"}
        assert httpx.post(f"{url}/rerank", json={"query": "q", "documents": ["a", "b"]}).json()["model"] == "ce"
        assert httpx.post(f"{url}/v1/embeddings", json={"input": "x"}).json()["model"] == "embedder"
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    # both models loaded, what start-up built is out of the collector's scans (tests/runtime/test_heap.py)
    frozen = re.findall(r"start-up heap frozen: (\d+) objects", process.stdout.read())
    assert len(frozen) == 1 and int(frozen[0]) > 10_000


def test_ctrl_c_during_the_first_compile_is_one_line_and_leaves_nothing(tmp_path):
    cache = tmp_path / "cache"
    process, url = _start([], {**os.environ, "ENCODERRT_CACHE": str(cache)})
    try:
        deadline = time.monotonic() + 120
        while True:  # interrupt once the compile is under way
            assert time.monotonic() < deadline and process.poll() is None
            try:
                if httpx.get(f"{url}/health", timeout=2).json().get("steps", {}).get("all-MiniLM-L6-v2", "").startswith("compiling"):
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        assert process.wait(150) == 130
        output = process.stdout.read()
        assert "Traceback" not in output and "KeyboardInterrupt" not in output
        assert "model loading stopped while all-MiniLM-L6-v2 was at: compiling" in output
        assert list(cache.iterdir()) == []  # no artifact, no .partial folder
    finally:
        if process.poll() is None:
            process.kill()


def _serve_refusal(*args, timeout=60):
    """serve's exit code and stderr for arguments it must refuse before compiling or binding."""
    result = subprocess.run([sys.executable, "-m", "encoderrt.cli", "serve", *args], capture_output=True, text=True,
                            timeout=timeout)
    assert "Uvicorn running" not in result.stderr + result.stdout and "compiling" not in result.stderr
    return result.returncode, result.stderr


@pytest.mark.parametrize("extra", [(), ("--served-model-name", "named"), ("--ray", "--served-model-name", "named")])
def test_serve_refuses_a_missing_folder(tmp_path, extra):
    code, stderr = _serve_refusal(str(tmp_path / "nope"), *extra)
    assert code == 2 and "model folder not found" in stderr and "Traceback" not in stderr


def test_an_artifact_this_user_cannot_read_is_one_line(tmp_path, monkeypatch):
    """Another user's artifact (a root-owned copy in an image served by a non-root user): a ValueError naming the
    file, as serve reports every refusal, not a traceback. Faked: the tests run as root, which reads anything."""
    from encoderrt.server.loading import ModelSpec, plan_models

    (tmp_path / "manifest.json").write_text("{}")

    def refused(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(Path, "is_file", refused)
    with pytest.raises(ValueError, match=r"cannot read .*manifest.json: permission denied for this user \(uid \d+\)"):
        plan_models([ModelSpec(tmp_path)])


def test_serve_refuses_a_folder_that_is_no_model(tmp_path):
    (tmp_path / "notes").mkdir()
    code, stderr = _serve_refusal(str(tmp_path / "notes"))
    assert code == 2 and "is not a model folder (no config.json or modules.json)" in stderr


def test_serve_refuses_two_models_under_one_name_before_compiling(tiny_models, tmp_path):
    env_cache = tmp_path / "cache"
    result = subprocess.run([sys.executable, "-m", "encoderrt.cli", "serve", str(tiny_models["st-cls"]),
                             str(tiny_models["bert-cross-encoder"]), "--served-model-name", "m", "--served-model-name", "m"],
                            capture_output=True, text=True, timeout=60, env={**os.environ, "ENCODERRT_CACHE": str(env_cache)})
    assert result.returncode == 2 and "two models would be served as 'm'" in result.stderr
    assert not env_cache.exists()  # nothing compiled
    code, stderr = _serve_refusal(str(tiny_models["st-cls"]), str(tiny_models["st-cls"]))
    assert code == 2 and "two models would be served as 'st-cls'" in stderr


def test_serve_refuses_a_taken_port(minilm_fp32):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, stderr = _serve_refusal(str(minilm_fp32.path), "--port", str(port))
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in stderr


@pytest.mark.parametrize("flag, port", [("--port", "99999"), ("--port", "-1"), ("--grpc-port", "65536")])
def test_serve_refuses_a_port_number_out_of_range(minilm_fp32, flag, port):
    # 99999 was bound as 34463 (99999 mod 65536) and announced as :99999; -1 was blamed on --host
    code, stderr = _serve_refusal(str(minilm_fp32.path), flag, port)
    assert code == 2 and f"{flag} must be a port number (0 to 65535), got {port}" in stderr


def test_serve_refuses_ray_settings_without_ray(minilm_fp32):
    # they were ignored: one process served, whatever --replicas said
    code, stderr = _serve_refusal(str(minilm_fp32.path), "--replicas", "4", "--autoscale", "1:3")
    assert code == 2 and "--replicas and --autoscale apply to serving on Ray Serve (--ray)" in stderr


def test_serve_refuses_more_default_prompt_names_than_models(minilm_fp32):
    result = subprocess.run([sys.executable, "-m", "encoderrt.cli", "serve", str(minilm_fp32.path),
                             "--default-prompt-name", "query", "--default-prompt-name", "passage"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "2 --default-prompt-name values for 1 models" in result.stderr


def test_serve_refuses_a_file_as_a_model(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"not a model")
    result = subprocess.run([sys.executable, "-m", "encoderrt.cli", "serve", str(tmp_path / "model.bin")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "model path is not a folder" in result.stderr


def test_serve_compiles_a_folder_at_the_precision_asked_once_per_model(tiny_models, minilm_fp32, tmp_path):
    folder = tiny_models["st-cls"]
    env = {**os.environ, "ENCODERRT_CACHE": str(tmp_path / "cache")}
    # the first MODEL's value is the folder's; the artifact after it keeps its default (auto: served as built)
    process, url = _start([str(folder), str(minilm_fp32.path), "--compile-precision", "int8",
                           "--served-model-name", "tiny", "--served-model-name", "minilm"], env)
    try:
        _wait_healthy(process, url, timeout=120)
        texts = ["int8 on first use", "a second, longer text about what the cache holds"]
        served = httpx.post(f"{url}/v1/embeddings", json={"input": texts, "model": "tiny"}, timeout=30).json()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    (artifact,) = (tmp_path / "cache").iterdir()  # the folder alone compiled; the artifact was served as it is
    assert artifact.name == content_key(folder, "int8") and read_manifest(artifact).precision == "int8"
    with Engine.load(artifact, max_batch_tokens=512) as engine:
        expected = engine.embed(texts)
    assert cosine_pairs(np.array([d["embedding"] for d in served["data"]]), expected).min() >= 0.998  # int8's batches
    log = process.stdout.read()
    assert "serving tiny (embed, int8)" in log and "serving minilm (embed, fp32)" in log


def test_serve_refuses_a_precision_it_cannot_compile_to_or_an_artifact_was_not_built_in(minilm_fp32):
    code, stderr = _serve_refusal(str(minilm_fp32.path), "--compile-precision", "fp16")
    assert code == 2 and "--compile-precision 'fp16' is not one of auto, fastest, fp32, bf16, int8" in stderr
    # an fp32 artifact served "at bf16" would have been served in fp32 all the same
    result = subprocess.run([sys.executable, "-m", "encoderrt.cli", "serve", str(minilm_fp32.path)], timeout=60,
                            capture_output=True, text=True, env={**os.environ, "ENCODERRT_COMPILE_PRECISION": "bf16"})
    assert result.returncode == 2 and "Uvicorn running" not in result.stderr
    assert (f"--compile-precision (ENCODERRT_COMPILE_PRECISION is set) bf16 applies to model folders, which compile "
            f"on first use; {minilm_fp32.path} is an artifact built in fp32 on ") in result.stderr
    # asked as built, it passes every model check: the refusal that follows is the taken port's
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, stderr = _serve_refusal(str(minilm_fp32.path), "--compile-precision", "fp32", "--port", str(port))
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in stderr
