"""(query, document) pairs through a causal-LM reranker's chat template, as sentence-transformers' CrossEncoder
renders them.

Qwen3-Reranker and its kin read a pair's score from the next-token logits after a prompt that the model's chat
template writes. sentence-transformers hands the template one conversation per pair: a "query" and a "document"
message, after a "system" message holding the request's prompt (the instruction) if it has one; the rendered
text is tokenised without special tokens (the template writes its own), cut at the length limit, and where the
cut reached the limit the template's fixed tail (the assistant's turn the score is read after) is written back
over the last tokens: the model must end on the tokens it answers after. The tail is what two renders with
different fillers for the query and the document end with in common.

Templates come from model folders, so they run in jinja2's immutable sandbox, as transformers runs them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from tokenizers import Tokenizer

from encoderrt.runtime.errors import InvalidRequest

QUERY, DOCUMENT, SYSTEM = "query", "document", "system"


@dataclass(frozen=True)
class ChatTemplate:
    """A reranker's chat template (jinja source) and the special tokens it may name (`eos_token`, ...), which
    transformers passes to every render."""

    source: str
    variables: Mapping[str, str] = field(default_factory=dict)


def _conversation(query: str, document: str, instruction: str | None) -> list[dict[str, str]]:
    pair = [{"role": QUERY, "content": query}, {"role": DOCUMENT, "content": document}]
    return [{"role": SYSTEM, "content": instruction}, *pair] if instruction else pair


@lru_cache(maxsize=8)
def _compiled(source: str) -> Any:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    return environment.from_string(source)


class PairRenderer:
    """Pairs rendered through one template, and their ids cut by sentence-transformers' rule."""

    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer):
        self.template = template
        self._tokenizer = tokenizer
        self._compiled = _compiled(template.source)

    def render(self, query: str, document: str, instruction: str | None = None) -> str:
        import jinja2

        try:
            return self._compiled.render(messages=_conversation(query, document, instruction), tools=None,
                                         documents=None, add_generation_prompt=False, **self.template.variables)
        except jinja2.exceptions.TemplateError as exc:
            raise InvalidRequest(f"the model's chat template refused this pair: {exc}") from None

    def render_pairs(self, firsts: Sequence[str], seconds: Sequence[str], instruction: str | None = None) -> list[str]:
        return [self.render(query, document, instruction) for query, document in zip(firsts, seconds)]

    def cut(self, rows: Sequence[list[int]], max_length: int, instruction: str | None = None) -> list[list[int]]:
        """Rendered pairs' ids cut at `max_length`, a row that reaches it ending with the template's tail."""
        tail = self.tail(instruction)
        cut = []
        for ids in rows:
            ids = ids[:max_length]
            if len(ids) >= max_length and tail:
                keep = min(len(tail), len(ids))
                ids[-keep:] = tail[-keep:]
            cut.append(ids)
        return cut

    @lru_cache(maxsize=64)
    def overhead(self, instruction: str | None) -> int:
        """The tokens the template takes around an empty pair."""
        return len(self._tokenizer.encode(self.render("", "", instruction), add_special_tokens=False).ids)

    @lru_cache(maxsize=64)
    def tail(self, instruction: str | None) -> list[int]:
        """The ids every render ends with whatever the pair holds: the common end of two renders with different
        fillers, [] where the renders never differ (nothing of the pair in them) or share nothing."""
        first, second = ([*self._tokenizer.encode(self.render(filler, filler, instruction), add_special_tokens=False).ids]
                         for filler in ("0", "1 2 3 4"))
        count = 0
        for a, b in zip(reversed(first), reversed(second)):
            if a != b:
                break
            count += 1
        return first[len(first) - count:] if 0 < count < min(len(first), len(second)) else []
