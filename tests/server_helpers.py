"""Running a real uvicorn server from tests."""

import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import replace

import httpx
import uvicorn

from encoderrt import Engine
from encoderrt.server import ServerSettings
from encoderrt.server.connections import uvicorn_config
from encoderrt.server.registry import ModelRegistry


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_server(app, settings: ServerSettings | None = None, plain_uvicorn: bool = False):
    """A real uvicorn server on a free loopback port, in a thread, configured as `encoderrt serve` configures it
    (with `settings`' connection limits), or with `plain_uvicorn` as any ASGI server runs the app (uvicorn's own
    protocol: no limits, no word of a disconnect but `receive`'s); yields its base URL."""
    port = free_port()
    settings = replace(settings or ServerSettings(), host="127.0.0.1", port=port)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, http="httptools", log_level="warning",
                            access_log=False) if plain_uvicorn else \
        uvicorn_config(app, settings, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def metric(url: str, name: str, label: str) -> float:
    """One sample of a server's /metrics, by name and one label; 0 until it has been counted."""
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name) and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for(condition, timeout: float, what) -> None:
    """Polls `condition` until it holds; past `timeout` s, fails with `what` (or what it returns, if callable)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.01)


def ready_registry(**engines: Engine) -> ModelRegistry:
    registry = ModelRegistry()
    for name, engine in engines.items():
        registry.add(name, engine)
    registry.mark_ready()
    return registry


def retrieval_models(minilm_fp32, tiny_artifacts):
    """An embedding model, a cross-encoder and a classifier, as a retrieval stack runs them."""
    return ready_registry(
        minilm=Engine.load(minilm_fp32.path, max_batch_tokens=1024),
        reranker=Engine.load(tiny_artifacts["bert-cross-encoder"], max_batch_tokens=512),
        classifier=Engine.load(tiny_artifacts["bert-classifier"], max_batch_tokens=512),
    )
