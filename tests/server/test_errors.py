"""Every error case with its status code and OpenAI-style body; the server keeps serving afterwards."""

import gzip
import json
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from encoderrt import Engine
from encoderrt.server import ServerSettings, create_app
from encoderrt.server.registry import ModelRegistry
from server_helpers import ready_registry, running_server


def assert_error(response, status, *fragments):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code"} and error["code"] == status
    for fragment in fragments:
        assert fragment in error["message"], error["message"]
    return error


@pytest.mark.parametrize(
    "path, body, fragments",
    [
        ("/v1/embeddings", {"model": "minilm", "input": []}, ["input must not be empty"]),
        ("/v1/embeddings", {"model": "minilm", "input": [1.5, "x"]}, ["input"]),
        ("/v1/embeddings", {"model": "minilm"}, ["input", "Field required"]),
        ("/v1/embeddings", {"model": "minilm", "input": "x", "dimensions": 0}, ["dimensions must be an integer from 1 to 384"]),
        ("/v1/embeddings", {"model": "minilm", "input": "x", "dimensions": 10**30}, ["dimensions"]),
        ("/v1/embeddings", {"model": "minilm", "input": "x", "encoding_format": "int8"}, ["encoding_format"]),
        ("/v1/embeddings", {"model": "minilm", "input": [[101, 10**12]]}, ["token ids of input 0"]),
        ("/embed", {"inputs": "fox " * 400, "truncate": False}, ["input 0 is 402 tokens long", "limit of 256"]),
        ("/score", {"model": "reranker", "text_1": ["a", "b"], "text_2": "c"}, ["text_1 is a list of 2 texts"]),
        ("/score", {"model": "reranker", "text_1": ["a", "b"], "text_2": ["c"]}, ["text_1 has 2 texts and text_2 has 1"]),
        ("/score", {"model": "reranker", "text_1": "a", "text_2": []}, ["text_2 must not be empty"]),
        ("/rerank", {"model": "reranker", "query": "q", "documents": ["a"], "top_n": 0}, ["top_n must be a positive integer"]),
        ("/rerank", {"model": "reranker", "query": "q", "documents": []}, ["documents must not be empty"]),
        ("/v1/rerank", {"model": "reranker", "query": 5, "documents": ["a"]}, ["query"]),
        ("/v1/embeddings", {"model": "reranker", "input": "x"}, ["model 'reranker' is a score model and cannot answer embed"]),
        ("/score", {"model": "reranker", "text_1": "a", "text_2": "b", "truncate_prompt_tokens": 100000}, ["truncation length"]),
    ],
)
def test_invalid_requests_are_400(client, path, body, fragments):
    assert_error(client.post(path, json=body), 400, *fragments)


def test_unknown_model_is_404_with_the_served_names(client):
    assert_error(client.post("/v1/embeddings", json={"model": "gpt-4", "input": "x"}), 404,
                 "model 'gpt-4' is not served", "minilm", "reranker", "classifier")


def test_too_many_items_is_413(client):
    assert_error(client.post("/v1/embeddings", json={"model": "minilm", "input": ["x"] * 65}), 413,
                 "65 items", "limit of 64")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"model": "minilm", "input": "x"', "not valid JSON: unexpected end of data at line 1 column 33"),
        (b'{"model": "minilm", "input": "\xff\xfe"}', "not valid UTF-8 (byte 30)"),
        (b'{"model": "minilm", "input": "x",}', "not valid JSON: trailing comma is not allowed at line 1 column 33"),
        (b'{"model": "minilm", "input": "x", "dimensions": NaN}', "dimensions"),
        (b'{"model": "minilm", "input": "x", "dimensions": 1e999}', "dimensions"),
        (b'{"model": "minilm", "input": ' + b"[" * 50000 + b"]" * 50000 + b"}", "nested too deeply"),
        (b"[1, 2, 3]", "body"),
        (b"", "the body is empty: send a JSON object"),
        (b"   ", "the body is empty"),
    ],
)
def test_hostile_bodies_are_400_naming_the_problem(client, content, message):
    response = client.post("/v1/embeddings", content=content, headers={"content-type": "application/json"})
    error = assert_error(response, 400, message)
    assert "There was an error parsing the body" not in error["message"] and "JSON decode error" not in error["message"]
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_not_sent_as_json_is_400_naming_the_content_type(client, content_type):
    headers = {} if content_type is None else {"content-type": content_type}
    response = client.post("/embed", content=b'{"inputs": "x"}', headers=headers)
    assert_error(response, 400, f"the body must be JSON sent as Content-Type: application/json, not {content_type!r}")


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "application/vnd.api+json"])
def test_json_content_types_with_parameters_or_suffixes_are_read(client, content_type):
    response = client.post("/embed", content=b'{"inputs": "x"}', headers={"content-type": content_type})
    assert response.status_code == 200 and len(response.json()[0]) == 384


def test_compressed_bodies_are_read_and_bombs_refused(client):
    body = json.dumps({"model": "minilm", "input": ["compressed", "bodies"]}).encode()
    plain = client.post("/v1/embeddings", content=body, headers={"content-type": "application/json"}).json()
    for encoding, data in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        reply = client.post("/v1/embeddings", content=data,
                            headers={"content-type": "application/json", "content-encoding": encoding})
        assert reply.status_code == 200 and reply.json()["data"] == plain["data"]
    bomb = gzip.compress(b'{"input": "' + b"a" * 50_000_000 + b'"}')  # 50 MB from ~50 kB
    assert len(bomb) < 100_000
    assert_error(client.post("/v1/embeddings", content=bomb, headers={"content-encoding": "gzip"}), 413,
                 "decompressed request body is above the limit")
    assert_error(client.post("/v1/embeddings", content=gzip.compress(body)[:-10], headers={"content-encoding": "gzip"}),
                 400, "gzip body is truncated")
    assert_error(client.post("/v1/embeddings", content=b"not gzip", headers={"content-encoding": "gzip"}), 400,
                 "not valid gzip data")
    assert_error(client.post("/v1/embeddings", content=body, headers={"content-encoding": "br"}), 415, "'br' is not supported")


def test_body_size_limit(minilm_fp32):
    engine = Engine.load(minilm_fp32.path, max_batch_tokens=512)
    with running_server(create_app(ServerSettings(max_body_bytes=1000), ready_registry(minilm=engine))) as url:
        big = {"input": "word " * 400}
        assert_error(httpx.post(f"{url}/v1/embeddings", json=big), 413, "above the limit of 1000 bytes")

        def chunks():  # no Content-Length: the limit must hold on the stream too
            yield b'{"input": "'
            for _ in range(50):
                yield b"word " * 10
            yield b'"}'

        assert_error(httpx.post(f"{url}/v1/embeddings", content=chunks()), 413, "above the limit")
        assert httpx.post(f"{url}/v1/embeddings", json={"input": "small"}).status_code == 200


def test_api_key(minilm_fp32):
    engine = Engine.load(minilm_fp32.path, max_batch_tokens=512)
    with running_server(create_app(ServerSettings(api_key="s3cret"), ready_registry(minilm=engine))) as url:
        body = {"input": "x"}
        missing = httpx.post(f"{url}/v1/embeddings", json=body)
        assert_error(missing, 401, "API key")
        assert missing.headers["www-authenticate"] == 'Bearer realm="encoderrt"'  # RFC 6750
        twice = httpx.post(f"{url}/v1/embeddings", json=body,
                           headers=[("Authorization", "Bearer wrong"), ("Authorization", "Bearer s3cret")])
        assert_error(twice, 400, "2 Authorization headers")
        assert_error(httpx.post(f"{url}/v1/embeddings", json=body, headers={"Authorization": "Bearer wrong"}), 401)
        assert_error(httpx.post(f"{url}/v1/embeddings", json=body, headers={"Authorization": "s3cret"}), 401)
        ok = httpx.post(f"{url}/v1/embeddings", json=body, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert httpx.get(f"{url}/health").status_code == 200  # load balancers probe without a key
        assert httpx.get(f"{url}/metrics").status_code == 401


def test_full_queue_is_429_with_retry_after(controlled, tiny_artifacts):
    engine = Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=64, max_queue_items=4, max_wait_ms=0)
    backend = controlled[0]
    backend.gate.clear()
    with running_server(create_app(ServerSettings(), ready_registry(st=engine))) as url, ThreadPoolExecutor(4) as pool:
        first = pool.submit(httpx.post, f"{url}/embed", json={"inputs": "holds the backend"}, timeout=30)
        assert backend.entered.wait(10)
        queued = pool.submit(httpx.post, f"{url}/embed", json={"inputs": ["a", "b", "c", "d"]}, timeout=30)
        while engine.stats.snapshot()["queue_depth"] < 4:
            time.sleep(0.005)
        refused = httpx.post(f"{url}/embed", json={"inputs": "one too many"})
        error = assert_error(refused, 429, "queue is full")
        assert error["type"] == "rate_limit_error" and refused.headers["retry-after"] == "1"
        backend.gate.set()
        assert first.result().status_code == 200 and queued.result().status_code == 200


def test_internal_failure_is_500_and_the_server_keeps_serving(controlled, tiny_artifacts, caplog):
    engine = Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=256)
    with running_server(create_app(ServerSettings(), ready_registry(st=engine))) as url:
        controlled[0].fail_next = True
        error = assert_error(httpx.post(f"{url}/embed", json={"inputs": "x"}), 500, "inference failed", "server log")
        assert "simulated device fault" not in error["message"]  # the backend's internals stay in the log
        assert "RuntimeError: simulated device fault" in caplog.text
        assert httpx.post(f"{url}/embed", json={"inputs": "x"}).status_code == 200


def test_503_while_loading(tiny_artifacts):
    release = threading.Event()
    registry = ModelRegistry()

    def load():
        release.wait(30)
        registry.add("st", Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=256))
        registry.mark_ready()

    with running_server(create_app(ServerSettings(), registry, load=load)) as url:
        assert httpx.get(f"{url}/health").status_code == 503
        assert_error(httpx.post(f"{url}/embed", json={"inputs": "x"}), 503, "not ready")
        release.set()
        deadline = time.monotonic() + 30
        while httpx.get(f"{url}/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert httpx.post(f"{url}/embed", json={"inputs": "x"}).status_code == 200


def test_failed_load_is_reported_by_health(tmp_path):
    registry = ModelRegistry()

    def load():
        Engine.load(tmp_path / "missing")

    with running_server(create_app(ServerSettings(), registry, load=load)) as url:
        deadline = time.monotonic() + 10
        while registry.status != "failed":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        body = httpx.get(f"{url}/health").json()
        assert body["status"] == "failed" and "artifact folder not found" in body["error"]


def test_health_names_a_model_whose_backend_fails_every_batch_until_one_succeeds(controlled, tiny_artifacts):
    """/health is 503 naming the model while every batch since its last success failed, whatever the traffic since
    (a liveness probe polls a pod the balancer stopped feeding); 200 again once a batch succeeds. gRPC's
    grpc.health.v1 says NOT_SERVING over the same span."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from server_helpers import free_port

    engine = Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=256)
    settings = ServerSettings(grpc_port=free_port())
    with running_server(create_app(settings, ready_registry(st=engine)), settings) as url, \
            httpx.Client(base_url=url, timeout=30) as http, \
            grpc.insecure_channel(f"127.0.0.1:{settings.grpc_port}") as channel:
        grpc_health = health_pb2_grpc.HealthStub(channel)

        def grpc_status():
            return grpc_health.Check(health_pb2.HealthCheckRequest(), timeout=10).status

        assert http.get("/health").status_code == 200  # no traffic yet
        assert grpc_status() == health_pb2.HealthCheckResponse.SERVING
        controlled[0].fail_next = True
        assert_error(http.post("/embed", json={"inputs": "x"}), 500, "inference failed")
        for _ in range(2):
            unhealthy = http.get("/health")
            assert unhealthy.status_code == 503, unhealthy.text
            assert unhealthy.json()["status"] == "unhealthy"
            assert "every batch since the last success failed (1 of them)" in unhealthy.json()["errors"]["st"]
            assert grpc_status() == health_pb2.HealthCheckResponse.NOT_SERVING
        assert http.post("/embed", json={"inputs": "x"}).status_code == 200
        assert http.get("/health").json() == {"status": "ok", "models": ["st"]}
        assert grpc_status() == health_pb2.HealthCheckResponse.SERVING


def test_health_names_a_batching_worker_that_stopped(tiny_artifacts, monkeypatch):
    """A worker that ended (none should: each outlives its own faults) is named by /health, not hidden behind an ok
    while its share of the work waits."""
    engine = Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=256)
    with running_server(create_app(ServerSettings(), ready_registry(st=engine))) as url:
        worker = engine._scheduler._threads[0]
        monkeypatch.setattr(worker, "is_alive", lambda: False)
        body = httpx.get(f"{url}/health").json()
    assert body["status"] == "unhealthy" and f"batching worker {worker.name} stopped" in body["errors"]["st"]
