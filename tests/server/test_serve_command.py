"""`encoderrt serve` as a user runs it: compile-on-first-use into the cache, readiness, SIGTERM."""

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np

from encoderrt import Engine
from encoderrt.bench import workloads
from encoderrt.runtime.manifest import read_manifest
from encoderrt.runtime.postprocess import cosine_pairs
from server_helpers import free_port


def _start(args, env):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "encoderrt.cli", "serve", *args, "--port", str(port)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return process, f"http://127.0.0.1:{port}"


def _wait_healthy(process, url, timeout=180):
    statuses = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read()
        try:
            status = httpx.get(f"{url}/health", timeout=2).status_code
        except httpx.TransportError:
            time.sleep(0.05)
            continue
        statuses.append(status)
        if status == 200:
            return statuses
        time.sleep(0.1)
    raise AssertionError("server never became healthy")


def test_bundled_model_compiles_once_then_serves_and_drains_on_sigterm(tmp_path):
    env = {**os.environ, "ENCODERRT_CACHE": str(tmp_path / "cache")}
    process, url = _start(["--max-batch-tokens", "512"], env)
    try:
        statuses = _wait_healthy(process, url)
        assert 503 in statuses  # /health answered while the model compiled
        (artifact,) = (tmp_path / "cache").iterdir()
        assert artifact.name.startswith("all-MiniLM-L6-v2-")
        texts = workloads.passages(150)
        with Engine.load(artifact, max_batch_tokens=512) as engine:
            expected = engine.embed(texts[:3])
        with ThreadPoolExecutor(4) as pool:
            inflight = [pool.submit(httpx.post, f"{url}/v1/embeddings", json={"input": texts}, timeout=120) for _ in range(4)]
            time.sleep(0.5)
            process.send_signal(signal.SIGTERM)
            responses = [f.result() for f in inflight]
        assert [r.status_code for r in responses] == [200] * 4
        exact = read_manifest(artifact).precision == "fp32"  # bf16 rounds differently in other batch shapes
        for response in responses:
            got = np.array([d["embedding"] for d in response.json()["data"][:3]])
            assert cosine_pairs(got, expected).min() >= 0.9999
            if exact:
                np.testing.assert_allclose(got, expected, atol=1e-5)
            assert response.json()["model"] == "all-MiniLM-L6-v2"
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()

    # named as a model, the bundled one is the same: it reuses the cached artifact, no compile
    again, url = _start(["all-MiniLM-L6-v2", "--max-batch-tokens", "512"], env)
    try:
        start = time.monotonic()
        _wait_healthy(again, url, timeout=60)
        assert time.monotonic() - start < 20
        assert len(list((tmp_path / "cache").iterdir())) == 1
        assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == ["all-MiniLM-L6-v2"]
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


def test_serve_refuses_a_missing_folder(tmp_path):
    result = subprocess.run([sys.executable, "-m", "encoderrt.cli", "serve", str(tmp_path / "nope")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "model folder not found" in result.stderr


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
