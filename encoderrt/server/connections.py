"""The HTTP protocol under the app: uvicorn's httptools protocol with the limits it lacks.

uvicorn buffers a request head of any size, keeps a connection whose request trickles in a byte at a time open
for ever (its keep-alive timer restarts on every byte, and a new connection that sends nothing has none), and
accepts connections without bound. Here a head above `max_header_bytes` is answered 431, a head not received
within `request_read_timeout` 408 (the body's own deadline is the middleware's, which owns the body), and a request on a
connection above `max_connections` 503 with Retry-After. Every answer is the API's JSON error, then the connection
closes. Malformed HTTP gets that JSON shape too, where uvicorn sends plain text.

It also tells a request's app the moment its client's connection drops (`ClientGone`), so the app need not keep a
task reading `receive` to find out, and sends a reply's head and body in one write (`CoalescedWrites`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from encoderrt.server.errors import error_body, error_response
from encoderrt.server.settings import ConnectionLimits, ServerSettings

log = logging.getLogger("encoderrt.server")
LINGER_S = 2.0
"""After a refusal the connection drops what the client still sends for this long, then closes."""
CLIENT_GONE = "encoderrt.client_gone"
"""The scope key of a request's `ClientGone`, under this protocol only."""
BODY_IN = "encoderrt.body_in"
"""The scope key this protocol sets once a request's whole body has arrived: reading it then waits for nothing, so
the middleware reads it without the body's read timer (whose scheduling and cancelling cost a one-query request
~4% of its event-loop time). Under another server the key is absent and every read of the body is timed."""


class ClientGone:
    """Whether the connection dropped before the request's reply ended, and what to call when it does.

    Under another server the middleware learns of a disconnect from a task that waits on `receive` instead; that
    task cost a one-query request ~40 us of the event loop (2-core Sapphire Rapids), a tenth of its share."""

    __slots__ = ("_callback", "_happened")

    def __init__(self) -> None:
        self._callback: Callable[[], None] | None = None
        self._happened = False

    def call(self, callback: Callable[[], None] | None) -> None:
        """Call `callback` when the client goes, at once if it has gone; None: call nothing."""
        self._callback = callback
        if self._happened:
            self()

    def __call__(self) -> None:
        self._happened = True
        callback, self._callback = self._callback, None
        if callback is not None:
            callback()


class CoalescedWrites:
    """The connection's transport, with the writes of one step of the event loop sent as one.

    uvicorn writes a reply's head and its body apart: two sends, each a system call that on loopback also runs the
    receiver's TCP path, and two segments that can wake the client twice. Here a write is held until the reply
    completes (`flush`) or, for any other write (a streamed body's chunk, `100 Continue`), until the step ends."""

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if self._transport.is_closing():  # as the transport itself treats a write after close
            self._transport.write(data)
            return
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(data)

    def flush(self) -> None:
        held = self._held
        if held:
            self._held = []
            if not self._transport.is_closing():  # a connection lost meanwhile takes no more bytes
                self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._held))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class LimitedHttpProtocol(HttpToolsProtocol):
    """One per connection, made by uvicorn; `limits` is set on the subclass `protocol_for` makes."""

    limits: ConnectionLimits = ConnectionLimits()
    on_refusal: Callable[[int], None] | None = None
    """Counts each refusal by status (the app's /metrics), since these requests never reach its middleware."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescedWrites(transport, self.loop))  # type: ignore[arg-type]
        self._awaiting_head = True
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False
        self._arm_head_timer()  # a new connection that sends nothing is held no longer than a slow one
        if len(self.connections) > self.limits.max_connections:
            log.warning("refusing a request: %d connections are open (--max-connections %d)",
                        len(self.connections), self.limits.max_connections)
            self._count(503)
            self.app = error_response(503, f"the server has {self.limits.max_connections} connections open, its limit; "
                                      "retry shortly", {"Retry-After": "1", "Connection": "close"})

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:  # uvicorn's mark: the reply had not ended
            gone = cycle.scope.get(CLIENT_GONE)
            if gone is not None:
                gone()

    def data_received(self, data: bytes) -> None:
        if self._refused:  # lingering after a refusal: what the client still sends is dropped unread
            return
        if self._awaiting_head:  # counted before parsing: httptools itself buffers a header of any length
            self._head_bytes += len(data)
        super().data_received(data)
        if self._awaiting_head and self._head_bytes > self.limits.max_header_bytes and not self._refused:
            self._answer_and_close(431, f"the request head is above the limit of {self.limits.max_header_bytes} bytes "
                                   "(--max-header-bytes)")

    # parser callbacks: a head begins, completes; the next one may follow on the same connection
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        self._head_bytes = 0
        self._cancel_head_timer()
        self.scope[CLIENT_GONE] = ClientGone()  # type: ignore[literal-required]
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        self.transport.flush()  # type: ignore[attr-defined]
        super().on_response_complete()

    def on_message_complete(self) -> None:
        self.scope[BODY_IN] = True  # type: ignore[literal-required]
        super().on_message_complete()
        self._awaiting_head = True

    def send_400_response(self, msg: str) -> None:
        self._answer_and_close(400, f"malformed HTTP request: {msg}")

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.request_read_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._awaiting_head and not self._refused and not self.transport.is_closing():
            self._answer_and_close(408, f"the request head did not arrive within {self.limits.request_read_timeout:g} s "
                                   "(--request-read-timeout)")

    def _count(self, status: int) -> None:
        if self.on_refusal is not None:
            self.on_refusal(status)

    def _answer_and_close(self, status: int, message: str) -> None:
        self._count(status)
        body = json.dumps(error_body(status, message)).encode()
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
        self._refused = True
        self._cancel_head_timer()
        self.transport.write(head + body)
        if self.transport.can_write_eof():  # a lingering close, as nginx does: closing with the client's bytes
            self.transport.write_eof()       # unread would reset the connection, and the answer could be lost
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def uvicorn_config(app: object, settings: ServerSettings, **options: object) -> uvicorn.Config:
    """The one uvicorn configuration `encoderrt serve` (and a test's server) runs with."""
    metrics = getattr(getattr(app, "state", None), "metrics", None)
    protocol = type("LimitedHttpProtocol", (LimitedHttpProtocol,), {
        "limits": settings.connections,
        "on_refusal": staticmethod(metrics.count_refused) if metrics is not None else None})
    return uvicorn.Config(app, host=settings.host, port=settings.port, http=protocol,  # type: ignore[arg-type]
                          timeout_keep_alive=settings.connections.keep_alive_timeout,  # type: ignore[arg-type]
                          timeout_graceful_shutdown=settings.shutdown_timeout,  # type: ignore[arg-type]
                          **options)  # type: ignore[arg-type]
