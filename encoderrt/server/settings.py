"""Server settings, built once by the CLI (or a test) and handed to the app factory; each field is declared once
(runtime/settings.py) and is a flag of `encoderrt serve`."""

from __future__ import annotations

from dataclasses import dataclass, field

from encoderrt.runtime.config import EngineConfig
from encoderrt.runtime.settings import setting


@dataclass(frozen=True)
class ConnectionLimits:
    """What one client may hold of the server before its request reaches the app (server/connections.py). Under
    Ray, Ray's proxy holds the connections, so none of these is an app setting."""

    max_header_bytes: int = setting(
        32 * 1024, "largest request head (request line and headers); above it, 431 (nginx's practical limit)",
        metavar="N", in_app=False)
    max_connections: int = setting(
        512, "open connections at most; a request on one above it gets 503 with Retry-After, then the connection "
        "closes", metavar="N", in_app=False)
    request_read_timeout: float = setting(
        30.0, "a request's head, then its body, must each arrive within S seconds, or 408: a client that trickles "
        "a byte at a time cannot hold a connection", metavar="S", in_app=False)
    keep_alive_timeout: float = setting(
        5.0, "idle keep-alive connections close after S seconds (set it above a load balancer's idle timeout)",
        metavar="S", in_app=False)

    def __post_init__(self) -> None:
        for name in ("max_header_bytes", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.request_read_timeout <= 0:
            raise ValueError(f"--request-read-timeout must be above 0 seconds, got {self.request_read_timeout}")
        if self.keep_alive_timeout <= 0:
            raise ValueError(f"--keep-alive-timeout must be above 0 seconds, got {self.keep_alive_timeout}")


@dataclass(frozen=True)
class ServerSettings:
    host: str = setting("127.0.0.1", "address to listen on", in_app=False)
    port: int = setting(8000, "port to listen on", in_app=False)
    grpc_port: int | None = setting(
        None, "also serve TEI's gRPC API (tei.v1 Embed, Predict, Rerank, Info; grpc.health.v1; reflection) on this "
        "port, with the same models and limits; unset: no gRPC", metavar="PORT", in_app=False)
    api_key: str | None = setting(None, "require 'Authorization: Bearer KEY' on every API route", metavar="KEY")
    max_body_bytes: int = setting(2 * 1024 * 1024, "largest request body, after decompression; above it, 413",
                                  metavar="N")
    max_client_batch_size: int = setting(512, "most items (texts, documents, pairs) one request may carry; above "
                                              "it, 413", metavar="N")
    shutdown_timeout: float = setting(
        30.0, "on SIGTERM, stop accepting and let in-flight requests finish for at most S seconds; those still "
        "running then get a 503", metavar="S", in_app=False)
    engine: EngineConfig = field(default_factory=EngineConfig)
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)

    def __post_init__(self) -> None:
        # out of range, the OS would bind another port (99999 mod 65536) or blame --host
        for flag, port in (("--port", self.port), ("--grpc-port", self.grpc_port)):
            if port is not None and not 0 <= port <= 65535:
                raise ValueError(f"{flag} must be a port number (0 to 65535), got {port}")
        if self.grpc_port is not None and self.grpc_port == self.port != 0:
            raise ValueError(f"--grpc-port {self.grpc_port} is --port too: give gRPC a port of its own")
        if self.shutdown_timeout < 0:
            raise ValueError(f"--shutdown-timeout must be at least 0 seconds, got {self.shutdown_timeout}")
