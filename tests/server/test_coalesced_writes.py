"""A reply leaves the server in one write (connections.CoalescedWrites), and the writes that must not wait for a
reply's end (`100 Continue`, pipelined replies) still go out, in order."""

import asyncio
import json
import socket

import pytest
import uvicorn
from uvicorn.server import ServerState

from encoderrt import Engine
from encoderrt.server import ServerSettings, create_app
from encoderrt.server.connections import CoalescedWrites, LimitedHttpProtocol
from server_helpers import ready_registry, running_server


class RecordingTransport(asyncio.Transport):
    """What a connection's protocol wrote, write by write."""

    def __init__(self):
        super().__init__()
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data):
        self.writes.append(bytes(data))

    def is_closing(self):
        return self.closing

    def close(self):
        self.closing = True

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass

    def get_write_buffer_size(self):
        return 0


async def _next_step():
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def test_writes_in_one_step_go_out_as_one_and_a_lone_write_at_the_steps_end():
    async def scenario():
        transport = RecordingTransport()
        writes = CoalescedWrites(transport, asyncio.get_running_loop())
        writes.write(b"head ")
        writes.write(b"body")
        assert transport.writes == [] and writes.get_write_buffer_size() == 9
        writes.flush()  # the reply's end
        assert transport.writes == [b"head body"]
        writes.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # nothing follows it in this step
        await _next_step()
        assert transport.writes[1:] == [b"HTTP/1.1 100 Continue\r\n\r\n"]
        writes.write(b"last")
        writes.close()  # what is held goes out before the connection closes
        assert transport.writes[2:] == [b"last"] and transport.closing
        writes.write(b"late")  # a write after close reaches the transport as before, which judges it
        assert transport.writes[3:] == [b"late"]

    asyncio.run(scenario())


def test_held_bytes_of_a_connection_lost_meanwhile_are_dropped():
    async def scenario():
        transport = RecordingTransport()
        writes = CoalescedWrites(transport, asyncio.get_running_loop())
        writes.write(b"head")
        transport.closing = True
        await _next_step()
        assert transport.writes == []

    asyncio.run(scenario())


def test_a_served_reply_is_one_write_with_its_head_and_body(tiny_artifacts):
    """The protocol `encoderrt serve` runs, driven over a transport that records each write."""
    engine = Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=512)
    settings = ServerSettings()
    app = create_app(settings, ready_registry(st=engine))

    async def scenario():
        config = uvicorn.Config(app, http=LimitedHttpProtocol, log_level="warning", access_log=False)
        config.load()
        protocol = LimitedHttpProtocol(config, ServerState(), {}, asyncio.get_running_loop())
        transport = RecordingTransport()
        protocol.connection_made(transport)
        body = json.dumps({"inputs": ["one text", "another text"]}).encode()
        protocol.data_received(b"POST /embed HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                               b"content-length: %d\r\n\r\n%s" % (len(body), body))
        for _ in range(500):
            if transport.writes:
                break
            await asyncio.sleep(0.01)
        await _next_step()
        return transport.writes

    try:
        writes = asyncio.run(scenario())
    finally:
        engine.close()
    assert len(writes) == 1, writes
    head, _, reply = writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"x-compute-tokens" in head
    vectors = json.loads(reply)
    assert len(vectors) == 2 and len(vectors[0]) == engine.info.dimensions


@pytest.fixture(scope="module")
def served(tiny_artifacts):
    engine = Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=512)
    settings = ServerSettings()
    with running_server(create_app(settings, ready_registry(st=engine)), settings) as url:
        host, port = url.removeprefix("http://").split(":")
        yield engine, (host, int(port))
    engine.close()


def _replies(sock: socket.socket, count: int) -> list[tuple[bytes, dict]]:
    """`count` replies read off a keep-alive connection: each one's head and JSON body."""
    buffer, replies = b"", []
    while len(replies) < count:
        head, sep, rest = buffer.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), None) if sep else None
        if length is not None and len(rest) >= length:
            replies.append((head, json.loads(rest[:length])))
            buffer = rest[length:]
            continue
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        buffer += chunk
    return replies


def test_100_continue_goes_out_before_the_body_is_sent(served):
    engine, address = served
    body = json.dumps({"inputs": "a text sent after the server's go-ahead"}).encode()
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(b"POST /embed HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nexpect: 100-continue\r\n"
                     b"content-length: %d\r\n\r\n" % len(body))
        interim = sock.recv(64)  # a held write that never went out would time this out
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(body)
        [(head, vectors)] = _replies(sock, 1)
    assert head.startswith(b"HTTP/1.1 200 ")
    assert vectors == [pytest.approx(engine.embed(["a text sent after the server's go-ahead"])[0].tolist(), abs=1e-6)]


def test_pipelined_requests_are_answered_whole_and_in_order(served):
    engine, address = served
    texts = ["first of three", "the second one", "third"]
    requests = b"".join(
        b"POST /embed HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (len(body), body) for body in (json.dumps({"inputs": text}).encode() for text in texts))
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(requests)
        replies = _replies(sock, 3)
    expected = engine.embed(texts)
    for (head, vectors), vector in zip(replies, expected):
        assert head.startswith(b"HTTP/1.1 200 ")
        assert vectors == [pytest.approx(vector.tolist(), abs=1e-6)]
