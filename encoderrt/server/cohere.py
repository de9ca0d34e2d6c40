"""Cohere embed dialect: POST /v1/embed and /v2/embed, as the cohere SDK's Client and ClientV2 send them.

`input_type` picks the model's prompt of that role where the folder defines one (e5's "query" for
search_query, "passage" for search_document), else the model's default prompt. `embedding_types`
returns several encodings of one run: float, base64 (float32 bytes), and the quantised int8, uint8,
binary and ubinary of runtime/quantization.py. Cohere's rerank is in rerank.py.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Request
from pydantic import ConfigDict
from starlette.responses import Response

from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.requests import NoLongerThan, Truncation
from encoderrt.runtime.tasks import EmbedRequest
from encoderrt.server import common
from encoderrt.server.bodies import BodyRoute
from encoderrt.server.registry import ServedModel
from encoderrt.server.schemas import NonEmpty, RequestBody, requires_one_of

router = APIRouter(tags=["Cohere"], route_class=BodyRoute)

INPUT_TYPE_PROMPTS: dict[str, tuple[str, ...]] = {
    "search_query": ("search_query", "query", "retrieval.query"),
    "search_document": ("search_document", "passage", "document", "corpus", "retrieval.passage"),
    "classification": ("classification",),
    "clustering": ("clustering", "separation"),
}
"""Prompt names a folder may use for each of Cohere's input types (jina-v3's task names last): the first with a
prompt or a task adapter wins (sentence-transformers adds an empty "document" prompt to folders that name theirs
"passage")."""
EMBEDDING_TYPES = ("float", "base64", "int8", "uint8", "binary", "ubinary")


class CohereEmbedBody(RequestBody):
    model_config = ConfigDict(json_schema_extra=requires_one_of(("texts",), ("inputs",)))

    model: str | None = None
    texts: NonEmpty[str] | None = None
    inputs: NonEmpty[dict[str, Any]] | None = None
    """v2: [{"content": [{"type": "text", "text": ...}]}]; only text content is embedded here."""
    images: list[str] | None = None
    input_type: str | None = None
    embedding_types: list[str] | None = None
    truncate: Literal["NONE", "START", "END"] | None = None
    max_tokens: int | None = None
    output_dimension: int | None = None


def _texts(body: CohereEmbedBody) -> list[str]:
    if body.images or body.input_type == "image":
        raise InvalidRequest("images are not supported: encoderrt serves text encoders; send texts")
    if (body.texts is None) == (body.inputs is None):
        raise InvalidRequest("give texts or inputs (one of them)")
    if body.texts is not None:
        return body.texts
    texts = []
    for index, item in enumerate(body.inputs or ()):
        parts = item.get("content")
        if not isinstance(parts, list) or not parts:
            raise InvalidRequest(f"inputs[{index}].content must be a non-empty list of content parts")
        if any(not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str) for p in parts):
            raise InvalidRequest(f"inputs[{index}].content: only {{'type': 'text', 'text': ...}} parts are supported")
        texts.append("\n".join(p["text"] for p in parts))
    return texts


def _prompt_name(served: ServedModel, input_type: str | None) -> str | None:
    if input_type is None:
        return None
    if input_type not in INPUT_TYPE_PROMPTS:
        raise InvalidRequest(f"unknown input_type '{input_type}'; expected one of {', '.join([*INPUT_TYPE_PROMPTS, 'image'])}")
    prompts, adapters = served.engine.manifest.prompts, served.engine.manifest.adapters
    found = [name for name in INPUT_TYPE_PROMPTS[input_type] if name in prompts or name in adapters]
    return next((name for name in found if prompts.get(name) or name in adapters), found[0] if found else None)


def _truncation(body: CohereEmbedBody, max_length: int) -> tuple[Truncation, Literal["right", "left"]]:
    """NONE: a text over max_tokens (or the model's limit) is an error; START / END cut that end there;
    unset: the server's policy for long inputs (cut the end, or chunk with --long-inputs chunk)."""
    if body.max_tokens is not None and body.max_tokens < 1:
        raise InvalidRequest(f"max_tokens must be a positive number of tokens, got {body.max_tokens}")
    if body.truncate == "NONE":
        return (NoLongerThan(body.max_tokens) if body.max_tokens and body.max_tokens < max_length else False), "right"
    length: Truncation = min(body.max_tokens, max_length) if body.max_tokens else (max_length if body.truncate else True)
    return length, "left" if body.truncate == "START" else "right"


async def _encodings(served: ServedModel, vectors: np.ndarray, types: list[str], dimensions: int | None) -> dict[str, Any]:
    unknown = [t for t in types if t not in EMBEDDING_TYPES]
    if unknown or not types:
        raise InvalidRequest(f"embedding_types must list some of {', '.join(EMBEDDING_TYPES)}; got {types}")
    out: dict[str, Any] = {}
    for kind in dict.fromkeys(types):
        if kind == "float":
            out[kind] = vectors
        elif kind == "base64":
            out[kind] = [common.float32_base64(v) for v in vectors]
        else:  # int8 / uint8 calibrate the model once (a short embed), so off the event loop
            out[kind] = await asyncio.to_thread(served.engine.quantizer.quantize, vectors, kind, None, dimensions)
    return out


async def _embed(body: CohereEmbedBody, request: Request, version: str) -> Response:
    started = time.perf_counter()
    served = common.resolve(request, body.model, "embed")
    texts = _texts(body)
    common.check_items(request, texts, "texts")
    truncate, side = _truncation(body, served.engine.info.max_length)
    completion = await served.engine.arun(EmbedRequest(texts, None, body.output_dimension, truncate,
                                                       prompt_name=_prompt_name(served, body.input_type),
                                                       truncation_side=side))
    meta = {"api_version": {"version": version}, "billed_units": {"input_tokens": completion.prompt_tokens}}
    payload: dict[str, Any] = {"id": common.new_id("embed"), "texts": texts, "meta": meta}
    types = body.embedding_types if body.embedding_types is not None else (["float"] if version == "2" else None)
    if types is None:  # v1 without embedding_types: the plain float response
        payload.update(response_type="embeddings_floats", embeddings=completion.value)
    else:
        payload.update(response_type="embeddings_by_type",
                       embeddings=await _encodings(served, completion.value, types, body.output_dimension))
    return common.reply(payload, completion, started)


@router.post("/v1/embed")
async def embed_v1(body: CohereEmbedBody, request: Request) -> Response:
    return await _embed(body, request, "1")


@router.post("/v2/embed")
async def embed_v2(body: CohereEmbedBody, request: Request) -> Response:
    return await _embed(body, request, "2")
