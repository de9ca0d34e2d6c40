"""Settings declared once.

Each layer's settings are a frozen dataclass (runtime's EngineConfig, the server's ServerSettings and
ConnectionLimits, deploy's RaySettings) whose fields are made with `setting(default, help, ...)`. The command
line's flags, Ray Serve's application arguments and the docs' configuration page are generated from those
declarations, so a name, a default or a help text is written in one place and cannot drift between them.

A field's flag is its name with dashes (`max_queue_items` is `--max-queue-items`), and its environment variable
the name in capitals after ENCODERRT_ (`ENCODERRT_MAX_QUEUE_ITEMS`), which a container sets where a command line
is awkward; a flag given beats the variable. `aliases` keeps an older spelling working. A `per_model` setting is
given once per MODEL, in order (`--default-prompt-name` twice for two models); `in_app=False` marks what belongs
to the process rather than to the app a Ray replica runs (host, port, connection limits: Ray's proxy holds the
connections).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

_KEY = "encoderrt.setting"
ENV_PREFIX = "ENCODERRT_"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


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
    def env(self) -> str:
        """The environment variable that sets it where no flag does."""
        return ENV_PREFIX + self.name.upper()

    def given_as(self, environ: typing.Mapping[str, str] = os.environ) -> str:
        """How a user gave it, for a message about its value: the flag, and its variable where that is set (the
        value may have come from there)."""
        return f"{self.flag} ({self.env} is set)" if self.env in environ else self.flag

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


def check_choices(instance: Any) -> None:
    """A setting of a fixed set of values (a Literal) holding another is a ValueError naming both. The command line's
    choices check it there; this checks what the Python API and Ray's arguments build."""
    for item in declared(type(instance)):
        value = getattr(instance, item.name)
        if item.choices and value not in item.choices and not (value is None and item.optional):
            *rest, last = (repr(choice) for choice in item.choices)
            allowed = f"{rest[0]} or {last}" if len(rest) == 1 else f"one of {', '.join(rest)} or {last}"
            raise ValueError(f"{item.name} must be {allowed}, got {value!r}")


def declared_setting(cls: type, name: str) -> Setting:
    """The setting `cls` declares under `name` (a message names it by its flag: `.given_as()`)."""
    (item,) = (item for item in declared(cls) if item.name == name)
    return item


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type,
                  environ: typing.Mapping[str, str] = os.environ, only: typing.Collection[str] | None = None) -> None:
    """One flag per declared setting of `cls` (of those named in `only`, if given); the parsed value lands under the
    field's own name. A setting's environment variable in `environ` replaces its default (a per-model one:
    comma-separated, a value per MODEL)."""
    for item in declared(cls):
        if only is not None and item.name not in only:
            continue
        help_text = item.help.replace("%", "%%")  # argparse formats every help text with %
        options: dict[str, Any] = {"dest": item.name,
                                   "help": f"{help_text} (default: {item.shown_default()}; env {item.env})"}
        text = environ.get(item.env)
        if item.per_model:
            options.update(action=_PerModel, default=[] if text is None else text.split(","),
                           metavar=item.metavar or "VALUE",
                           help=f"{help_text}; once per MODEL, in order (env {item.env}, comma-separated)")
        elif item.scalar is bool:
            options.update(action=argparse.BooleanOptionalAction,
                           default=item.default if text is None else _truth(item, text))
        else:
            # a string default goes through `type` as a flag would, so a bad value is argparse's usage error
            options.update(default=item.default if text is None else text, type=_Parse(item, text),
                           metavar=item.metavar)
            if item.choices:
                options.update(choices=item.choices, metavar=None)
        parser.add_argument(item.flag, *item.aliases, **options)


class _Parse:
    """A setting's value from text; the error names the setting's type, and its variable if it came from there."""

    def __init__(self, item: Setting, env_text: str | None):
        self.item, self.env_text = item, env_text
        self.__name__ = getattr(item.scalar, "__name__", "value")

    def __call__(self, text: str) -> Any:
        try:
            value = self.item.parse(text)
        except ValueError:
            value = ValueError
        if value is ValueError or (self.item.choices and value not in self.item.choices):
            origin = f" (from {self.item.env})" if text == self.env_text else ""
            raise argparse.ArgumentTypeError(f"{text!r}{origin} is not {_kind(self.item)}")
        return value


def _kind(item: Setting) -> str:
    if item.choices:
        return "one of " + ", ".join(item.choices)
    kind = {int: "an integer", float: "a number"}.get(item.scalar, "a valid value")
    return kind + (" or none" if item.optional else "")


def _truth(item: Setting, text: str) -> bool:
    if text.lower() in _TRUE + _FALSE:
        return text.lower() in _TRUE
    raise SystemExit(f"encoderrt: {item.env}={text!r} is neither true nor false ({', '.join(_TRUE + _FALSE)})")


class _PerModel(argparse._AppendAction):
    """Appends each flag's value; the first flag given replaces what the environment set, rather than adding to it."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest) is self.default:
            setattr(namespace, self.dest, [])
        super().__call__(parser, namespace, values, option_string)


def from_arguments(cls: type, source: Any, *, in_app_only: bool = False, **fields: Any) -> Any:
    """`cls` built from the attributes of the same names on `source` (parsed flags, or Ray's application arguments,
    which hold only the app settings: `in_app_only`), plus `fields`; per-model settings, and settings `source` has
    no flag for, stay at their defaults."""
    values = {item.name: getattr(source, item.name) for item in declared(cls)
              if not item.per_model and (item.in_app or not in_app_only) and hasattr(source, item.name)}
    return cls(**values, **fields)


def changed(instance: Any, *, in_app: bool | None = None) -> list[Setting]:
    """The declared settings whose value differs from the default (only those with that `in_app`, if given)."""
    return [item for item in declared(type(instance))
            if (in_app is None or item.in_app == in_app) and getattr(instance, item.name) != item.default]
