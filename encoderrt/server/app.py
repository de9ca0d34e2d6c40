"""The app factory: settings and a model registry in, a FastAPI app out.

Models load in a background thread started by the lifespan, so /health can answer 503 (with each
model's step) while a model compiles; routes answer 503 until the registry is ready. Stopping the
server cancels loading at the next compile step and waits for it, so no half-written artifact stays.

The server's middleware stands in front of FastAPI's whole stack (`ServerApp`), not inside it: a dialect's POST
then reaches its handler past FastAPI's error, telemetry and body-limit layers, which cost a one-query request
~25 us of the event loop's ~0.37 ms (2-core Sapphire Rapids) and whose work the middleware does itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from encoderrt import __version__
from encoderrt.server import cohere, hf_hub, openai, rerank, system, tei, vllm
from encoderrt.server.direct_routes import DirectRoutes
from encoderrt.server.errors import describe_errors, install_error_handlers
from encoderrt.server.health import ServingHealth
from encoderrt.server.metrics import Metrics
from encoderrt.server.middleware import ASGIApp, Receive, Scope, Send, ServerMiddleware
from encoderrt.server.registry import LoadCancelled, ModelRegistry
from encoderrt.server.settings import ServerSettings
from encoderrt.server.tei_grpc import GrpcServer

log = logging.getLogger("encoderrt.server")
CANCEL_WAIT_S = 120.0
"""How long stopping waits for a compile step to reach its end (MiniLM's longest takes ~10 s on 2 cores)."""


def create_app(
    settings: ServerSettings,
    models: ModelRegistry,
    load: Callable[[], None] | None = None,
    on_load_failure: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """`load` fills `models` (in a thread at start-up); without it, `models` must already be ready."""

    def load_in_background() -> None:
        try:
            assert load is not None
            load()
        except LoadCancelled as stopped:
            log.info("model loading %s", stopped)
        except BaseException as error:  # noqa: BLE001 - reported through /health and the failure callback
            log.error("model loading failed: %s", error)
            models.mark_failed(f"{type(error).__name__}: {error}")
            if on_load_failure is not None:
                on_load_failure(error)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.metrics.watch_thread("event_loop")  # the lifespan runs on the loop that serves the requests
        loader = threading.Thread(target=load_in_background, name="encoderrt-load", daemon=True)
        grpc_server = None
        if settings.grpc_port is not None:
            grpc_server = GrpcServer(models, settings, app.state.metrics)
            port = grpc_server.start()
            log.info("TEI's gRPC API on %s:%d", settings.host, port)
            models.when_ready(lambda: grpc_server.mark_serving(True))
        if load is not None:
            loader.start()
        yield
        if grpc_server is not None:
            grpc_server.stop(settings.shutdown_timeout)
        if loader.is_alive():
            log.info("stopping: model loading ends at its current step")
            models.cancel()
            loader.join(CANCEL_WAIT_S)
        models.close()

    app = ServerApp(title="encoderrt", version=__version__, docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.models = models
    app.state.settings = settings
    app.state.metrics = Metrics(models)
    app.state.health = ServingHealth(models)
    dialects = (openai, vllm, rerank, cohere, tei, hf_hub, system)
    for dialect in dialects:
        app.include_router(dialect.router)
    system.mount_docs(app)
    install_error_handlers(app)

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = describe_errors(get_openapi(title=app.title, version=app.version, routes=app.routes))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.front = ServerMiddleware(app.stack, metrics=app.state.metrics, api_key=settings.api_key,
                                 max_body_bytes=settings.max_body_bytes,
                                 body_timeout_s=settings.connections.request_read_timeout,
                                 direct=DirectRoutes([route for dialect in dialects for route in dialect.router.routes],
                                                     app.exception_handlers))
    return app


class ServerApp(FastAPI):
    """FastAPI whose HTTP requests go through `front` (the server's middleware) before its own stack."""

    front: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.front is None or scope["type"] != "http":  # the lifespan, or an app not yet built
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self  # as Starlette sets it: a direct route's request.app
        await self.front(scope, receive, send)

    async def stack(self, scope: Scope, receive: Receive, send: Send) -> None:
        """FastAPI's own stack, behind `front`."""
        await super().__call__(scope, receive, send)
