"""The OpenVINO backend served cold: the first batches of a fresh server start on all streams at once."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from encoderrt.bench import workloads
from encoderrt.bench.runners import served

pytest.importorskip("openvino", reason="the openvino target needs OpenVINO (a default dependency)")


def test_a_cold_server_answers_its_first_concurrent_requests(tiny_models, compile_artifact, tmp_path):
    """With a fixed token budget the engine skips calibration, so its streams' first runs start together. OpenVINO's
    Python layer initialises C++ statics on a request's first run, and two threads doing it at once hung a server in
    CI (both in __cxa_guard_acquire); the backend now warms each request up, one at a time, at load."""
    artifact = compile_artifact(tiny_models["st-cls"], tmp_path / "ov", target="openvino", precision="fp32").path
    texts = workloads.passages(64, seed=5)
    for _ in range(2):  # a fresh server each time: the race is at a process's first runs
        with served(artifact, max_batch_tokens=128) as url, ThreadPoolExecutor(8) as pool:
            bodies = [{"input": texts[i::8]} for i in range(8)]
            responses = list(pool.map(lambda b: httpx.post(f"{url}/v1/embeddings", json=b, timeout=60), bodies))
        assert [r.status_code for r in responses] == [200] * 8
        assert all(len(r.json()["data"]) == 8 for r in responses)
