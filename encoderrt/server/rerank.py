"""Cohere / Jina rerank dialect: POST /rerank, /v1/rerank (Jina) and /v2/rerank (Cohere).

POST /rerank also answers TEI's body (`texts` instead of `documents`) in TEI's shape, since both
APIs claim that path.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import Response

from encoderrt.runtime.tasks import RerankRequest
from encoderrt.server import common
from encoderrt.server.bodies import BodyRoute
from encoderrt.server.schemas import HybridWeights, NonEmpty, RequestBody
from encoderrt.server.tei import TEIRerankBody, rerank_tei

router = APIRouter(tags=["Rerank"], route_class=BodyRoute)


class DocumentObject(RequestBody):
    text: str


class RerankBody(RequestBody):
    model: str | None = None
    query: str
    documents: NonEmpty[str | DocumentObject]
    top_n: int | None = None
    return_documents: bool = True
    truncate_prompt_tokens: int | None = None
    prompt_name: str | None = None
    """encoderrt extension: one of the reranker's prompts (CrossEncoder.predict's prompt_name)."""
    prompt: str | None = None
    """encoderrt extension: a prompt given verbatim, a chat-template reranker's instruction (Qwen3-Reranker's)."""
    hybrid_weights: HybridWeights = None


async def _rerank(body: RerankBody, request: Request) -> Response:
    started = time.perf_counter()
    served = common.resolve(request, body.model, "rerank")
    common.check_items(request, body.documents, "documents")
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    completion = await served.engine.arun(
        RerankRequest(body.query, texts, body.top_n, common.truncation(body.truncate_prompt_tokens),
                      prompt_name=body.prompt_name, prompt=body.prompt, hybrid_weights=body.hybrid_weights))
    results = [
        {"index": index, "relevance_score": score, **({"document": {"text": texts[index]}} if body.return_documents else {})}
        for index, score in completion.value
    ]
    payload = {"id": common.new_id("rerank"), "model": served.name, "usage": {"total_tokens": completion.prompt_tokens},
               "results": results}
    return common.reply(payload, completion, started)


@router.post("/rerank")
async def rerank(body: RerankBody | TEIRerankBody, request: Request) -> Response:
    if isinstance(body, TEIRerankBody):
        return await rerank_tei(body, request)
    return await _rerank(body, request)


@router.post("/v1/rerank")
@router.post("/v2/rerank")
async def rerank_versioned(body: RerankBody, request: Request) -> Response:
    return await _rerank(body, request)
