"""HTTP errors: one table from error kind to status, answered in OpenAI's error shape.

    {"error": {"message": "...", "type": "invalid_request_error", "code": 400}}
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from encoderrt.runtime.errors import (
    EngineClosed,
    EngineError,
    InferenceFailed,
    InvalidRequest,
    Overloaded,
    ResultTooLarge,
)
from encoderrt.server.responses import JSONResponse


class APIError(Exception):
    """A server-level refusal with its own status (auth, size limits, routing, readiness)."""

    status = 400

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class Unauthorized(APIError):
    status = 401


class UnknownModel(APIError):
    status = 404


class PayloadTooLarge(APIError):
    status = 413


class NotReady(APIError):
    status = 503


STATUS: list[tuple[type[Exception], int]] = [  # first match wins: subclasses before their bases
    (ResultTooLarge, 413),
    (InvalidRequest, 400),
    (Overloaded, 429),
    (EngineClosed, 503),
    (InferenceFailed, 500),
    (EngineError, 500),
]
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    503: "service_unavailable",
}


INTERNAL_ERROR = "internal error; the server log has the cause"
"""A bug of ours, as the client hears of it: the traceback is for the log only."""


def error_body(status: int, message: str) -> dict:
    # a message may quote client text: whatever it holds, the reply is valid JSON (a lone surrogate shows escaped)
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "error"), "code": status}}


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse(error_body(status, message), status_code=status, headers=headers)


def status_of(error: Exception) -> int:
    if isinstance(error, APIError):
        return error.status
    for kind, status in STATUS:
        if isinstance(error, kind):
            return status
    return 500


def _validation_message(error: RequestValidationError) -> str:
    parts = []
    for item in error.errors()[:5]:
        location = ".".join(str(part) for part in item.get("loc", ()) if part != "body")
        parts.append(f"{location or 'body'}: {item.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, error: Exception) -> Response:
        status = status_of(error)
        headers = {"Retry-After": str(getattr(error, "retry_after_s", 1))} if status == 429 else None
        return error_response(status, str(error), headers)

    async def on_validation_error(request: Request, error: RequestValidationError) -> Response:
        return error_response(400, _validation_message(error))

    async def on_http_error(request: Request, error: StarletteHTTPException) -> Response:
        message = str(error.detail)
        allowed = (error.headers or {}).get("Allow")
        if error.status_code == 405 and allowed:
            message = f"{request.method} is not allowed on {request.url.path}; it takes {allowed}"
        return error_response(error.status_code, message, error.headers)  # a 405 keeps its Allow header

    async def on_recursion(request: Request, error: RecursionError) -> Response:
        return error_response(400, "invalid request: the JSON body is nested too deeply")

    async def on_bug(request: Request, error: Exception) -> Response:  # the middleware in front logs the traceback
        return error_response(500, INTERNAL_ERROR)

    app.add_exception_handler(Exception, on_bug)
    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(EngineError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RecursionError, on_recursion)


ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"}, "code": {"type": "integer"}}}},
}


ERRORS_DOCUMENTED = {
    400: "Invalid request: the message names the field or the rule",
    401: "Missing or wrong API key (when the server has one)",
    404: "No such model, or no model of this kind, is served",
    408: "The request body did not arrive within --request-read-timeout",
    413: "Body or item count above the server's limits",
    415: "A Content-Encoding other than gzip or deflate",
    429: "The model's queue is full; Retry-After says when to retry",
    500: "A batch failed; the server log has the cause",
    503: "Models are loading, the server is shutting down, or it is at --max-connections",
}
BODY_ERRORS = (400, 408, 413, 415)


def describe_errors(schema: dict) -> dict:
    """The OpenAPI document as the server answers: FastAPI documents a 422 for invalid bodies, this server sends
    400 in OpenAI's error shape (install_error_handlers); every operation lists the errors it can answer."""
    error = {"content": {"application/json": {"schema": ERROR_SCHEMA}}}
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            for status, description in ERRORS_DOCUMENTED.items():
                if status in BODY_ERRORS and "requestBody" not in operation:
                    continue
                responses.setdefault(str(status), {"description": description, **error})
    for name in ("HTTPValidationError", "ValidationError"):
        schema.get("components", {}).get("schemas", {}).pop(name, None)
    return schema
