"""What one client may hold of the server: head size, read time, connections, idle keep-alive (over raw sockets,
as a hostile client sends them)."""

import json
import socket
import time

import httpx
import pytest

from encoderrt import Engine
from encoderrt.server import ServerSettings, create_app
from encoderrt.server.connections import BODY_IN
from encoderrt.server.settings import ConnectionLimits
from server_helpers import ready_registry, running_server

LIMITS = ConnectionLimits(max_header_bytes=4096, max_connections=4, request_read_timeout=1.0, keep_alive_timeout=0.5)


@pytest.fixture(scope="module")
def limited(tiny_artifacts):
    engine = Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=512)
    settings = ServerSettings(connections=LIMITS)
    with running_server(create_app(settings, ready_registry(st=engine)), settings) as url:
        host, port = url.removeprefix("http://").split(":")
        yield url, (host, int(port))
    engine.close()


def _connect(address):
    sock = socket.create_connection(address, timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_all(sock) -> bytes:
    """Everything the server sends until it closes the connection (a timeout fails the test: it kept it open)."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body)


def _post(body: bytes, path: str = "/embed") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
            .encode() + body)


def test_a_head_above_the_limit_is_a_431_and_the_connection_closes(limited):
    _, address = limited
    for _ in range(5):  # the answer arrives whole although the client is still sending (a lingering close)
        with _connect(address) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-padding: " + b"a" * 1024 * 1024)  # never finished
            status, headers, body = _parse(_read_all(sock))
        assert status == 431 and headers["connection"] == "close"
    assert "4096 bytes" in body["error"]["message"] and "--max-header-bytes" in body["error"]["message"]
    # a head just under the limit is served
    under = httpx.get(f"{limited[0]}/health", headers={"x-padding": "a" * 3000})
    assert under.status_code == 200


def test_a_trickled_head_is_a_408_after_the_read_timeout(limited):
    _, address = limited
    with _connect(address) as sock:
        start = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        for _ in range(4):  # a byte every 0.2 s restarts uvicorn's own keep-alive timer; not this one
            time.sleep(0.2)
            sock.sendall(b"x")
        status, headers, body = _parse(_read_all(sock))
        elapsed = time.monotonic() - start
    assert status == 408 and "--request-read-timeout" in body["error"]["message"]
    assert 0.9 < elapsed < 3, elapsed


def test_a_connection_that_sends_nothing_is_closed_after_the_read_timeout(limited):
    _, address = limited
    with _connect(address) as sock:
        start = time.monotonic()
        status, _, _ = _parse(_read_all(sock))
        assert status == 408 and 0.9 < time.monotonic() - start < 3


def test_a_trickled_body_is_a_408_with_the_request_id(limited):
    _, address = limited
    with _connect(address) as sock:
        request = _post(b'{"inputs": ["' + b"a" * 100 + b'"]}')
        sock.sendall(request[:-20])  # the head and most of the body; the rest never comes
        status, headers, body = _parse(_read_all(sock))
    assert status == 408 and "request body" in body["error"]["message"] and headers.get("x-request-id")


def test_requests_above_the_connection_limit_get_503_then_are_served_again(limited):
    url, address = limited
    held = [_connect(address) for _ in range(LIMITS.max_connections)]
    try:
        time.sleep(0.1)
        with _connect(address) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            status, headers, body = _parse(_read_all(extra))
        assert status == 503 and headers["retry-after"] == "1" and "4 connections" in body["error"]["message"]
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    assert httpx.post(f"{url}/embed", json={"inputs": ["back to normal"]}).status_code == 200


def test_an_idle_keep_alive_connection_closes_after_its_timeout(limited):
    _, address = limited
    with _connect(address) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        first = sock.recv(65536)
        answered = time.monotonic()
        assert first.startswith(b"HTTP/1.1 200")
        assert b"HTTP/1.1" not in _read_all(sock)  # closed, with nothing more said (a split first reply aside)
        assert 0.4 < time.monotonic() - answered < 2


def test_malformed_http_is_a_400_in_the_api_error_shape(limited):
    _, address = limited
    with _connect(address) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        status, headers, body = _parse(_read_all(sock))
    assert status == 400 and body["error"]["message"].startswith("malformed HTTP request")


def _refused(url: str, status: int) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f'encoderrt_http_refused_total{{status="{status}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_refusals_below_the_app_are_counted_in_metrics(limited):
    url, address = limited
    before = {status: _refused(url, status) for status in (400, 431)}
    with _connect(address) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-padding: " + b"a" * 64 * 1024)
        assert _parse(_read_all(sock))[0] == 431
    with _connect(address) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        assert _parse(_read_all(sock))[0] == 400
    assert {status: _refused(url, status) - before[status] for status in before} == {400: 1, 431: 1}


def test_the_protocol_says_when_a_body_has_all_arrived_request_by_request():
    """The middleware reads a body untimed only once the protocol says it is all in (BODY_IN): a request sent whole
    has it from the start; one whose body trickles in has it only once the last byte came, and a keep-alive
    connection's next request starts without the last one's."""
    seen = []

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        at_start = bool(scope.get(BODY_IN))
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        seen.append((at_start, bool(scope.get(BODY_IN)), body))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    with running_server(app, ServerSettings(connections=LIMITS)) as url:
        host, port = url.removeprefix("http://").split(":")
        with _connect((host, int(port))) as sock:
            whole, trickled = _post(b'{"a": 1}', "/x"), _post(b'{"b": ' + b"2" * 50 + b"}", "/y")
            sock.sendall(whole)
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            sock.sendall(trickled[:-10])  # the head and part of the body: the app starts before the rest
            time.sleep(0.3)
            sock.sendall(trickled[-10:])
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    assert seen == [(True, True, b'{"a": 1}'), (False, True, b'{"b": ' + b"2" * 50 + b"}")]
