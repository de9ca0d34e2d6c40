"""Texts through a model's chat template, as sentence-transformers renders them.

Qwen3-Reranker and its kin read a pair's score from the next-token logits after a prompt that the model's chat
template writes: sentence-transformers' CrossEncoder hands the template one conversation per pair, a "query" and a
"document" message. An embedder saved by sentence-transformers 6 or later whose tokenizer has a chat template takes
its texts as messages too (its Transformer's `modality_config` names "message"): each text is one "user" message.
Either way the request's prompt (the instruction) comes first as a "system" message; the rendered text is tokenised
without special tokens (the template writes its own), cut at the length limit, and where the cut reached the limit
the template's fixed tail (the assistant's turn a score is read after, the token a last-token embedder pools) is
written back over the last tokens. The tail is what two renders with different fillers for the contents end with
in common.

Templates come from model folders, so they run in jinja2's immutable sandbox, as transformers runs them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from tokenizers import Tokenizer

from encoderrt.runtime.errors import InvalidRequest

QUERY, DOCUMENT, SYSTEM, USER = "query", "document", "system", "user"
PAIR_ROLES, TEXT_ROLES = (QUERY, DOCUMENT), (USER,)
"""The messages a conversation holds besides the system one: a reranker's pair, or an embedder's text."""
MessageFormat = Literal["flat", "structured"]
"""How a message holds its text, as sentence-transformers writes it: the string itself, or a list of typed parts
([{"type": "text", "text": ...}])."""


@dataclass(frozen=True)
class ChatTemplate:
    """A model's chat template (jinja source) and the special tokens it may name (`eos_token`, ...), which
    transformers passes to every render."""

    source: str
    variables: Mapping[str, str] = field(default_factory=dict)


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


class ChatRenderer:
    """Conversations of one shape (`roles`, after an optional system message) rendered through one template, and their
    ids cut by sentence-transformers' rule."""

    def __init__(self, template: ChatTemplate, tokenizer: Tokenizer, roles: tuple[str, ...] = PAIR_ROLES,
                 message_format: MessageFormat = "flat"):
        self.template = template
        self.roles = roles
        self._tokenizer = tokenizer
        self._structured = message_format == "structured"
        self._compiled = _compiled(template.source)

    def _content(self, text: str) -> str | list[dict[str, str]]:
        return [{"type": "text", "text": text}] if self._structured else text

    def render(self, contents: Sequence[str], instruction: str | None = None) -> str:
        """One conversation: the instruction as a system message, then a message of each role with its content."""
        import jinja2

        messages = [{"role": role, "content": self._content(text)} for role, text in zip(self.roles, contents)]
        if instruction:
            messages.insert(0, {"role": SYSTEM, "content": self._content(instruction)})
        try:
            return self._compiled.render(messages=messages, tools=None, documents=None, add_generation_prompt=False,
                                         **self.template.variables)
        except jinja2.exceptions.TemplateError as exc:
            raise InvalidRequest(f"the model's chat template refused this input: {exc}") from None

    def cut(self, rows: Sequence[list[int]], max_length: int, instruction: str | None = None) -> list[list[int]]:
        """Rendered conversations' ids cut at `max_length`, a row that reaches it ending with the template's tail."""
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
        """The tokens the template takes around empty contents."""
        empty = self.render([""] * len(self.roles), instruction)
        return len(self._tokenizer.encode(empty, add_special_tokens=False).ids)

    @lru_cache(maxsize=64)
    def tail(self, instruction: str | None) -> list[int]:
        """The ids every render ends with whatever the contents are: the common end of two renders with different
        fillers, [] where the renders never differ (no content in them) or share nothing."""
        first, second = ([*self._tokenizer.encode(self.render([filler] * len(self.roles), instruction),
                                                  add_special_tokens=False).ids]
                         for filler in ("0", "1 2 3 4"))
        count = 0
        for a, b in zip(reversed(first), reversed(second)):
            if a != b:
                break
            count += 1
        return first[len(first) - count:] if 0 < count < min(len(first), len(second)) else []
