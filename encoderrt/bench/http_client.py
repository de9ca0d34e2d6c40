"""The bench's HTTP load: one keep-alive HTTP/1.1 connection per client, and nothing a benchmark does not need.

The load runs on the machine it measures. httpx spent 1.9-2.2 ms of CPU per request there (2-core AMD EPYC,
one short query per request), against 0.21 ms for this client, JSON included: at 32 clients the bench's
own httpx took the cores the server needed, and measured it at 124 requests/s where a light client saw
464. So this client writes each request in one piece and reads a Content-Length, chunked or
close-delimited reply; there are no redirects, cookies, proxies or compression (it asks for none).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

TIMEOUT_S = 300.0
"""A reply may take this long: a deep queue on a slow CPU, never a hang."""


class HttpError(Exception):
    """The server broke HTTP/1.1, closed the connection, or did not answer in time."""


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    """Lower-case names; a repeated header keeps its last value."""
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Connection:
    """Requests to one server, one at a time, over one connection that is reopened when the server closes it."""

    def __init__(self, base_url: str, timeout: float = TIMEOUT_S):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._host, self._prefix, self._timeout = parts.hostname, parts.path.rstrip("/"), timeout
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._authority = parts.netloc.rpartition("@")[2]
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post_json(self, path: str, payload: Any) -> Reply:
        body = json.dumps(payload, separators=(",", ":")).encode()
        return await self._request(f"POST {self._prefix}{path} HTTP/1.1\r\nhost: {self._authority}\r\n"
                                   f"content-type: application/json\r\naccept-encoding: identity\r\n"
                                   f"content-length: {len(body)}\r\n\r\n".encode() + body)

    async def get(self, path: str) -> Reply:
        return await self._request(f"GET {self._prefix}{path} HTTP/1.1\r\nhost: {self._authority}\r\n"
                                   "accept-encoding: identity\r\n\r\n".encode())

    async def _request(self, request: bytes) -> Reply:
        try:
            return await asyncio.wait_for(self._exchange(request), self._timeout)
        except asyncio.TimeoutError:
            await self.close()
            raise HttpError(f"no reply from {self._host}:{self._port} within {self._timeout:.0f} s") from None

    async def _exchange(self, request: bytes) -> Reply:
        reused = self._streams is not None
        reader, writer = await self._open()
        try:
            writer.write(request)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            await self.close()
            if reused and not getattr(exc, "partial", b""):  # an idle connection the server had closed: a fresh one
                return await self._exchange(request)
            raise HttpError(f"{self._host}:{self._port} closed the connection before replying: {exc}") from None
        except asyncio.LimitOverrunError:
            await self.close()
            raise HttpError("reply headers over 1 MiB") from None
        try:
            reply = await _read_reply(head, reader)
        except HttpError:
            await self.close()
            raise
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            await self.close()
            raise HttpError(f"{self._host}:{self._port} broke off mid-reply: {exc}") from None
        if reply.headers.get("connection", "").lower() == "close":
            await self.close()
        return reply

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._streams is None:
            try:
                self._streams = await asyncio.open_connection(self._host, self._port, ssl=self._ssl, limit=2**20)
            except OSError as exc:
                raise HttpError(f"cannot connect to {self._host}:{self._port}: {exc.strerror or exc}") from None
        return self._streams

    async def close(self) -> None:
        if self._streams is not None:
            writer, self._streams = self._streams[1], None
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, ssl.SSLError):
                pass


async def _read_reply(head: bytes, reader: asyncio.StreamReader) -> Reply:
    """The reply whose header block (up to and with its blank line) is `head`; its body is read from `reader`."""
    status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
        raise HttpError(f"not an HTTP/1.x reply: {status_line[:80]!r}")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunks(reader)
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    else:  # delimited by the server closing the connection
        body = await reader.read()
        headers["connection"] = "close"
    return Reply(int(rest[:3]), headers, body)


async def _read_chunks(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0], 16)
        except ValueError:
            raise HttpError(f"bad chunk size line {size_line[:40]!r}") from None
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, if any
                pass
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
