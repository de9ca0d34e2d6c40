"""Server settings, built once by the CLI (or a test) and handed to the app factory."""

from __future__ import annotations

from dataclasses import dataclass, field

from encoderrt.runtime.config import EngineConfig


@dataclass(frozen=True)
class ConnectionLimits:
    """What one client may hold of the server before its request reaches the app (server/connections.py)."""

    max_header_bytes: int = 32 * 1024
    """A request head (request line and headers) above this is answered 431 (nginx's practical limit)."""
    max_connections: int = 512
    """Open connections at most; a request on one above it gets 503 with Retry-After, then the connection closes."""
    read_timeout_s: float = 30.0
    """A request's head, and then its body, must each arrive within this (408 otherwise): a client that trickles a
    byte at a time cannot hold a connection forever."""
    keep_alive_s: float = 5.0
    """An idle keep-alive connection closes after this (set it above a load balancer's idle timeout)."""

    def __post_init__(self) -> None:
        for name in ("max_header_bytes", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.read_timeout_s <= 0:
            raise ValueError(f"--request-read-timeout must be above 0 seconds, got {self.read_timeout_s}")
        if self.keep_alive_s <= 0:
            raise ValueError(f"--keep-alive-timeout must be above 0 seconds, got {self.keep_alive_s}")


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_body_bytes: int = 2 * 1024 * 1024
    max_client_batch_size: int = 512
    """Most items (texts, documents, pairs) one request may carry."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    graceful_shutdown_s: float = 30.0
    """On SIGTERM: stop accepting, let in-flight requests finish for at most this long (--shutdown-timeout); those
    still running then are answered 503."""

    def __post_init__(self) -> None:
        if self.graceful_shutdown_s < 0:
            raise ValueError(f"--shutdown-timeout must be at least 0 seconds, got {self.graceful_shutdown_s}")
