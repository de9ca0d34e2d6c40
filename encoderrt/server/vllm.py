"""vLLM dialect: POST /score and /v1/score, /classify, /pooling, /tokenize."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import ConfigDict
from starlette.responses import Response

from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.requests import as_texts
from encoderrt.runtime.tasks import (
    ClassifyRequest,
    EmbedRequest,
    HybridEmbedding,
    HybridEmbedRequest,
    MultiVectorRequest,
    ScoreRequest,
    pair_texts,
)
from encoderrt.server import common
from encoderrt.server.bodies import BodyRoute
from encoderrt.server.responses import JSONResponse
from encoderrt.server.schemas import HybridWeights, NonEmpty, RequestBody, requires_one_of

router = APIRouter(tags=["vLLM"], route_class=BodyRoute)


Texts = str | list[str] | None
_PAIRINGS = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))
"""The (first, second) field names vLLM's score endpoint accepts, each pairing 1:1, 1:N or N:N."""


class ScoreBody(RequestBody):
    model_config = ConfigDict(json_schema_extra=requires_one_of(*_PAIRINGS))

    model: str | None = None
    text_1: Texts = None
    text_2: Texts = None
    queries: Texts = None
    documents: Texts = None
    items: Texts = None
    data_1: Texts = None
    data_2: Texts = None
    truncate_prompt_tokens: int | None = None
    use_activation: bool | None = None
    """vLLM's switch for the model's score activation; false gives raw logits."""
    prompt_name: str | None = None
    """encoderrt extension: one of the cross-encoder's prompts (CrossEncoder.predict's prompt_name)."""
    prompt: str | None = None
    """encoderrt extension: a prompt given verbatim, a chat-template reranker's instruction (Qwen3-Reranker's)."""
    hybrid_weights: HybridWeights = None

    def pairing(self) -> tuple[str, str]:
        """The one pair of fields this body uses."""
        given = [pair for pair in _PAIRINGS if getattr(self, pair[0]) is not None and getattr(self, pair[1]) is not None]
        if len(given) != 1:
            shapes = ", ".join(f"{a} + {b}" for a, b in _PAIRINGS)
            found = ", ".join(f"{a} + {b}" for a, b in given) or "none"
            raise InvalidRequest(f"a score request gives exactly one of {shapes}; this one gives {found}")
        return given[0]


class ClassifyBody(RequestBody):
    model: str | None = None
    input: str | NonEmpty[str]
    truncate_prompt_tokens: int | None = None


class PoolingBody(RequestBody):
    model_config = ConfigDict(json_schema_extra=requires_one_of(("input",)))

    model: str | None = None
    input: common.TextOrTokenInput | None = None
    messages: list[Any] | None = None
    task: str | None = None
    """embed (an embedding model's vector), classify (a classifier's or cross-encoder's probabilities) or token_embed
    (a multi-vector model's vector per scored token, a hybrid model's colbert vectors); unset: the model's own. Other
    models' token-level tasks need per-token outputs, which their artifacts pool away inside the graph."""
    outputs: list[Literal["dense", "sparse", "colbert"]] | None = None
    """encoderrt extension for a hybrid (bge-m3) model: any of its three representations, all from one run of each
    text. Each item's data is then an object with those keys: dense a vector, sparse TEI's [{"index": token id,
    "value": weight}], colbert a [tokens, dim] array (base64 of it with encoding_format base64)."""
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    truncate_prompt_tokens: int | None = None
    use_activation: bool | None = None
    """embed: L2 normalisation (unset: the model's default); classify: the activation (false: raw logits)."""
    embed_dtype: Literal["float32", "float16"] = "float32"
    """vLLM's: the floats' type in base64 (float16: half the bytes, for a multi-vector model's many vectors)."""
    side: Literal["query", "document"] | None = None
    """token_embed of a multi-vector (ColBERT) model: the query side's rules (its prompt, its expansion) or the
    document side's (the default: its prompt, punctuation dropped). An encoderrt extension; base64 is the
    [tokens, dim] array row by row, in embed_dtype."""
    pool_factor: float | None = None
    """token_embed of a multi-vector model's documents: about 1 / pool_factor of each one's vectors, clustered and
    averaged (PyLate's pool_factor), in place of the model's own pooling; 1 keeps them all. An encoderrt extension."""


class TokenizeBody(RequestBody):
    model: str | None = None
    prompt: str


def _usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}


@router.post("/score")
@router.post("/v1/score")
async def score(body: ScoreBody, request: Request) -> Response:
    started = time.perf_counter()
    served = common.resolve(request, body.model, "score")
    first_field, second_field = body.pairing()
    first, second = getattr(body, first_field), getattr(body, second_field)
    firsts, _ = pair_texts(first, second)
    common.check_items(request, firsts, second_field if isinstance(first, str) else first_field)
    completion = await served.engine.arun(ScoreRequest(first, second, common.truncation(body.truncate_prompt_tokens),
                                                       activation=body.use_activation is not False,
                                                       prompt_name=body.prompt_name, prompt=body.prompt,
                                                       hybrid_weights=body.hybrid_weights))
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


@router.post("/pooling")
async def pooling(body: PoolingBody, request: Request) -> Response:
    started = time.perf_counter()
    if body.messages is not None or body.input is None:
        raise InvalidRequest("pooling takes `input` (text, texts or token ids); chat `messages` are for decoder models")
    served = common.resolve(request, body.model, "pooling")
    if body.outputs is not None:
        return await _hybrid_pooling(body, request, served, started)
    model_task = served.engine.info.task
    native = {"embed": "embed", "hybrid": "embed", "multi_vector": "token_embed"}.get(model_task, "classify")
    task = body.task or native
    if task != native and not (model_task == "hybrid" and task == "token_embed"):
        hint = "per-token outputs are pooled away inside encoderrt's artifacts; " if task.startswith("token_") else ""
        raise InvalidRequest(f"task '{task}' is not available for model '{served.name}' ({hint}it pools with task '{native}')")
    given = [name for name in ("side", "pool_factor") if getattr(body, name) is not None]
    if given and task != "token_embed":
        raise InvalidRequest(f"{' and '.join(given)} appl{'y' if len(given) > 1 else 'ies'} to task 'token_embed' of a "
                             "multi-vector model")
    if body.use_activation is not None and task == "token_embed":
        raise InvalidRequest("use_activation applies to task 'embed' (normalisation) and 'classify' (the activation); "
                             "task 'token_embed' returns the model's own vectors")
    texts, token_ids = common.texts_or_token_ids(request, body.input, "input")
    truncate = common.truncation(body.truncate_prompt_tokens)
    if task == "embed":
        completion = await served.engine.arun(EmbedRequest(texts, body.use_activation, body.dimensions, truncate,
                                                           token_ids=token_ids))
        rows = [common.encoded(vector, body.encoding_format, body.embed_dtype) for vector in completion.value]
    elif task == "token_embed":
        if token_ids is not None:
            raise InvalidRequest("task 'token_embed' takes texts")
        completion = await served.engine.arun(MultiVectorRequest(texts, body.side or "document", truncate,
                                                                 pool_factor=body.pool_factor,
                                                                 dimensions=body.dimensions))
        rows = [common.encoded(vectors, body.encoding_format, body.embed_dtype) for vectors in completion.value]
    else:
        if token_ids is not None or body.dimensions is not None:
            raise InvalidRequest("task 'classify' takes texts, without dimensions")
        completion = await served.engine.arun(ClassifyRequest(texts, truncate))
        rows = [c.probs if body.use_activation is not False else c.logits for c in completion.value]
    return _pooled(rows, completion, served.name, started)


def _pooled(rows: list[Any], completion: Any, name: str, started: float) -> Response:
    data = [{"index": i, "object": "pooling", "data": row} for i, row in enumerate(rows)]
    payload = {"id": common.new_id("pool"), "object": "list", "created": int(time.time()), "model": name,
               "data": data, "usage": _usage(completion.prompt_tokens)}
    return common.reply(payload, completion, started)


async def _hybrid_pooling(body: PoolingBody, request: Request, served: Any, started: float) -> Response:
    """A hybrid model's representations that `outputs` names, each item's as an object."""
    if served.engine.info.task != "hybrid":
        raise InvalidRequest(f"outputs apply to a hybrid (bge-m3) model; '{served.name}' serves "
                             f"{served.engine.info.task}")
    if (body.task not in (None, "embed") or body.side is not None or body.dimensions is not None
            or body.use_activation is not None):
        raise InvalidRequest("outputs take texts, without task, side, dimensions or use_activation")
    texts, token_ids = common.texts_or_token_ids(request, body.input, "input")
    if token_ids is not None:
        raise InvalidRequest("outputs take texts, not token ids")
    completion = await served.engine.arun(HybridEmbedRequest(texts, body.outputs, common.truncation(body.truncate_prompt_tokens)))

    def item(embedding: HybridEmbedding) -> dict[str, Any]:
        values: dict[str, Any] = {}
        if embedding.dense is not None:
            values["dense"] = common.encoded(embedding.dense, body.encoding_format, body.embed_dtype)
        if embedding.sparse is not None:
            values["sparse"] = common.sparse_values(embedding.sparse)
        if embedding.colbert is not None:
            values["colbert"] = common.encoded(embedding.colbert, body.encoding_format, body.embed_dtype)
        return values

    return _pooled([item(embedding) for embedding in completion.value], completion, served.name, started)


@router.post("/tokenize")
async def tokenize(body: TokenizeBody, request: Request) -> Response:
    served = common.resolve(request, body.model, "tokenize")
    # off the event loop: a megabyte prompt takes the tokenizer seconds, and every other route waits on the loop
    tokens = await asyncio.to_thread(served.engine.tokenize, body.prompt, None, False)
    return JSONResponse({"count": len(tokens), "max_model_len": served.engine.info.max_length, "tokens": tokens})
