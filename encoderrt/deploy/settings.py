"""Ray Serve's settings, and the application arguments generated from every layer's declaration.

`RayAppArgs` is what `serve run encoderrt.deploy.ray:app key=value ...` and a Serve config file's `args:` take:
the MODELs, the per-model settings as comma-separated lists, and every app setting of the engine, the server and
Ray (runtime/settings.py), under the flag's own name and with its default. Nothing here imports Ray, so the
command line can build its flags without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, create_model, field_validator

from encoderrt.runtime.config import EngineConfig
from encoderrt.runtime.settings import Setting, declared, from_arguments, setting
from encoderrt.server.loading import ModelSpec, model_path
from encoderrt.server.settings import ConnectionLimits, ServerSettings


@dataclass(frozen=True)
class RaySettings:
    replicas: int = setting(1, "with --ray: replicas to run", metavar="N")
    autoscale: str | None = setting(
        None, "with --ray: scale between MIN and MAX replicas on ongoing requests, against a target from one "
        "replica's measured capacity", metavar="MIN:MAX")
    cpus_per_replica: float = setting(
        2.0, "with --ray: CPUs Ray reserves for each replica; its backend threads match them", metavar="N")
    request_tokens: int = setting(
        1024, "with --autoscale: tokens of a typical request of your traffic (eight 128-token passages); with the "
        "engine's measured budget it sets the autoscaling target", metavar="N")
    ray_address: str | None = setting(
        None, "with --ray: the cluster to join", metavar="ADDR", in_app=False,
        shown="RAY_ADDRESS's, or a new local cluster")


APP_LAYERS: tuple[type, ...] = (EngineConfig, ServerSettings, RaySettings)
"""Whose app settings (`in_app`) a replica takes; the rest belong to the process that holds the connections."""


def app_settings(cls: type) -> list[Setting]:
    return [item for item in declared(cls) if item.in_app and not item.per_model]


def _comma_separated(value: object) -> object:
    return [part for part in value.split(",") if part] if isinstance(value, str) else value


def _comma_separated_keeping_empty(value: object) -> object:
    """Per-model values keep their empty entries: "" (no prompt) is a value, not a gap ("query,,passage")."""
    return value.split(",") if isinstance(value, str) else value


class _AppArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: list[str]
    """Artifact or model folders (model folders compile on the driver, once, into the compile cache); the bundled
    model by its name, all-MiniLM-L6-v2."""

    @field_validator("models", mode="before")
    @classmethod
    def _models(cls, value: object) -> object:
        return _comma_separated(value)

    def layer(self, cls: type, **fields: Any) -> Any:
        """One layer's settings object from these arguments (its app settings; the rest at their defaults)."""
        return from_arguments(cls, self, in_app_only=True, **fields)

    def specs(self) -> list[ModelSpec]:
        """One spec per MODEL, the bundled model by its name (unless a folder of that name is here)."""
        per_model = {item.name: getattr(self, item.name) for item in declared(ModelSpec)}
        return ModelSpec.each([model_path(path) for path in self.models], per_model)

    @classmethod
    def from_settings(cls, models: list[str], per_model: dict[str, list], *layers: Any) -> "_AppArgs":
        values: dict[str, Any] = {"models": models, **per_model}
        for layer in layers:
            values.update({item.name: getattr(layer, item.name) for item in app_settings(type(layer))})
        return cls.model_validate(values)


def _field(item: Setting, annotation: Any, default: Any) -> tuple[Any, Any]:
    """A pydantic field under the setting's name that also takes its older spellings (--max-queue: max_queue), and
    the plural the per-model lists once had (served_model_names)."""
    names = [item.name, *(alias.lstrip("-").replace("-", "_") for alias in item.aliases)]
    if item.per_model:
        names.append(item.name + "s")
    return annotation, Field(default=default, validation_alias=AliasChoices(*names), description=item.help)


def _per_model_validator(name: str) -> Any:
    return field_validator(name, mode="before")(lambda cls, value: _comma_separated_keeping_empty(value))


RayAppArgs = create_model(
    "RayAppArgs",
    __base__=_AppArgs,
    __validators__={f"_{item.name}_list": _per_model_validator(item.name) for item in declared(ModelSpec)},
    **{item.name: _field(item, list[str], []) for item in declared(ModelSpec)},
    **{item.name: _field(item, item.type, item.default) for layer in APP_LAYERS for item in app_settings(layer)},
)
RayAppArgs.__doc__ = ("`serve run encoderrt.deploy.ray:app key=value ...`, or a Serve config file's `args:` "
                      "(comma-separated lists): generated from the settings' declarations.")


SECTIONS: tuple[tuple[str, type], ...] = (
    ("Server", ServerSettings), ("Per model", ModelSpec), ("Engine", EngineConfig),
    ("Connections", ConnectionLimits), ("Ray Serve", RaySettings))
"""Every settings declaration, in the order `encoderrt serve --help` and the docs show them."""


def configuration_page() -> str:
    """docs/configuration.md, generated from the declarations (scripts/write_configuration_docs.py writes it; a
    test fails when the page and the code differ)."""
    lines = ["# Configuration", "",
             "<!-- generated from the settings' declarations by scripts/write_configuration_docs.py: do not edit -->",
             "",
             "Every setting is one flag of `encoderrt serve` and, where it applies inside a replica, one argument of "
             "the Ray Serve application (`serve run encoderrt.deploy.ray:app key=value ...`, or a Serve config "
             "file's `args:`). The argument is the flag's name with underscores; a dash marks a setting of the process "
             "itself, which under Ray belongs to Ray's proxy. Per-model settings take one value per MODEL, in order "
             "(a comma-separated list for Ray). Python users set the engine's fields with "
             "`Engine.load(path, field=value)`.", "",
             "Each flag is also an environment variable, for containers and process managers: its name in capitals "
             "after `ENCODERRT_` (`--max-queue-items` is `ENCODERRT_MAX_QUEUE_ITEMS`); a flag on the command line "
             "beats the variable, a per-model variable takes comma-separated values, and `ENCODERRT_MODELS` "
             "(comma-separated) stands for the MODEL arguments.", ""]
    for title, cls in SECTIONS:
        lines += [f"## {title}", "", "| flag | environment | Ray argument | default | what it does |",
                  "|---|---|---|---|---|"]
        for item in declared(cls):
            flags = ", ".join(f"`{flag}`" for flag in (item.flag, *item.aliases))
            argument = f"`{item.name}`" if item.in_app else "—"
            choices = f" One of {', '.join(f'`{c}`' for c in item.choices)}." if item.choices else ""
            lines.append(f"| {flags} | `{item.env}` | {argument} | {item.shown_default()} | {item.help}.{choices} |")
        lines.append("")
    return "\n".join(lines)
