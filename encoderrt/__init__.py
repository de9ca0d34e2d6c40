"""encoderrt: a compiled serving stack for encoder models (embeddings and cross-encoders)."""

from encoderrt.runtime import Engine, EngineConfig

__all__ = ["Engine", "EngineConfig", "__version__"]
__version__ = "0.1.0"
