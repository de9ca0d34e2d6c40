"""What huggingface_hub's `InferenceClient(base_url=<server>)` sends to a TEI server.

The client posts every task to the base URL itself, so `POST /` dispatches as TEI's compatibility
route does, by the body: `{"inputs": {"source_sentence", "sentences"}}` is sentence similarity,
`{"inputs", "parameters"}` is text classification, anything else feature extraction. TEI's
`/similarity`, `/decode` and `/info` complete the set.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.responses import Response

from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.postprocess import ACTIVATIONS
from encoderrt.runtime.requests import as_texts
from encoderrt.runtime.tasks import ClassifyRequest, ScoreRequest, check_count
from encoderrt.server import common, tei
from encoderrt.server.bodies import BodyRoute
from encoderrt.server.responses import JSONResponse
from encoderrt.server.schemas import AutoTruncate, NonEmpty, RequestBody

router = APIRouter(tags=["TEI (huggingface_hub)"], route_class=BodyRoute)


class SimilarityInputs(RequestBody):
    source_sentence: str
    sentences: NonEmpty[str]


class SimilarityBody(RequestBody):
    inputs: SimilarityInputs
    truncate: AutoTruncate = True


class ClassificationParameters(RequestBody):
    function_to_apply: Literal["sigmoid", "softmax", "none"] | None = None
    top_k: int | None = None


class ClassificationBody(RequestBody):
    inputs: str | NonEmpty[str]
    parameters: ClassificationParameters = ClassificationParameters()
    truncate: AutoTruncate = True


class DecodeBody(RequestBody):
    ids: list[int] | list[list[int]]
    skip_special_tokens: bool = True


@router.post("/similarity")
async def similarity(body: SimilarityBody, request: Request) -> Response:
    """The similarity of the source sentence with each sentence, by the embedding model: cosine, as TEI answers,
    unless the model's folder names another (sentence-transformers' model.similarity)."""
    started = time.perf_counter()
    served = common.resolve(request, None, "embed")
    common.check_items(request, body.inputs.sentences, "sentences")
    completion = await served.engine.arun(ScoreRequest(body.inputs.source_sentence, body.inputs.sentences, body.truncate))
    return common.reply(completion.value, completion, started)


async def _classify(body: ClassificationBody, request: Request) -> Response:
    started = time.perf_counter()
    served = common.resolve(request, None, "classify")
    texts = as_texts(body.inputs, "inputs")
    common.check_items(request, texts, "inputs")
    top_k = body.parameters.top_k
    check_count("top_k", top_k)
    completion = await served.engine.arun(ClassifyRequest(texts, body.truncate))
    function = body.parameters.function_to_apply
    labels = served.engine.info.labels
    results = []
    for result in completion.value:
        logits = np.asarray(result.logits)
        scores = result.probs if function is None else ACTIVATIONS["identity" if function == "none" else function](logits).tolist()
        ranked = sorted(zip(scores, labels), key=lambda item: -item[0])[:top_k]
        results.append([{"label": label, "score": score} for score, label in ranked])
    return common.reply(results, completion, started)


@router.post("/")
async def compatible(body: dict[str, Any], request: Request) -> Response:
    """TEI's route for clients that post every task to the server's root."""
    inputs = body.get("inputs")
    try:
        if isinstance(inputs, dict):
            return await similarity(SimilarityBody.model_validate(body), request)
        if "parameters" in body:
            return await _classify(ClassificationBody.model_validate(body), request)
        return await tei.embed(tei.EmbedBody.model_validate(body), request)  # feature extraction is TEI's /embed
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise InvalidRequest(f"{where}: {first['msg']}") from None


@router.post("/decode")
async def decode(body: DecodeBody, request: Request) -> Response:
    served = common.resolve(request, None, "tokenize")
    batch = [body.ids] if body.ids and isinstance(body.ids[0], int) else body.ids
    # off the event loop: a long id list takes the tokenizer a while, and every other route waits on the loop
    return JSONResponse(await asyncio.to_thread(served.engine.decode, batch, body.skip_special_tokens))


@router.get("/info")
async def info(request: Request) -> Response:
    """TEI's model description, for the one model a TEI server holds (the first served here)."""
    return JSONResponse(tei.describe(common.models(request), common.settings(request)))
