"""OpenAI embeddings dialect: POST /v1/embeddings, GET /v1/models."""

from __future__ import annotations

import time
from typing import Literal

from fastapi import APIRouter, Request
from pydantic import Field
from starlette.responses import Response

from encoderrt.runtime.tasks import EmbedRequest
from encoderrt.server import common
from encoderrt.server.bodies import BodyRoute
from encoderrt.server.responses import JSONResponse
from encoderrt.server.schemas import RequestBody

router = APIRouter(tags=["OpenAI"], route_class=BodyRoute)


class EmbeddingsBody(RequestBody):
    input: common.TextOrTokenInput = Field(description="text, texts, token ids or lists of token ids")
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = Field(default=None, description="accepted for compatibility; not used")
    truncate_prompt_tokens: int | None = Field(default=None, description="vLLM extension: -1 or unset cuts at the model's limit")
    prompt_name: str | None = Field(default=None, description="encoderrt extension: one of the model's prompts "
                                    "(sentence-transformers' prompt_name); unset: its default prompt")
    task: str | None = Field(default=None, description="Jina's API (OpenAI clients: extra_body): the task, "
                             "jina-embeddings-v3's `retrieval.query`, `retrieval.passage`, ...; prompt_name by Jina's name")


@router.post("/v1/embeddings")
async def create_embeddings(body: EmbeddingsBody, request: Request) -> Response:
    started = time.perf_counter()
    served = common.resolve(request, body.model, "embed")
    texts, token_ids = common.texts_or_token_ids(request, body.input, "input")
    engine_request = EmbedRequest(texts, dimensions=body.dimensions, truncate=common.truncation(body.truncate_prompt_tokens),
                                  token_ids=token_ids, prompt_name=common.one_of(body, "prompt_name", "task"))
    completion = await served.engine.arun(engine_request)
    data = [
        {"object": "embedding", "index": i, "embedding": common.encoded(vector, body.encoding_format)}
        for i, vector in enumerate(completion.value)
    ]
    usage = {"prompt_tokens": completion.prompt_tokens, "total_tokens": completion.prompt_tokens}
    return common.reply({"object": "list", "data": data, "model": served.name, "usage": usage}, completion, started)


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    data = [
        {
            "id": served.name,
            "object": "model",
            "created": 0,
            "owned_by": "encoderrt",
            "task": served.engine.info.task,
            "max_model_len": served.engine.info.max_length,
        }
        for served in common.models(request).models()
    ]
    return JSONResponse({"object": "list", "data": data})
