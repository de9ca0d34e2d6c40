"""Request kinds, one module each: a kind's request type, its validation, its plan (the rows to run) and its
post-processing live together, so a new kind is a new module. Each kind plans itself (`Request.plan`); `plan`
below is the one place that runs a plan's common checks, and `Engine` makes its verbs from the classes."""

from __future__ import annotations

from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.tasks.base import ModelContext, Plan, Request, check_count
from encoderrt.runtime.tasks.classify import Classification, ClassifyRequest
from encoderrt.runtime.tasks.embed import EmbedRequest, check_dimensions
from encoderrt.runtime.tasks.hybrid import HybridEmbedding, HybridEmbedRequest
from encoderrt.runtime.tasks.multi_vector import MultiVectorRequest
from encoderrt.runtime.tasks.rerank import RerankRequest
from encoderrt.runtime.tasks.score import ScoreRequest, pair_texts
from encoderrt.runtime.tasks.sparse import SparseEmbedRequest
from encoderrt.runtime.tasks.token_embeddings import TokenEmbedRequest

__all__ = [
    "Classification", "ClassifyRequest", "EmbedRequest", "HybridEmbedRequest", "HybridEmbedding", "ModelContext",
    "MultiVectorRequest", "Plan", "RerankRequest", "Request",
    "ScoreRequest", "SparseEmbedRequest", "TokenEmbedRequest", "check_count", "check_dimensions", "pair_texts", "plan",
]


def plan(model: ModelContext, request: Request) -> Plan:
    """The rows for a request; a row the model cannot run is refused here, before it joins a batch."""
    if not isinstance(request, Request):
        raise TypeError(f"not an engine request: {type(request).__name__}")
    planned = request.plan(model)
    limit = model.manifest.max_length
    for index, row in enumerate(planned.rows):
        if len(row.ids) > limit:
            raise InvalidRequest(f"input {index} has {len(row.ids)} tokens after truncation, more than this model's "
                                 f"limit of {limit}")
    return planned
