"""Engine requests (plain dataclasses, no HTTP) and the rules that turn them into rows.

The server's pydantic schemas translate each API dialect into one of these; the engine never
sees a dialect.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

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
class EmbedRequest:
    texts: Sequence[str] = ()
    normalize: bool | None = None
    """None: the model's default from the manifest."""
    dimensions: int | None = None
    truncate: Truncation = True
    token_ids: Sequence[Sequence[int]] | None = None
    """Pre-tokenised input (OpenAI's token-array form), used as given instead of `texts` (no prompt added)."""
    prompt_name: str | None = None
    """One of the model's prompts; None: its default prompt, if it has one."""
    prompt: str | None = None
    """A prompt given verbatim, over prompt_name; "" turns the default prompt off."""
    truncation_side: Literal["right", "left"] = "right"
    """Which end truncation cuts: "left" keeps a text's end (a prompt at its start is cut first, as TEI does)."""


@dataclass(frozen=True)
class TokenEmbedRequest:
    """Every token's final hidden state, before pooling (sentence-transformers' output_value="token_embeddings",
    TEI's /embed_all): one [tokens, hidden] array per text, special and prompt tokens included."""

    texts: Sequence[str]
    truncate: Truncation = True
    prompt_name: str | None = None
    prompt: str | None = None
    truncation_side: Literal["right", "left"] = "right"


@dataclass(frozen=True)
class SparseEmbedRequest:
    """SPLADE-style sparse vectors: (token id, weight) pairs per text."""

    texts: Sequence[str]
    top_k: int | None = None
    truncate: Truncation = True


@dataclass(frozen=True)
class ScoreRequest:
    text_1: TextOrTexts
    text_2: TextOrTexts
    truncate: Truncation = True
    activation: bool = True
    """False: raw logits, for users who calibrate scores themselves."""


@dataclass(frozen=True)
class RerankRequest:
    query: str
    documents: Sequence[str]
    top_n: int | None = None
    truncate: Truncation = True
    activation: bool = True


@dataclass(frozen=True)
class ClassifyRequest:
    texts: Sequence[str]
    truncate: Truncation = True


Request = EmbedRequest | TokenEmbedRequest | SparseEmbedRequest | ScoreRequest | RerankRequest | ClassifyRequest


@dataclass(frozen=True)
class Classification:
    label: str
    probs: list[float]
    logits: list[float]


@dataclass(frozen=True)
class Completion:
    value: Any
    prompt_tokens: int
    timings: Timings = field(default_factory=Timings)


def as_texts(texts: str | Sequence[str], field_name: str) -> list[str]:
    """One text or a list of texts, checked: anything else names the field and the offending item."""
    if isinstance(texts, str):
        return [texts]
    if not isinstance(texts, Sequence):
        raise InvalidRequest(f"{field_name} must be a string or a list of strings, got {type(texts).__name__}")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidRequest(f"{field_name}[{index}] must be a string, got {type(text).__name__}")
    return list(texts)


def pair_texts(text_1: TextOrTexts, text_2: TextOrTexts) -> tuple[list[str], list[str]]:
    """vLLM's score pairing: 1:1 (str, str), 1:N (one text_1, list text_2), N:N (equal-length lists)."""
    firsts, seconds = as_texts(text_1, "text_1"), as_texts(text_2, "text_2")
    if len(firsts) == 1 and not isinstance(text_2, str):
        return firsts * len(seconds), seconds
    if isinstance(text_2, str) and len(firsts) != 1:
        raise InvalidRequest(
            f"text_1 is a list of {len(firsts)} texts but text_2 is a single text: "
            "give text_2 as a list of the same length (N:N) or a single text_1 (1:N)"
        )
    if len(firsts) != len(seconds):
        raise InvalidRequest(
            f"text_1 has {len(firsts)} texts and text_2 has {len(seconds)}: "
            "pairwise scoring (N:N) needs equal lengths, or give one text_1 for many text_2 (1:N)"
        )
    return firsts, seconds
