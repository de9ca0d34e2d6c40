"""`encoderrt serve`: uvicorn around the app, with graceful SIGTERM and a clean exit on load failure."""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator

import uvicorn

from encoderrt.server.app import create_app
from encoderrt.server.loading import ModelSpec, load_models
from encoderrt.server.registry import ModelRegistry
from encoderrt.server.settings import ServerSettings


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGTERM after its graceful shutdown, so the process would end with -15; a drained
    shutdown is what SIGTERM asks for, and it exits 0."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            self._captured_signals = [s for s in self._captured_signals if s != signal.SIGTERM]


def run_server(settings: ServerSettings, specs: list[ModelSpec]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s:     %(message)s")
    logging.getLogger("encoderrt").setLevel(logging.INFO)
    registry = ModelRegistry()
    failures: list[BaseException] = []
    server: _Server | None = None

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
    server = _Server(config)
    server.run()
    return 1 if failures else 0
