"""One ASGI middleware for what every request needs: id, API key, body limit, metrics, and cancelling
the work of a client that went away.

Plain ASGI rather than BaseHTTPMiddleware: it streams untouched. A POST runs beside a watcher task
that waits, once the body is read, for the client's `http.disconnect`; if that comes first the route is
cancelled, which cancels its engine request, so its rows are dropped before they run (counted as the
engine's cancelled items, and as status 499 in the HTTP metrics, as nginx logs a client that closed; so is a
client gone before its body was in). A POST to a dialect's route goes straight to its handler
(direct_routes.py); anything else, down FastAPI's stack.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import random
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from encoderrt.server.connections import BODY_IN, CLIENT_GONE, ClientGone
from encoderrt.server.direct_routes import DirectRoutes
from encoderrt.server.errors import INTERNAL_ERROR, error_response
from encoderrt.server.metrics import Metrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = ("/health", "/docs", "/docs-assets/", "/openapi.json")
CLIENT_CLOSED = 499
log = logging.getLogger("encoderrt.server")


class ServerMiddleware:
    def __init__(self, app: ASGIApp, metrics: Metrics, api_key: str | None, max_body_bytes: int, body_timeout_s: float,
                 direct: DirectRoutes | None = None):
        """`direct`: the dialects' POST routes, called past the router (direct_routes.py)."""
        self.app = app
        self.direct = direct
        self.metrics = metrics
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self._ids = random.Random()
        """Request ids need only be unique, not secret: uuid4's urandom syscall cost 94 us a request under load."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request_id = authorization = length = b""
        authorizations = 0
        # the three headers it reads, left undecoded (1.3 against 3.6 us for decoding every header); a repeated
        # one's last value counts
        for name, value in scope["headers"]:
            name = name.lower()
            if name == b"x-request-id":
                request_id = value
            elif name == b"authorization":
                authorization = value
                authorizations += 1
            elif name == b"content-length":
                length = value
        request_id = request_id or b"%032x" % self._ids.getrandbits(128)
        status_holder = {"status": 500}

        def observe() -> None:
            if not status_holder.get("observed"):
                status_holder["observed"] = True
                route = getattr(scope.get("route"), "path", None) or "unmatched"
                self.metrics.observe(route, status_holder["status"], time.perf_counter() - start)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
                status_holder["started"] = True
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [(b"x-request-id", request_id)]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                observe()  # before the client can read the reply: a scrape right after it counts it
            await send(message)

        try:
            refusal = self._refusal(scope["path"], authorization.decode("latin-1"), authorizations,
                                    length.decode("latin-1"))
            if refusal is not None:
                await refusal(scope, receive, send_with_id)
                return
            try:
                if scope["method"] == "POST":
                    app = self.app
                    route = self.direct.route_for(scope) if self.direct is not None else None
                    if route is not None:
                        app = functools.partial(self.direct.run, route)  # type: ignore[union-attr]
                    if await _cancelled_on_disconnect(app, scope, self._limited(scope, receive), send_with_id):
                        status_holder["status"] = CLIENT_CLOSED
                else:
                    await self.app(scope, self._limited(scope, receive), send_with_id)
            except ClientDisconnect:  # gone before its body was in: nobody to answer, and no fault of ours
                status_holder["status"] = CLIENT_CLOSED
            except asyncio.CancelledError:  # uvicorn's shutdown timeout ran out with this request in flight
                if status_holder.get("started"):
                    raise
                self.metrics.count_cut_off()
                await error_response(503, "the server is shutting down: this request was still running when its "
                                     "shutdown timeout ended; retry on another replica")(scope, receive, send_with_id)
            except Exception:  # noqa: BLE001 - a bug of ours: our error shape and request id, the traceback logged
                log.exception("unexpected error on %s %s", scope["method"], scope["path"])
                if not status_holder.get("started"):
                    await error_response(500, INTERNAL_ERROR)(scope, receive, send_with_id)
        finally:
            observe()  # a request that never finished a reply (disconnected, cut off) counts here

    def _refusal(self, path: str, authorization: str, authorizations: int, length: str):
        if authorizations > 1:  # which one counts would be a proxy's guess; refuse rather than pick
            return error_response(400, f"{authorizations} Authorization headers: send one")
        if self.api_key and not path.startswith(OPEN_PATHS):
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key):
                return error_response(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                                      {"WWW-Authenticate": 'Bearer realm="encoderrt"'})
        if length.isdigit() and int(length) > self.max_body_bytes:
            return error_response(413, f"request body of {length} bytes is above the limit of {self.max_body_bytes} bytes")
        return None

    def _limited(self, scope: Scope, receive: Receive) -> Receive:
        """Count streamed (chunked) bodies too, and time them: past the size limit the route sees a 413, past the
        read timeout (a body trickled in to hold the connection) a 408. Once the body is in (read, or all arrived:
        connections.BODY_IN), receive is untimed."""
        received = 0
        deadline = asyncio.get_running_loop().time() + self.body_timeout_s
        body_done = False

        async def limited_receive() -> Message:
            nonlocal received, body_done
            if body_done:
                return await receive()
            try:
                if scope.get(BODY_IN):  # nothing left to wait for
                    message = await receive()
                else:
                    async with asyncio.timeout_at(deadline):  # a timer, not wait_for's task a message
                        message = await receive()
            except TimeoutError:
                # HTTPExceptions, since FastAPI turns anything else raised while reading the body into a 400
                raise HTTPException(408, f"the request body did not arrive within {self.body_timeout_s:g} s "
                                    "(--request-read-timeout)") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > self.max_body_bytes:
                    raise HTTPException(413, f"request body is above the limit of {self.max_body_bytes} bytes")
            return message

        return limited_receive


async def _cancelled_on_disconnect(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> bool:
    """Run the app until it answers or the client disconnects (then cancel it); True if the client went away.

    The app runs in this task. Once the body is read, a disconnect while the app still runs cancels this task: the
    server's protocol says so through the scope's `ClientGone` (connections.py); under another server (Ray Serve's
    proxy, a test's transport) a watcher task takes over `receive` and waits for the client's `http.disconnect`."""
    this = asyncio.current_task()
    assert this is not None
    state = {"in_app": True, "cut": False}
    told: ClientGone | None = scope.get(CLIENT_GONE)
    gone: asyncio.Future[None] | None = None
    watcher: asyncio.Task[None] | None = None

    def cut() -> None:
        if state["in_app"]:  # the app's answer is not done; nothing else can run between its end and in_app = False
            state["cut"] = True
            this.cancel()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        assert gone is not None
        gone.set_result(None)
        cut()

    async def app_receive() -> Message:
        nonlocal watcher, gone
        if gone is not None:  # the watcher owns `receive` now; the app only ever hears of a disconnect
            await asyncio.shield(gone)
            return {"type": "http.disconnect"}
        message = await receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            if told is not None:
                told.call(cut)
            else:
                gone = asyncio.get_running_loop().create_future()
                watcher = asyncio.ensure_future(watch())
        return message

    try:
        await app(scope, app_receive, send)
    except asyncio.CancelledError:
        if not state["cut"]:  # the server itself is stopping this request
            raise
    finally:
        state["in_app"] = False
        if told is not None:
            told.call(None)
        if watcher is not None:
            watcher.cancel()
    if state["cut"]:
        this.uncancel()  # our own cancel, handled here: it must not reach the server's awaits
        return True
    return False
