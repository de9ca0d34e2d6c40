"""Load compiled artifacts and serve them: tokenise, batch under a token budget, run a backend."""

from encoderrt.runtime.config import EngineConfig
from encoderrt.runtime.engine import Engine, EngineInfo
from encoderrt.runtime.errors import (
    EngineClosed,
    EngineError,
    InferenceFailed,
    InputTooLong,
    InvalidRequest,
    Overloaded,
)
from encoderrt.runtime.manifest import ManifestError
from encoderrt.runtime.requests import Completion
from encoderrt.runtime.tasks import Classification, ClassifyRequest, EmbedRequest, RerankRequest, ScoreRequest

__all__ = [
    "Classification", "ClassifyRequest", "Completion", "EmbedRequest", "Engine", "EngineClosed", "EngineConfig",
    "EngineError", "EngineInfo", "InferenceFailed", "InputTooLong", "InvalidRequest", "ManifestError", "Overloaded",
    "RerankRequest", "ScoreRequest",
]
