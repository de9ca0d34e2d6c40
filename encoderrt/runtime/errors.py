"""Runtime errors: one class per kind, so the server can map each to one HTTP status."""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class InvalidRequest(EngineError, ValueError):
    """The request breaks a rule (pairing, dimensions, top_n, wrong task for this model)."""


class InputTooLong(InvalidRequest):
    def __init__(self, index: int, length: int, limit: int, whose: str = "the model's"):
        super().__init__(
            f"input {index} is {length} tokens long, above {whose} limit of {limit} tokens; "
            "shorten it or allow truncation"
        )
        self.index, self.length, self.limit = index, length, limit


class ResultTooLarge(InvalidRequest):
    """The answer would be larger than the engine returns for one request (HTTP 413)."""


class Overloaded(EngineError):
    """The queue is full: retry later (HTTP 429 with Retry-After). Raised at once, never after a wait."""

    def __init__(self, message: str, retry_after_s: int = 1):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class InferenceFailed(EngineError):
    """The backend run holding this request's items failed; other batches are unaffected."""


class EngineClosed(EngineError):
    """The engine was closed before the request finished."""


class BackendUnavailable(RuntimeError):
    """The artifact's target needs a package or device that this machine lacks (raised at load, never per request)."""
