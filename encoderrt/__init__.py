"""encoderrt: a compiled serving stack for encoder models (embeddings and cross-encoders)."""

from encoderrt.runtime import ClassifyRequest, EmbedRequest, Engine, EngineConfig, RerankRequest, ScoreRequest

__all__ = ["ClassifyRequest", "EmbedRequest", "Engine", "EngineConfig", "RerankRequest", "ScoreRequest", "__version__"]
__version__ = "0.1.0"
