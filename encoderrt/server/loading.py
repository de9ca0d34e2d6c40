"""Turn `encoderrt serve` MODEL arguments into loaded engines (model folders compile once into the cache)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from encoderrt.compile.cache import artifact_for
from encoderrt.runtime import Engine, EngineConfig
from encoderrt.server.registry import ModelRegistry

log = logging.getLogger("encoderrt.server")


@dataclass(frozen=True)
class ModelSpec:
    path: Path | None
    """An artifact folder, a model folder, or None for the bundled all-MiniLM-L6-v2."""
    served_name: str | None = None
    default_prompt_name: str | None = None
    """Overrides the folder's default prompt for this model ("" for none)."""


def load_models(specs: list[ModelSpec], config: EngineConfig, registry: ModelRegistry) -> None:
    for spec in specs:
        artifact, name = artifact_for(spec.path, spec.served_name)
        engine = Engine.load(artifact, config, **({"default_prompt_name": spec.default_prompt_name}
                                                  if spec.default_prompt_name is not None else {}))
        registry.add(name or engine.info.name, engine)
        log.info("serving %s (%s, %s) from %s; batch budget %d tokens",
                 name or engine.info.name, engine.info.task, engine.info.precision, artifact, engine.info.max_batch_tokens)
    registry.mark_ready()
