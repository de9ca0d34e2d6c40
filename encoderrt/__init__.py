"""encoderrt: a compiled serving stack for encoder models (embeddings and cross-encoders).

The runtime names are imported on first use, so `encoderrt.kernels` (torch and triton only) loads
on a GPU machine without the serving dependencies.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["ClassifyRequest", "EmbedRequest", "Engine", "EngineConfig", "RerankRequest", "ScoreRequest", "__version__"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from encoderrt import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'encoderrt' has no attribute '{name}'")
