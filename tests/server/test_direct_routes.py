"""The dialects' POST routes called past the router answer exactly as FastAPI's full stack does: the same status,
body and headers for good requests and for every kind of bad one, with the route's metrics label."""

import gzip
import json

import httpx
import pytest

from encoderrt import Engine
from encoderrt.server import ServerSettings, create_app
from encoderrt.server.middleware import ServerMiddleware
from server_helpers import ready_registry, running_server

VARYING = {"date", "x-request-id", "x-compute-time", "x-total-time", "x-tokenization-time", "x-queue-time",
           "x-inference-time"}

REQUESTS = [
    ("/v1/embeddings", {"json": {"model": "embedder", "input": ["a fox", "a dog"]}}),
    ("/v1/embeddings", {"json": {"model": "embedder", "input": "x", "encoding_format": "base64", "dimensions": 8}}),
    ("/embed", {"json": {"inputs": ["a fox", "a dog"], "dimensions": 8}}),
    ("/v2/embed", {"json": {"model": "embedder", "texts": ["a fox"], "input_type": "search_query",
                            "embedding_types": ["float", "int8"]}}),
    ("/rerank", {"json": {"model": "reranker", "query": "q", "documents": ["a", "b c"], "top_n": 1}}),
    ("/v1/rerank", {"json": {"model": "reranker", "query": "q", "documents": ["a", "b"]}}),
    ("/score", {"json": {"model": "reranker", "text_1": "a", "text_2": ["b", "c"]}}),
    ("/v1/embeddings", {"json": {"model": "embedder", "input": []}}),  # 400 from the route
    ("/v1/embeddings", {"json": {"model": "embedder", "input": [1.5]}}),  # 400 from validation
    ("/v1/embeddings", {"json": {"model": "gpt-4", "input": "x"}}),  # 404
    ("/v1/embeddings", {"json": {"model": "embedder", "input": ["x"] * 9}}),  # 413: over the item limit
    ("/v1/embeddings", {"json": {"model": "reranker", "input": "x"}}),  # 400: the wrong kind of model
    ("/v1/embeddings", {"content": b'{"input": [', "headers": {"content-type": "application/json"}}),
    ("/v1/embeddings", {"content": b'{"input": "x"}', "headers": {"content-type": "text/plain"}}),
    ("/v1/embeddings", {"content": b"", "headers": {"content-type": "application/json"}}),
    ("/v1/embeddings", {"content": gzip.compress(json.dumps({"model": "embedder", "input": "x"}).encode()),
                        "headers": {"content-type": "application/json", "content-encoding": "gzip"}}),
    ("/v1/embeddings", {"content": b"{}", "headers": {"content-type": "application/json", "content-encoding": "br"}}),
]


def _without_id(response):
    """The body, less what differs between two replies to one request: a reply's random id (Cohere's, vLLM's) and
    the second it was made in (vLLM's `created`)."""
    body = response.json()
    if isinstance(body, dict):
        body.pop("id", None)
        body.pop("created", None)
    return body


@pytest.fixture(scope="module")
def two_servers(tiny_artifacts):
    """The same models behind two apps: one as `encoderrt serve` runs it, one with every request down the full
    stack; the first counts the requests its direct routes took."""
    registry = ready_registry(embedder=Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=512),
                              reranker=Engine.load(tiny_artifacts["bert-cross-encoder"], max_batch_tokens=512))
    settings = ServerSettings(max_client_batch_size=8, max_body_bytes=4096)
    direct_app, full_app = create_app(settings, registry), create_app(settings, registry)
    assert isinstance(full_app.front, ServerMiddleware) and isinstance(direct_app.front, ServerMiddleware)
    full_app.front.direct = None
    direct = direct_app.front.direct
    taken = []
    run = direct.run

    async def counted(route, scope, receive, send):
        taken.append(route.path)
        await run(route, scope, receive, send)

    direct.run = counted
    with running_server(direct_app) as direct_url, running_server(full_app) as full_url:
        yield direct_url, full_url, taken
    registry.close()


@pytest.mark.parametrize("path, request_", REQUESTS)
def test_a_direct_route_answers_as_the_full_stack(two_servers, path, request_):
    direct_url, full_url, taken = two_servers
    before = len(taken)
    direct, full = (httpx.post(url + path, timeout=60, **request_) for url in (direct_url, full_url))
    assert taken[before:] == [path], "the request did not take the direct route"
    assert direct.status_code == full.status_code
    assert _without_id(direct) == _without_id(full)
    assert ({k: v for k, v in direct.headers.items() if k not in VARYING}
            == {k: v for k, v in full.headers.items() if k not in VARYING})
    assert direct.headers["x-request-id"] and ("x-total-time" in direct.headers) == ("x-total-time" in full.headers)


def test_other_requests_take_the_full_stack(two_servers):
    direct_url, _, taken = two_servers
    before = len(taken)
    assert httpx.get(direct_url + "/v1/models").status_code == 200
    assert httpx.get(direct_url + "/v1/embeddings").status_code == 405
    assert httpx.post(direct_url + "/no-such-route", json={}).status_code == 404
    too_big = httpx.post(direct_url + "/v1/embeddings", content=b"x" * 5000)  # refused before any route
    assert too_big.status_code == 413 and "above the limit of 4096 bytes" in too_big.text
    assert taken[before:] == []


def test_the_metrics_name_a_direct_route_by_its_path(two_servers):
    direct_url, _, _ = two_servers
    httpx.post(direct_url + "/v1/embeddings", json={"model": "embedder", "input": "x"})
    metrics = httpx.get(direct_url + "/metrics").text
    assert 'route="/v1/embeddings",status="200"' in metrics.replace(" ", ""), metrics


def test_every_dialect_post_route_without_parameters_is_direct(tiny_artifacts):
    app = create_app(ServerSettings(), ready_registry())
    direct = app.front.direct
    paths = {path for path, methods in app.openapi()["paths"].items() if "post" in methods and "{" not in path}
    assert {"/v1/embeddings", "/embed", "/rerank", "/v1/rerank", "/v2/rerank", "/score", "/classify",
            "/pooling", "/embed_sparse"} <= paths
    for path in paths:
        found = direct.route_for({"method": "POST", "path": path})
        assert found is not None and found.path == path, path
        assert direct.route_for({"method": "GET", "path": path}) is None
        assert direct.route_for({"method": "POST", "path": "/api" + path, "root_path": "/api"}) is found
        assert direct.route_for({"method": "POST", "path": path, "root_path": "/api"}) is None
        assert direct.route_for({"method": "POST", "path": "/apix" + path, "root_path": "/api"}) is None
