"""The bench's light HTTP client, read against httpx on the same replies from a real uvicorn server."""

import asyncio
import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from encoderrt.bench.http_client import Connection, HttpError
from encoderrt.server import ServerSettings
from encoderrt.server.settings import ConnectionLimits
from tests.server_helpers import free_port, running_server


async def echo(request: Request) -> Response:
    body = await request.json()
    return JSONResponse({"got": body, "path": request.url.path, "port": request.client.port, "host": request.headers["host"]})


async def chunked(request: Request) -> Response:
    parts = [b'{"parts": [', b'"' + b"a" * 70_000 + b'",', b'"b"', b"]}"]

    async def body():
        for part in parts:
            yield part

    return StreamingResponse(body(), media_type="application/json")


async def busy(request: Request) -> Response:
    return JSONResponse({"error": "busy"}, status_code=429, headers={"retry-after": "0.5"})


async def closing(request: Request) -> Response:
    return JSONResponse({"port": request.client.port}, headers={"connection": "close"})


APP = Starlette(routes=[Route("/v1/echo", echo, methods=["POST"]), Route("/v1/chunked", chunked, methods=["POST"]),
                        Route("/v1/busy", busy, methods=["POST"]), Route("/v1/closing", closing, methods=["POST"])])


def exchange(url: str, calls: list[tuple[str, object]], **options) -> list:
    async def main():
        connection = Connection(url, **options)
        try:
            return [await connection.post_json(path, payload) for path, payload in calls]
        finally:
            await connection.close()

    return asyncio.run(main())


def test_replies_read_as_httpx_reads_them():
    payload = {"input": ["naïve café", "日本語"], "n": 3}
    with running_server(APP) as url:
        echoed, streamed, refused = exchange(url, [("/v1/echo", payload), ("/v1/chunked", {}), ("/v1/busy", {})])
        reference = [httpx.post(f"{url}{path}", json=body, timeout=30) for path, body in
                     (("/v1/echo", payload), ("/v1/chunked", {}), ("/v1/busy", {}))]
    assert "content-length" in echoed.headers and streamed.headers.get("transfer-encoding") == "chunked"
    for ours, theirs in zip((echoed, streamed, refused), reference):
        assert ours.status == theirs.status_code
        assert ours.headers["content-type"] == theirs.headers["content-type"]
        ours_json, theirs_json = ours.json(), theirs.json()
        for parsed in (ours_json, theirs_json):
            parsed.pop("port", None)  # each client's own connection
        assert ours_json == theirs_json
    assert streamed.body == reference[1].content and refused.body == reference[2].content
    assert echoed.json()["got"] == payload and len(streamed.json()["parts"][0]) == 70_000
    assert refused.status == 429 and refused.headers["retry-after"] == "0.5"


def test_one_connection_is_kept_alive_and_reopened_when_the_server_closes_it():
    settings = ServerSettings(connections=ConnectionLimits(keep_alive_timeout=0.2))
    with running_server(APP, settings) as url:
        async def main():
            connection = Connection(url)
            try:
                first, second = [(await connection.post_json("/v1/echo", {})).json()["port"] for _ in range(2)]
                closed = (await connection.post_json("/v1/closing", {})).json()["port"]
                after_close = (await connection.post_json("/v1/echo", {})).json()["port"]
                await asyncio.sleep(0.6)  # the server drops the idle connection: the next request must not fail
                after_idle = (await connection.post_json("/v1/echo", {})).json()["port"]
                return first, second, closed, after_close, after_idle
            finally:
                await connection.close()

        first, second, closed, after_close, after_idle = asyncio.run(main())
    assert first == second == closed  # one connection for all three
    assert after_close != closed and after_idle != after_close


def test_a_path_prefix_and_the_host_header_follow_the_url():
    with running_server(APP) as url:
        prefixed = url + "/v1/"
        (reply,) = exchange(prefixed, [("/echo", {"x": 1})])
    assert reply.json()["path"] == "/v1/echo" and reply.json()["host"] == url.removeprefix("http://")


def test_failures_are_one_clear_error():
    port = free_port()
    with pytest.raises(HttpError, match=f"cannot connect to 127.0.0.1:{port}"):
        exchange(f"http://127.0.0.1:{port}", [("/x", {})])
    with pytest.raises(ValueError, match="not an http"):
        Connection("ftp://example.com")

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        await asyncio.sleep(5)
        writer.close()

    async def garbled(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()
        writer.close()

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
        await writer.drain()
        writer.close()

    async def against(handler, timeout: float = 30.0) -> str:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        connection = Connection(f"http://127.0.0.1:{port}", timeout=timeout)
        started = time.monotonic()
        try:
            await connection.post_json("/x", {})
        except HttpError as error:
            assert time.monotonic() - started < 3
            return str(error)
        finally:
            await connection.close()
            server.close()
        raise AssertionError("no error")

    assert "no reply" in asyncio.run(against(silent, timeout=0.3))
    assert "not an HTTP/1.x reply" in asyncio.run(against(garbled))
    assert "mid-reply" in asyncio.run(against(cut))
