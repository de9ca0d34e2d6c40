"""Request bodies as every route reads them: decompressed, then parsed with a message that names the problem.

FastAPI answers a body it cannot parse with "There was an error parsing the body" (invalid UTF-8, deep nesting,
a gzip body) or "JSON decode error" at a bare character offset. Routes built with `BodyRoute` read the body
through `ClearBodyRequest` instead: a gzip or deflate body is decompressed (its decompressed size is held to
--max-body-bytes too: a small bomb cannot expand), another Content-Encoding is a 415, and the JSON is parsed by
orjson (fast on large batches) with stdlib json as the fallback for what JSON allows and orjson refuses (lone
surrogate escapes, which the request schemas then name by field; integers past 64 bits). Every failure is a 400
saying where the body went wrong.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

DECOMPRESSORS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""Content-Encoding -> zlib's wbits for it (HTTP's "deflate" is zlib-wrapped)."""


class ClearBodyRequest(Request):
    async def body(self) -> bytes:
        if not hasattr(self, "_decoded_body"):
            self._decoded_body = _decompressed(await super().body(), self.headers.get("content-encoding", ""),
                                               self.app.state.settings.max_body_bytes)
        return self._decoded_body

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json(await self.body())
        return self._json


class BodyRoute(APIRoute):
    """An APIRoute whose handler reads the body through ClearBodyRequest (FastAPI's custom-route hook)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def clear_body_handler(request: Request) -> Response:
            return await handler(ClearBodyRequest(request.scope, request.receive))

        return clear_body_handler


def parse_json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as fast_error:
        try:
            return json.loads(body)
        except UnicodeDecodeError as error:
            raise _bad_body(f"the body is not valid UTF-8 (byte {error.start})") from None
        except RecursionError:
            raise _bad_body("the JSON body is nested too deeply") from None
        except ValueError:  # orjson's message says what was expected, stdlib's often does not
            problem = "the body is empty" if not body.strip() else f"{fast_error.msg} at line {fast_error.lineno} " \
                      f"column {fast_error.colno}"
            raise _bad_body(f"the body is not valid JSON: {problem}") from None


def _decompressed(body: bytes, encoding: str, limit: int) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in DECOMPRESSORS:
        raise HTTPException(415, f"Content-Encoding {encoding!r} is not supported: send the body as gzip, deflate "
                                 "or uncompressed")
    decompressor = zlib.decompressobj(DECOMPRESSORS[encoding])
    try:
        data = decompressor.decompress(body, limit + 1)
    except zlib.error as error:
        raise _bad_body(f"the body is not valid {encoding} data ({error})") from None
    if len(data) > limit:
        raise HTTPException(413, f"the decompressed request body is above the limit of {limit} bytes")
    if not decompressor.eof:
        raise _bad_body(f"the {encoding} body is truncated")
    return data


def _bad_body(message: str) -> HTTPException:
    return HTTPException(400, f"invalid request: {message}")
