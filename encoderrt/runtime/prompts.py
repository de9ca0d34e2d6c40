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
                   prompt: str | None) -> str:
    """The prefix for a request, by `SentenceTransformer.encode`'s rule: an explicit `prompt` wins (""
    turns prompting off), then `prompt_name`, then the default prompt, else none."""
    if prompt is not None:
        return prompt
    if prompt_name is not None:
        if prompt_name not in prompts:
            known = ", ".join(sorted(prompts)) or "none"
            raise InvalidRequest(f"unknown prompt_name '{prompt_name}'; this model's prompts are: {known}")
        return prompts[prompt_name]
    return prompts[default_name] if default_name else ""


def default_prompt(manifest: Any, override: str | None) -> str | None:
    """The prompt name a loaded model applies by default: the folder's, or the one the server was told ("" for none)."""
    if override is None:
        return manifest.default_prompt_name
    if override and override not in manifest.prompts:
        known = ", ".join(sorted(manifest.prompts)) or "none"
        raise ValueError(f"default prompt name '{override}' is not one of this model's prompts: {known}")
    return override or None


def with_prompt(texts: Sequence[str], prefix: str) -> list[str]:
    return [prefix + text for text in texts] if prefix else list(texts)
