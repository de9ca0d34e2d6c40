"""What every request kind shares (runtime/tasks/ has one module per kind): texts, truncation rules, and the
Completion a request comes back as. The server's pydantic schemas translate each API dialect into a request
kind; the engine never sees a dialect."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.stats import Timings

TextOrTexts = str | Sequence[str]


@dataclass(frozen=True)
class NoLongerThan:
    """A request's own length limit that refuses rather than cuts (Cohere's truncate=NONE with max_tokens)."""

    tokens: int


Truncation = bool | int | NoLongerThan
"""True: cut at the model's limit; False: over-long input is an error; k: cut at k tokens (<= the limit);
NoLongerThan(k): input over k tokens is an error."""


@dataclass(frozen=True)
class Completion:
    value: Any
    prompt_tokens: int
    timings: Timings = field(default_factory=Timings)
    row_tokens: tuple[int, ...] = ()
    """Tokens of each row the request ran, in the plan's order: one per text where texts map to rows one to one
    (a bulk job's per-row counts); chunked, paired or deduplicated requests run other rows."""


def as_texts(texts: str | Sequence[str], field_name: str) -> list[str]:
    """One text or a list of texts, checked: anything else names the field and the offending item."""
    if isinstance(texts, str):
        return [texts]
    if not isinstance(texts, Sequence) or isinstance(texts, (bytes, bytearray)):  # bytes: a sequence of ints
        raise InvalidRequest(f"{field_name} must be a string or a list of strings, got {type(texts).__name__}")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidRequest(f"{field_name}[{index}] must be a string, got {type(text).__name__}")
    return list(texts)
