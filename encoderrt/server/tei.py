"""Hugging Face text-embeddings-inference dialect: POST /embed, /predict, and /rerank's TEI body.

What a TEI request means beyond its fields (which request an /embed_all runs, how /predict reads its inputs and
orders its labels, what /info says) is decided here once, for the HTTP routes and TEI's gRPC API (tei_grpc.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

from fastapi import APIRouter, Request
from starlette.responses import Response

from encoderrt import __version__
from encoderrt.runtime import tasks
from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.requests import Completion, as_texts
from encoderrt.runtime.tasks import (
    ClassifyRequest,
    EmbedRequest,
    MultiVectorRequest,
    RerankRequest,
    ScoreRequest,
    SparseEmbedRequest,
    TokenEmbedRequest,
)
from encoderrt.server import common
from encoderrt.server.bodies import BodyRoute
from encoderrt.server.registry import ModelRegistry, ServedModel
from encoderrt.server.schemas import AutoTruncate, HybridWeights, NonEmpty, RequestBody
from encoderrt.server.settings import ServerSettings

router = APIRouter(tags=["TEI"], route_class=BodyRoute)


class EmbedBody(RequestBody):
    model: str | None = None
    """Which served model answers; TEI serves one, so it is optional here."""
    inputs: str | NonEmpty[str]
    normalize: bool = True
    truncate: AutoTruncate = True
    dimensions: int | None = None
    prompt_name: str | None = None
    """One of the model's prompts, as TEI takes it; unset: the model's default prompt."""
    truncation_direction: Literal["Right", "Left"] = "Right"
    """Which end `truncate` cuts; Left keeps a text's end."""


class EmbedAllBody(RequestBody):
    model: str | None = None
    """Which served model answers; TEI serves one, so it is optional here."""
    inputs: str | NonEmpty[str]
    truncate: AutoTruncate = True
    prompt_name: str | None = None
    truncation_direction: Literal["Right", "Left"] = "Right"


class EmbedSparseBody(RequestBody):
    model: str | None = None
    """Which served model answers; TEI serves one, so it is optional here."""
    inputs: str | NonEmpty[str]
    truncate: AutoTruncate = True
    prompt_name: str | None = None
    """One of the model's prompts, as TEI takes it; unset: the side's prompt (below), else the model's default."""
    truncation_direction: Literal["Right", "Left"] = "Right"
    """Which end `truncate` cuts; Left keeps a text's end."""
    top_k: int | None = None
    """encoderrt extension: only the k heaviest tokens of each vector (unset: the model's max_active_dims, or all)."""
    side: Literal["query", "document"] | None = None
    """encoderrt extension: embed as encode_query / encode_document do (the side's prompt; an inference-free model's
    queries from its token weights, documents through the model); unset, as encode (the model's default side)."""


class PredictBody(RequestBody):
    model: str | None = None
    """Which served model answers; TEI serves one, so it is optional here."""
    inputs: str | NonEmpty[str] | NonEmpty[list[str]]
    raw_scores: bool = False
    truncate: AutoTruncate = True


class TEIRerankBody(RequestBody):
    model: str | None = None
    """Which served model answers; TEI serves one, so it is optional here."""
    query: str
    texts: NonEmpty[str]
    raw_scores: bool = False
    return_text: bool = False
    truncate: AutoTruncate = True
    prompt_name: str | None = None
    """encoderrt extension: one of the reranker's prompts (CrossEncoder.predict's prompt_name)."""
    prompt: str | None = None
    """encoderrt extension: a prompt given verbatim, a chat-template reranker's instruction (Qwen3-Reranker's)."""
    hybrid_weights: HybridWeights = None


@router.post("/embed")
async def embed(body: EmbedBody, request: Request) -> Response:
    started = time.perf_counter()
    served = common.resolve(request, body.model, "embed")
    texts = as_texts(body.inputs, "inputs")
    common.check_items(request, texts, "inputs")
    completion = await served.engine.arun(EmbedRequest(texts, body.normalize, body.dimensions, body.truncate,
                                                       prompt_name=body.prompt_name,
                                                       truncation_side=body.truncation_direction.lower()))
    return common.reply(completion.value, completion, started)


@router.post("/embed_all")
async def embed_all(body: EmbedAllBody, request: Request) -> Response:
    """TEI's token embeddings: per input, every token's final hidden state (special and prompt tokens included),
    unpooled and unnormalised; a multi-vector (ColBERT) model's vectors, as a document's (its prompt, its skip-list);
    past the engine's max_token_embeddings a 413."""
    started = time.perf_counter()
    served = common.resolve(request, body.model, "embed_all")
    texts = as_texts(body.inputs, "inputs")
    common.check_items(request, texts, "inputs")
    completion = await served.engine.arun(embed_all_request(served, texts, body.truncate, body.prompt_name,
                                                            body.truncation_direction.lower()))
    return common.reply([states.tolist() for states in completion.value], completion, started)


def embed_all_request(served: ServedModel, texts: list[str], truncate: bool, prompt_name: str | None,
                      side: str) -> tasks.Request:
    """Every token's state; a multi-vector model's vectors, as a document's."""
    if served.engine.info.task != "multi_vector":
        return TokenEmbedRequest(texts, truncate, prompt_name, truncation_side=side)
    if side != "right":
        raise InvalidRequest("a multi-vector model cuts documents at their end: truncation_direction must be Right")
    return MultiVectorRequest(texts, "document", truncate, prompt_name)


@router.post("/embed_sparse")
async def embed_sparse(body: EmbedSparseBody, request: Request) -> Response:
    """TEI's sparse embeddings: per input, {"index": token id, "value": weight} for every weight above zero."""
    started = time.perf_counter()
    served = common.resolve(request, body.model, "embed_sparse")
    texts = as_texts(body.inputs, "inputs")
    common.check_items(request, texts, "inputs")
    completion = await served.engine.arun(SparseEmbedRequest(texts, body.top_k, body.truncate, body.side,
                                                             prompt_name=body.prompt_name,
                                                             truncation_side=body.truncation_direction.lower()))
    vectors = [common.sparse_values(row) for row in completion.value]
    return common.reply(vectors, completion, started)


def _predict_inputs(inputs: str | list[str] | list[list[str]]) -> tuple[list[tuple[str, ...]], bool]:
    """TEI's rules: a string, or [text, pair], is one input; a list of [text] / [text, pair] is a batch."""
    if isinstance(inputs, str):
        return [(inputs,)], False
    if len(inputs) == 2 and all(isinstance(x, str) for x in inputs):
        return [(inputs[0], inputs[1])], False
    batch = []
    for index, item in enumerate(inputs):
        sequence = (item,) if isinstance(item, str) else tuple(item)
        if len(sequence) not in (1, 2):
            raise InvalidRequest(f"inputs[{index}] must be a text or a [text, text_pair] pair")
        batch.append(sequence)
    return batch, True


@router.post("/predict")
async def predict(body: PredictBody, request: Request) -> Response:
    started = time.perf_counter()
    served = common.resolve(request, body.model, "classify")
    sequences, batched = _predict_inputs(body.inputs)
    common.check_items(request, sequences, "inputs")
    completion = await served.engine.arun(predict_request(sequences, body.truncate, body.raw_scores))
    predictions = [[{"score": score, "label": label} for score, label in ranked]
                   for ranked in ranked_labels(served, completion, body.raw_scores)]
    return common.reply(predictions if batched else predictions[0], completion, started)


def predict_request(sequences: Sequence[tuple[str, ...]], truncate: bool, raw_scores: bool) -> tasks.Request:
    """Texts are classified, [text, text_pair] pairs scored; one kind per request."""
    pairs = [s for s in sequences if len(s) == 2]
    if pairs and len(pairs) != len(sequences):
        raise InvalidRequest("inputs mix single texts and pairs; send one kind per request")
    if pairs:
        return ScoreRequest([p[0] for p in pairs], [p[1] for p in pairs], truncate, activation=not raw_scores)
    return ClassifyRequest([s[0] for s in sequences], truncate)


def ranked_labels(served: ServedModel, completion: Completion, raw_scores: bool) -> list[list[tuple[float, str]]]:
    """Per input, (score, label) best first: a pair's one score under the model's first label, a text's every
    label (probabilities, or logits with raw_scores)."""
    labels = served.engine.info.labels
    ranked = []
    for result in completion.value:
        if isinstance(result, float):
            ranked.append([(result, labels[0])])
        else:
            scores = result.logits if raw_scores else result.probs
            ranked.append(sorted(zip(scores, labels), key=lambda x: -x[0]))
    return ranked


def describe(models: ModelRegistry, settings: ServerSettings) -> dict[str, Any]:
    """TEI's model description (/info), for the one model a TEI server holds: the first served here."""
    served_models = models.models()
    if not served_models:
        raise InvalidRequest("no model is served")
    served = served_models[0]
    engine_info = served.engine.info
    if engine_info.task in ("embed", "hybrid", "sparse", "multi_vector"):
        # TEI's pooling names: a SPLADE model's is "splade"; a multi-vector model pools nothing
        pooling = {"sparse": "splade", "multi_vector": "none"}.get(engine_info.task, engine_info.pooling)
        model_type: dict[str, Any] = {"embedding": {"pooling": pooling}}
    else:
        id2label = {str(i): label for i, label in enumerate(engine_info.labels)}
        kind = "reranker" if engine_info.task == "score" else "classifier"
        model_type = {kind: {"id2label": id2label, "label2id": {v: int(k) for k, v in id2label.items()}}}
    return {
        "model_id": served.name, "model_sha": None, "model_dtype": engine_info.precision, "model_type": model_type,
        "max_concurrent_requests": settings.engine.max_queue_items, "max_input_length": engine_info.max_length,
        "max_batch_tokens": engine_info.deep_batch_tokens, "max_batch_requests": None,
        "max_client_batch_size": settings.max_client_batch_size, "auto_truncate": True, "tokenization_workers": 1,
        "version": __version__, "sha": None, "docker_label": None,
    }


async def rerank_tei(body: TEIRerankBody, request: Request) -> Response:
    started = time.perf_counter()
    served = common.resolve(request, body.model, "rerank")
    common.check_items(request, body.texts, "texts")
    completion = await served.engine.arun(
        RerankRequest(body.query, body.texts, None, body.truncate, activation=not body.raw_scores,
                      prompt_name=body.prompt_name, prompt=body.prompt, hybrid_weights=body.hybrid_weights))
    results = [
        {"index": index, "score": score, **({"text": body.texts[index]} if body.return_text else {})}
        for index, score in completion.value
    ]
    return common.reply(results, completion, started)

