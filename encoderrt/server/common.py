"""What every dialect's route does the same way: pick the model, check sizes, run, time the reply."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
from fastapi import Request
from starlette.responses import Response

from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.requests import Completion, Truncation
from encoderrt.server.errors import PayloadTooLarge
from encoderrt.server.registry import ModelRegistry, ServedModel
from encoderrt.server.responses import RawJSONResponse
from encoderrt.server.schemas import NonEmpty
from encoderrt.server.settings import ServerSettings


def models(request: Request) -> ModelRegistry:
    return request.app.state.models


def settings(request: Request) -> ServerSettings:
    return request.app.state.settings


def resolve(request: Request, name: str | None, verb: str) -> ServedModel:
    return models(request).resolve(name, verb)


def check_items(request: Request, items: Sequence[Any], field: str) -> None:
    check_item_count(len(items), field, settings(request).max_client_batch_size)


def check_item_count(count: int, field: str, limit: int) -> None:
    """Empty inputs are a client error; more items than --max-client-batch-size (`limit`) is 413."""
    if count == 0:
        raise InvalidRequest(f"{field} must not be empty")
    if count > limit:
        raise PayloadTooLarge(f"{field} has {count} items, above this server's limit of {limit} "
                              "(--max-client-batch-size)")


TextOrTokenInput = str | NonEmpty[str] | NonEmpty[int] | NonEmpty[list[int]]
"""OpenAI's `input`: a text, texts, one token-id list or several."""


def texts_or_token_ids(request: Request, value: TextOrTokenInput, field: str) -> tuple[list[str], list[list[int]] | None]:
    """OpenAI's input forms as (texts, None) or ([], token ids), with the item count checked."""
    items = [value] if isinstance(value, str) else value
    check_items(request, items, field)
    if isinstance(items[0], int):
        return [], [items]  # type: ignore[list-item]
    if isinstance(items[0], list):
        return [], items  # type: ignore[return-value]
    return items, None  # type: ignore[return-value]


def truncation(truncate_prompt_tokens: int | None) -> Truncation:
    """vLLM's truncate_prompt_tokens: unset or -1 means the model's limit, k cuts at k tokens."""
    if truncate_prompt_tokens is None or truncate_prompt_tokens == -1:
        return True
    if truncate_prompt_tokens < 1:
        raise InvalidRequest(f"truncate_prompt_tokens must be -1 or a positive number of tokens, got {truncate_prompt_tokens}")
    return truncate_prompt_tokens


def one_of(body: Any, name: str, alias: str) -> Any:
    """A field a dialect also takes under another name (Jina's `task` for `prompt_name`): either, or both alike."""
    value, other = getattr(body, name), getattr(body, alias)
    if value is not None and other is not None and value != other:
        raise InvalidRequest(f"{name} {value!r} and {alias} {other!r} disagree; give one")
    return value if value is not None else other


def float32_base64(vector: np.ndarray) -> str:
    """A vector as its little-endian float32 bytes in base64, as OpenAI and Cohere send it."""
    return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")


def sparse_values(pairs: list[tuple[int, float]]) -> list[dict[str, float]]:
    """Sparse weights in TEI's shape: {"index": token id, "value": weight}, as the pairs are ordered."""
    return [{"index": index, "value": value} for index, value in pairs]


def encoded(vector: np.ndarray, encoding_format: str, embed_dtype: str = "float32") -> np.ndarray | str:
    """OpenAI's encoding_format: the floats, or "base64" (little-endian float32, or float16 where vLLM's embed_dtype
    asks for half the bytes)."""
    if encoding_format != "base64":
        return vector
    if embed_dtype == "float16":
        return base64.b64encode(vector.astype("<f2").tobytes()).decode("ascii")
    return float32_base64(vector)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def reply(body: Any, completion: Completion, started: float) -> Response:
    """A JSON reply with TEI's timing headers (milliseconds)."""
    timings = completion.timings
    total = time.perf_counter() - started
    return RawJSONResponse(body, [
        (b"x-compute-tokens", b"%d" % completion.prompt_tokens),
        (b"x-compute-time", b"%.0f" % ((timings.queue + timings.inference) * 1000)),
        (b"x-total-time", b"%.0f" % (total * 1000)),
        (b"x-tokenization-time", b"%.0f" % (timings.tokenize * 1000)),
        (b"x-queue-time", b"%.0f" % (timings.queue * 1000)),
        (b"x-inference-time", b"%.0f" % (timings.inference * 1000)),
    ])
