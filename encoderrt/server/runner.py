"""`encoderrt serve`: uvicorn around the app, with graceful SIGTERM, a one-line Ctrl-C and a clean exit on load failure."""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator

import uvicorn

from encoderrt.server.app import create_app
from encoderrt.server.connections import uvicorn_config
from encoderrt.server.loading import PlannedModel, load_models
from encoderrt.server.registry import ModelRegistry
from encoderrt.server.settings import ServerSettings

INTERRUPTED = 130


class _Server(uvicorn.Server):
    """uvicorn re-raises the signal that stopped it after its graceful shutdown, so SIGTERM would end the process
    with -15 and Ctrl-C with a KeyboardInterrupt traceback; a drained shutdown is what both ask for. SIGTERM exits 0,
    Ctrl-C 130, as shells expect."""

    interrupted = False

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            self.interrupted = signal.SIGINT in self._captured_signals
            self._captured_signals = [s for s in self._captured_signals if s not in (signal.SIGTERM, signal.SIGINT)]


def run_server(settings: ServerSettings, models: list[PlannedModel]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s:     %(message)s")
    logging.getLogger("encoderrt").setLevel(logging.INFO)
    registry = ModelRegistry()
    failures: list[BaseException] = []
    server: _Server | None = None

    def on_load_failure(error: BaseException) -> None:
        failures.append(error)
        if server is not None:
            server.should_exit = True

    app = create_app(settings, registry, load=lambda: load_models(models, settings.engine, registry),
                     on_load_failure=on_load_failure)
    server = _Server(uvicorn_config(app, settings, access_log=False, log_level="info"))
    server.run()
    cut_off = app.state.metrics.cut_off_requests
    if cut_off:
        logging.getLogger("encoderrt.server").error("%d requests were cut off by the shutdown timeout of %.0f s "
                                                    "(--shutdown-timeout)", cut_off, settings.shutdown_timeout)
    if server.interrupted:
        return INTERRUPTED
    return 1 if failures or cut_off else 0
