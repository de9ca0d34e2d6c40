"""vLLM dialect: POST /score and /v1/score, /classify, /tokenize."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from encoderrt.runtime.requests import ClassifyRequest, ScoreRequest, as_texts, pair_texts
from encoderrt.server import common
from encoderrt.server.responses import JSONResponse

router = APIRouter(tags=["vLLM"])


class ScoreBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    text_1: str | list[str]
    text_2: str | list[str]
    truncate_prompt_tokens: int | None = None


class ClassifyBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    input: str | list[str]
    truncate_prompt_tokens: int | None = None


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str


def _usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}


@router.post("/score")
@router.post("/v1/score")
async def score(body: ScoreBody, request: Request) -> Response:
    started = time.perf_counter()
    served = common.resolve(request, body.model, "score")
    firsts, _ = pair_texts(body.text_1, body.text_2)
    common.check_items(request, firsts, "text_2" if isinstance(body.text_1, str) else "text_1")
    completion = await served.engine.arun(ScoreRequest(body.text_1, body.text_2, common.truncation(body.truncate_prompt_tokens)))
    data = [{"index": i, "object": "score", "score": value} for i, value in enumerate(completion.value)]
    payload = {"id": common.new_id("score"), "object": "list", "created": int(time.time()), "model": served.name,
               "data": data, "usage": _usage(completion.prompt_tokens)}
    return common.reply(payload, completion, started)


@router.post("/classify")
async def classify(body: ClassifyBody, request: Request) -> Response:
    started = time.perf_counter()
    served = common.resolve(request, body.model, "classify")
    texts = as_texts(body.input, "input")
    common.check_items(request, texts, "input")
    completion = await served.engine.arun(ClassifyRequest(texts, common.truncation(body.truncate_prompt_tokens)))
    data = [{"index": i, "label": c.label, "probs": c.probs, "num_classes": len(c.probs)} for i, c in enumerate(completion.value)]
    payload = {"id": common.new_id("classify"), "object": "list", "created": int(time.time()), "model": served.name,
               "data": data, "usage": _usage(completion.prompt_tokens)}
    return common.reply(payload, completion, started)


@router.post("/tokenize")
async def tokenize(body: TokenizeBody, request: Request) -> Response:
    served = common.resolve(request, body.model, "tokenize")
    tokens = served.engine.tokenize(body.prompt, truncate=False)
    return JSONResponse({"count": len(tokens), "max_model_len": served.engine.info.max_length, "tokens": tokens})
