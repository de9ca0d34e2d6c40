"""Backends, one module per target; the manifest's `target` picks one.

A module here that defines `TARGET` and `create(manifest, artifact_dir, options)` is found by
`load_backend`, so adding a backend means adding one file; what it returns implements base.py's `Backend`. `LAYOUTS` names the graph layouts it
runs (runtime/manifest.py); without it, padded only.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from pathlib import Path
from types import ModuleType

from encoderrt.runtime.backends.base import (
    STREAMS_ONLY,
    Backend,
    BackendOptions,
    BackendUnavailable,
    Batch,
    Capabilities,
    Outputs,
    first_output,
)
from encoderrt.runtime.manifest import Manifest

__all__ = ["Backend", "BackendOptions", "BackendUnavailable", "Batch", "Capabilities", "Outputs", "STREAMS_ONLY",
           "first_output", "load_backend"]


@cache
def _targets() -> dict[str, ModuleType]:
    found: dict[str, ModuleType] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        target = getattr(module, "TARGET", None)
        if isinstance(target, str):
            found[target] = module
    return found


def load_backend(manifest: Manifest, artifact_dir: str | Path, options: BackendOptions | None = None) -> Backend:
    module = _targets().get(manifest.target)
    if module is None:
        raise BackendUnavailable(
            f"artifact target '{manifest.target}' has no backend here; available: {', '.join(sorted(_targets()))}"
        )
    layouts = getattr(module, "LAYOUTS", ("padded",))
    if manifest.layout not in layouts:
        raise BackendUnavailable(f"the {manifest.target} target runs {' or '.join(layouts)} graphs; this artifact's graph "
                                 f"is {manifest.layout}")
    return module.create(manifest, Path(artifact_dir), options or BackendOptions())
