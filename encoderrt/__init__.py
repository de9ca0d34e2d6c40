"""encoderrt: a compiled serving stack for encoder models (embeddings and cross-encoders).

The runtime names are imported on first use, so `encoderrt.kernels` (torch and triton only) loads
on a GPU machine without the serving dependencies.
"""

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["ClassifyRequest", "EmbedRequest", "Engine", "EngineConfig", "RerankRequest", "ScoreRequest", "__version__",
           "embed_corpus", "score_corpus", "classify_corpus"]
_JOBS = ("embed_corpus", "score_corpus", "classify_corpus")


def __getattr__(name: str) -> Any:
    if name in _JOBS:
        # by name: modules of every floor import this package for __version__, and the facade's lazy reach up to
        # jobs/ is no dependency of theirs (import-linter would read a static import as one)
        return getattr(importlib.import_module("encoderrt.jobs"), name)
    if name in __all__:
        from encoderrt import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'encoderrt' has no attribute '{name}'")
