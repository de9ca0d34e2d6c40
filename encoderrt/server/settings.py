"""Server settings, built once by the CLI (or a test) and handed to the app factory."""

from __future__ import annotations

from dataclasses import dataclass, field

from encoderrt.runtime.config import EngineConfig


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_body_bytes: int = 2 * 1024 * 1024
    max_client_batch_size: int = 512
    """Most items (texts, documents, pairs) one request may carry."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    graceful_shutdown_s: float = 30.0
    """On SIGTERM: stop accepting, let in-flight requests finish for at most this long (--shutdown-timeout); those
    still running then are answered 503."""

    def __post_init__(self) -> None:
        if self.graceful_shutdown_s < 0:
            raise ValueError(f"--shutdown-timeout must be at least 0 seconds, got {self.graceful_shutdown_s}")
