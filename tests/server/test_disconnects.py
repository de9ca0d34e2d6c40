"""A client that goes away takes its work with it: its engine rows are dropped before they run."""

import json
import socket
import threading
import time

import httpx
import pytest

from encoderrt import Engine
from encoderrt.bench import workloads
from encoderrt.server import ServerSettings, create_app
from server_helpers import metric, ready_registry, running_server, wait_for

CLIENTS = 50
TEXTS = workloads.passages(256, seed=5)


@pytest.mark.parametrize("plain_uvicorn", [False, True], ids=["encoderrt-protocol", "any-asgi-server"])
def test_disconnected_clients_work_is_dropped_within_one_batch(controlled, tiny_artifacts, plain_uvicorn):
    """Our protocol tells the app of the disconnect; under another server, a task waiting on `receive` hears it."""
    engine = Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=512, max_queue_items=CLIENTS * 256)
    backend = controlled[0]
    app = create_app(ServerSettings(), ready_registry(st=engine))
    with running_server(app, plain_uvicorn=plain_uvicorn) as url:
        backend.gate.clear()  # hold the first batch, so every request is still queued when its client leaves
        host, port = url.removeprefix("http://").split(":")
        clients = [_send_embed_request(host, int(port), workloads.passages(256, seed=100 + i)) for i in range(CLIENTS)]
        wait_for(lambda: engine.stats.snapshot()["items"] == CLIENTS * 256, 60,
                 lambda: f"the requests never all queued: {engine.stats.snapshot()}")
        for client in clients:  # every client leaves with its request queued behind the held batch
            client.close()
        wait_for(lambda: metric(url, "encoderrt_http_requests_total", 'status="499"') >= CLIENTS, 30,
                 "the server never noticed the disconnects")
        submitted = CLIENTS * 256
        backend.gate.set()
        # the engine is idle within about one batch: the held one finishes, then nothing is left to run
        wait_for(lambda: engine.stats.snapshot()["queue_depth"] == 0, 5, "cancelled rows were still queued")
        time.sleep(0.2)
        stats = engine.stats.snapshot()
        assert len(backend.batches) <= 2, backend.batches
        assert stats["cancelled_items"] == submitted - stats["batch_rows"]  # distinct texts: one row per item
        assert stats["batch_rows"] <= 2 * 512 // 8
        assert metric(url, "encoderrt_cancelled_items_total", 'model="st"') == stats["cancelled_items"]
        # and the server still answers the clients that stay
        assert httpx.post(f"{url}/embed", json={"inputs": TEXTS[:4], "truncate": True}, timeout=30).status_code == 200
    engine.close()


@pytest.mark.parametrize("path", ["/embed", "/v1/embeddings"])
def test_a_client_gone_before_its_body_is_in_counts_as_499_not_as_our_error(tiny_artifacts, path, caplog):
    """It was logged as an unexpected error with its traceback and counted as a 500: a spurious fault in every
    dashboard that alerts on 5xx."""
    engine = Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=512)
    app = create_app(ServerSettings(), ready_registry(st=engine))
    with running_server(app) as url:
        host, port = url.removeprefix("http://").split(":")
        client = socket.create_connection((host, int(port)))
        client.sendall(f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                       'content-length: 100\r\n\r\n{"inputs": '.encode())
        time.sleep(0.2)  # the route is reading the body when the client goes
        client.close()
        wait_for(lambda: metric(url, "encoderrt_http_requests_total", f'route="{path}",status="499"') == 1, 10,
                 "the disconnect was never counted as 499")
        assert metric(url, "encoderrt_http_requests_total", 'status="500"') == 0
        assert not [r for r in caplog.records if r.levelname == "ERROR"]
        assert httpx.post(f"{url}/embed", json={"inputs": TEXTS[:2]}, timeout=30).status_code == 200
    engine.close()


def _send_embed_request(host, port, texts):
    """A raw HTTP request whose client can then go away without reading the answer."""
    body = json.dumps({"inputs": texts, "truncate": True}).encode()
    client = socket.create_connection((host, port))
    client.sendall(f"POST /embed HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                   f"content-length: {len(body)}\r\n\r\n".encode() + body)
    return client


def test_a_request_cut_off_by_the_shutdown_timeout_gets_a_503(controlled, tiny_artifacts):
    import uvicorn

    from server_helpers import free_port

    engine = Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=512)
    app = create_app(ServerSettings(shutdown_timeout=1.0), ready_registry(st=engine))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=1.0))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 30, "server did not start")
    controlled[0].gate.clear()  # the request never finishes on its own
    answer = {}
    client = threading.Thread(target=lambda: answer.update(response=httpx.post(
        f"http://127.0.0.1:{port}/embed", json={"inputs": ["held"]}, timeout=30)))
    client.start()
    wait_for(lambda: controlled[0].entered.is_set(), 30, "the request never reached the backend")
    server.should_exit = True
    client.join(30)
    thread.join(30)
    controlled[0].gate.set()
    engine.close()
    response = answer["response"]
    assert response.status_code == 503 and response.headers["x-request-id"]
    assert "the server is shutting down" in response.json()["error"]["message"]
    assert app.state.metrics.cut_off_requests == 1
