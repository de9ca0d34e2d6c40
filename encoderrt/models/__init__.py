"""Per-architecture facts, one module per family.

A module in this package that defines `ARCHITECTURE` is picked up by `find_architecture`, so
supporting a new family means adding one file.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from encoderrt.models.architecture import Architecture

__all__ = ["Architecture", "UnsupportedArchitecture", "find_architecture", "supported_model_types"]


class UnsupportedArchitecture(ValueError):
    pass


@cache
def _registry() -> dict[str, Architecture]:
    registry: dict[str, Architecture] = {}
    for module_info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        architecture = getattr(module, "ARCHITECTURE", None)
        if isinstance(architecture, Architecture):
            for model_type in architecture.model_types:
                registry[model_type] = architecture
    return registry


def supported_model_types() -> list[str]:
    return sorted(_registry())


def find_architecture(model_type: str) -> Architecture:
    try:
        return _registry()[model_type]
    except KeyError:
        raise UnsupportedArchitecture(
            f"unsupported architecture: model_type '{model_type}'; "
            f"encoderrt supports {', '.join(supported_model_types())}"
        ) from None
