"""`encoderrt serve`: uvicorn around the app, with graceful SIGTERM and a clean exit on load failure."""

from __future__ import annotations

import logging

import uvicorn

from encoderrt.server.app import create_app
from encoderrt.server.loading import ModelSpec, load_models
from encoderrt.server.registry import ModelRegistry
from encoderrt.server.settings import ServerSettings


def run_server(settings: ServerSettings, specs: list[ModelSpec]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s:     %(message)s")
    logging.getLogger("encoderrt").setLevel(logging.INFO)
    registry = ModelRegistry()
    failures: list[BaseException] = []
    server: uvicorn.Server | None = None

    def on_load_failure(error: BaseException) -> None:
        failures.append(error)
        if server is not None:
            server.should_exit = True

    app = create_app(settings, registry, load=lambda: load_models(specs, settings.engine, registry),
                     on_load_failure=on_load_failure)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        access_log=False,
        log_level="info",
        timeout_graceful_shutdown=int(settings.graceful_shutdown_s),
    )
    server = uvicorn.Server(config)
    server.run()
    return 1 if failures else 0
