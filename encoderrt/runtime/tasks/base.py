"""What every request kind shares: the `Request` base (a kind plans itself), the `Plan` it returns, and the
`ModelContext` a plan reads (the loaded model's manifest, tokenizer, prompts and limits)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from encoderrt.runtime.errors import InvalidRequest, ResultTooLarge
from encoderrt.runtime.manifest import Manifest
from encoderrt.runtime.prompts import adapter_index, resolve_prompt
from encoderrt.runtime.quantization import EmbeddingQuantizer
from encoderrt.runtime.requests import NoLongerThan, Truncation, as_texts
from encoderrt.runtime.tokenizer import POOLING_START, TextTokenizer, Tokens

R = TypeVar("R")


@dataclass(frozen=True)
class Plan(Generic[R]):
    """Rows to run for one request, and how to turn their outputs into the answer."""

    rows: list[Tokens]
    finish: Callable[[object], R]
    """Gets the rows' rows of the graph's first output stacked, or, where the plan names `outputs`, a list with each
    row's outputs by name (per-token ones cut to the row's tokens)."""
    outputs: tuple[str, ...] = ()
    blocking_finish: bool = False
    """`finish` may wait on other work (int8 embeddings calibrate their ranges on first use): an async caller runs
    it off the event loop."""
    read_tokens: tuple[int, ...] | None = None
    """Each text's tokens where no row runs them (an inference-free sparse model's queries, answered from its
    weights), counted as a run row's would be; None: the rows'."""


class Request(Generic[R]):
    """A request kind: a frozen dataclass of the request's fields that knows what it means. `Engine` runs every kind
    the same way (`plan`, then the scheduler, then `finish`) and makes its sync and async verbs from the class."""

    def plan(self, model: ModelContext) -> Plan[R]:
        """The rows to run and how to finish them; a request the model cannot serve is refused here, before any row
        is queued."""
        raise NotImplementedError

    def texts_for_sizing(self) -> Sequence[object]:
        """The texts it carries (anything else counts as none), so the engine can tokenise a small request on the
        event loop rather than hop to a thread."""
        raise NotImplementedError


@dataclass(frozen=True)
class ModelContext:
    """What a plan may know of the loaded model."""

    manifest: Manifest
    tokenizer: TextTokenizer
    name: str
    default_prompt_name: str | None
    chunk_long_inputs: bool
    max_token_embeddings: int
    quantizer: EmbeddingQuantizer
    static_query_weights: np.ndarray | None = None
    """An inference-free sparse model's weight per token id on its query side (Manifest.static_queries)."""

    def require(self, verb: str, *tasks: str) -> None:
        if self.manifest.task not in tasks:
            hint = {"embed": "use embed", "score": "use score or rerank", "classify": "use classify",
                    "sparse": "use embed_sparse, score or rerank",
                    "multi_vector": "use embed_multi_vector, score or rerank",
                    "hybrid": "use embed, embed_sparse, embed_multi_vector, embed_hybrid, score or rerank"}[self.manifest.task]
            raise InvalidRequest(f"{verb} is not available for this {self.manifest.task} model ({self.name}); {hint}")

    def tokenizer_for(self, truncate: Truncation) -> tuple[TextTokenizer, bool]:
        """The tokenizer for a request's truncation rule, and whether it truncates."""
        if isinstance(truncate, bool):
            return self.tokenizer, truncate
        refuse = isinstance(truncate, NoLongerThan)
        length = truncate.tokens if refuse else truncate
        limit = self.manifest.max_length
        if isinstance(length, bool) or not isinstance(length, int) or not 2 <= length <= limit:
            raise InvalidRequest(f"truncation length must be an integer from 2 to {limit}, the model's limit; got {length!r}")
        return self.tokenizer.limited(length), not refuse

    def prompt(self, prompt_name: str | None = None, prompt: str | None = None) -> str:
        """The prefix for a request, by sentence-transformers' rule (runtime/prompts.py)."""
        return resolve_prompt(self.manifest.prompts, self.default_prompt_name, prompt_name, prompt, self.manifest.adapters)

    def with_adapter(self, rows: list[Tokens], prompt_name: str | None) -> list[Tokens]:
        """The rows run with the task adapter the prompt name (or the default one) names, where the model has them."""
        index = adapter_index(self.manifest.adapters, self.default_prompt_name, prompt_name)
        return [row._replace(adapter=index) for row in rows] if index else rows

    def prompted_rows(self, texts: Sequence[str], prefix: str, tokenizer: TextTokenizer, cut: bool,
                      side: str = "right") -> list[Tokens]:
        """Texts with their prompt in front, tokenised, truncation cutting the `side` end."""
        if side not in ("right", "left"):
            raise InvalidRequest(f"truncation side must be 'right' or 'left', got {side!r}")
        return tokenizer.encode(as_texts(texts, "texts"), cut, side=side, prompt=prefix)

    def limit_token_vectors(self, rows: list[Tokens], what: str, advice: str = "send fewer or shorter texts") -> None:
        """A request that returns a vector per token holds at most max_token_embeddings of them (`what` they are)."""
        total = sum(len(row.ids) for row in rows)
        if total > self.max_token_embeddings:
            raise ResultTooLarge(f"these inputs have {total} tokens; one request returns at most "
                                 f"{self.max_token_embeddings} {what}: {advice}")

    def excluded_prompt_tokens(self, prefix: str) -> int:
        """How many leading tokens pooling skips: the prompt's, where the model leaves its prompt out of pooling."""
        return self.tokenizer.prompt_length(prefix) if prefix and POOLING_START in self.manifest.inputs else 0

    def pooled_after(self, prefix: str, rows: list[Tokens]) -> list[Tokens]:
        start = self.excluded_prompt_tokens(prefix)
        return [row._replace(pooling_start=start) for row in rows] if start else rows


def check_count(name: str, value: int | None) -> None:
    """top_n / top_k: unset, or a positive integer."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidRequest(f"{name} must be a positive integer, got {value!r}")
