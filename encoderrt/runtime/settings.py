"""Settings declared once.

Each layer's settings are a frozen dataclass (runtime's EngineConfig, the server's ServerSettings and
ConnectionLimits, deploy's RaySettings) whose fields are made with `setting(default, help, ...)`. The command
line's flags, Ray Serve's application arguments and the docs' configuration page are generated from those
declarations, so a name, a default or a help text is written in one place and cannot drift between them.

A field's flag is its name with dashes (`max_queue_items` is `--max-queue-items`); `aliases` keeps an older
spelling working. A `per_model` setting is given once per MODEL, in order (`--default-prompt-name` twice for
two models); `in_app=False` marks what belongs to the process rather than to the app a Ray replica runs (host,
port, connection limits: Ray's proxy holds the connections).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

_KEY = "encoderrt.setting"


@dataclass(frozen=True)
class Setting:
    """One declared setting, as the generators see it."""

    name: str
    type: Any
    """The field's annotation, resolved (int, float, str, bool, X | None, Literal[...])."""
    default: Any
    help: str
    metavar: str | None = None
    aliases: tuple[str, ...] = ()
    per_model: bool = False
    in_app: bool = True
    shown: str | None = None
    """The default in words, where the value alone would mislead (None meaning "calibrated at load")."""
    owner: str = ""
    """The dataclass that declares it, for the docs."""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def optional(self) -> bool:
        return type(None) in typing.get_args(self.type)

    @property
    def scalar(self) -> Any:
        """The type without its `| None`."""
        args = [arg for arg in typing.get_args(self.type) if arg is not type(None)]
        if typing.get_origin(self.type) in (typing.Union, types.UnionType) and len(args) == 1:
            return args[0]
        return self.type

    @property
    def choices(self) -> tuple[str, ...] | None:
        scalar = self.scalar
        return typing.get_args(scalar) if typing.get_origin(scalar) is Literal else None

    def parse(self, text: str) -> Any:
        """A command-line value as this setting's type ('none' clears an optional number)."""
        scalar = self.scalar
        if self.optional and text.lower() == "none" and scalar in (int, float):
            return None
        if scalar is int:
            return int(text)
        if scalar is float:
            return float(text)
        return text

    def shown_default(self) -> str:
        """The default as the docs and --help show it."""
        if self.shown is not None:
            return self.shown
        if self.default is None:
            return "unset"
        if isinstance(self.default, bool):
            return "on" if self.default else "off"
        if isinstance(self.default, float) and math.isinf(self.default):
            return "inf"
        if isinstance(self.default, float) and self.default.is_integer():
            return f"{self.default:g}"
        return str(self.default)


def setting(default: Any, help: str, *, metavar: str | None = None, aliases: tuple[str, ...] = (),
            per_model: bool = False, in_app: bool = True, shown: str | None = None) -> Any:
    """A dataclass field that is also a flag, a Ray argument and a row of the docs' configuration page."""
    return dataclasses.field(default=default, metadata={_KEY: {"help": help, "metavar": metavar, "aliases": aliases,
                                                               "per_model": per_model, "in_app": in_app,
                                                               "shown": shown}})


def declared(cls: type) -> list[Setting]:
    """The settings a dataclass declares, in field order (plain fields, such as nested settings, are left out)."""
    hints = typing.get_type_hints(cls, include_extras=False)
    return [Setting(f.name, hints[f.name], f.default, owner=cls.__name__, **f.metadata[_KEY])
            for f in dataclasses.fields(cls) if _KEY in f.metadata]


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type) -> None:
    """One flag per declared setting of `cls`; the parsed value lands under the field's own name."""
    for item in declared(cls):
        options: dict[str, Any] = {"dest": item.name, "help": f"{item.help} (default: {item.shown_default()})"}
        if item.per_model:
            options.update(action="append", default=[], metavar=item.metavar or "VALUE")
            options["help"] = f"{item.help}; once per MODEL, in order"
        elif item.scalar is bool:
            options.update(action=argparse.BooleanOptionalAction, default=item.default)
        else:
            options.update(default=item.default, type=item.parse, metavar=item.metavar)
            if item.choices:
                options.update(choices=item.choices, metavar=None)
        parser.add_argument(item.flag, *item.aliases, **options)


def from_arguments(cls: type, source: Any, *, in_app_only: bool = False, **fields: Any) -> Any:
    """`cls` built from the attributes of the same names on `source` (parsed flags, or Ray's application arguments,
    which hold only the app settings: `in_app_only`), plus `fields`; per-model settings stay at their defaults."""
    values = {item.name: getattr(source, item.name) for item in declared(cls)
              if not item.per_model and (item.in_app or not in_app_only)}
    return cls(**values, **fields)


def changed(instance: Any, *, in_app: bool | None = None) -> list[Setting]:
    """The declared settings whose value differs from the default (only those with that `in_app`, if given)."""
    return [item for item in declared(type(instance))
            if (in_app is None or item.in_app == in_app) and getattr(instance, item.name) != item.default]
