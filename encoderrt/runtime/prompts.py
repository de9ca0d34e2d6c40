"""Prompts as sentence-transformers applies them: a named or given string prepended to every text.

e5, bge and gte models are trained with "query: " / "passage: " style prefixes; a server that forgets
them returns vectors far from the reference (cosine 0.69 on a tiny folder), so the folder's default
prompt applies unless a request names another or turns it off with an empty prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from encoderrt.runtime.errors import InvalidRequest


def resolve_prompt(prompts: Mapping[str, str], default_name: str | None, prompt_name: str | None,
                   prompt: str | None, adapters: Sequence[str] = ()) -> str:
    """The prefix for a request, by `SentenceTransformer.encode`'s rule: an explicit `prompt` wins (""
    turns prompting off), then `prompt_name`, then the default prompt, else none. A task adapter's name
    (jina-v3's tasks) is a valid prompt_name without a prompt of its own."""
    if prompt_name is not None and prompt_name not in prompts and prompt_name not in adapters:
        kind, names = _known(prompts, adapters)
        raise InvalidRequest(f"unknown prompt_name '{prompt_name}'; this model's {kind} are: {names}")
    if prompt is not None:
        return prompt
    name = _named(prompt_name, default_name)
    return prompts.get(name, "") if name else ""


SIDE_PROMPTS = {"query": ("query",), "document": ("document", "passage", "corpus")}
"""The prompt names encode_query and encode_document look for, in order, when a request names none."""


def side_prompt_name(prompts: Mapping[str, str], side: str | None, prompt_name: str | None,
                     prompt: str | None) -> str | None:
    """The prompt name a request on one side goes by, as encode_query / encode_document choose it: its own, else the
    first of the side's names the model has; None (the model's default prompt) where neither applies."""
    if prompt_name is not None or prompt is not None or side is None:
        return prompt_name
    return next((name for name in SIDE_PROMPTS[side] if name in prompts), None)


def adapter_index(adapters: Sequence[str], default_name: str | None, prompt_name: str | None) -> int:
    """The graph's `adapter` input for a request: 1 + its task's index in the manifest's adapters, 0 for none."""
    name = _named(prompt_name, default_name)
    return adapters.index(name) + 1 if name in adapters else 0


def default_prompt(manifest: Any, override: str | None) -> str | None:
    """The prompt name a loaded model applies by default: the folder's, or the one the server was told ("" for none)."""
    if override is None:
        return manifest.default_prompt_name
    if override and override not in manifest.prompts and override not in manifest.adapters:
        kind, names = _known(manifest.prompts, manifest.adapters)
        raise ValueError(f"default prompt name '{override}' is not one of this model's {kind}: {names}")
    return override or None


def _named(prompt_name: str | None, default_name: str | None) -> str | None:
    """The name a request goes by: its own, else the model's default."""
    return prompt_name if prompt_name is not None else default_name


def _known(prompts: Mapping[str, str], adapters: Sequence[str]) -> tuple[str, str]:
    """What the valid names are called ("tasks" where the model has task adapters, else "prompts"), and them, sorted."""
    if adapters:
        return "tasks", ", ".join(sorted({*prompts, *adapters}))
    return "prompts", ", ".join(sorted(prompts)) or "none"


def with_prompt(texts: Sequence[str], prefix: str) -> list[str]:
    return [prefix + text for text in texts] if prefix else list(texts)
