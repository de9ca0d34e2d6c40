"""Tokenisation with the artifact's fast tokenizer, and padding of a batch into engine feeds.

A `tokenizers.Tokenizer` keeps truncation as mutable state, so this wrapper builds one instance
per truncation rule at load and never changes them afterwards: safe to share between threads,
and the batch encoder releases the GIL.

Pairs are assembled from separately tokenised texts with the tokenizer's own post-processor, so
a query shared by many documents (rerank, 1:N score) is tokenised once.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
from tokenizers import Encoding, Tokenizer

from encoderrt.runtime.chat_template import PAIR_ROLES, TEXT_ROLES, ChatRenderer, ChatTemplate, MessageFormat
from encoderrt.runtime.errors import InputTooLong, InvalidRequest

TOKENIZER_FILE = "tokenizer.json"
POOLING_START = "pooling_start"
"""The graph input of a model whose pooling leaves the prompt out (sentence-transformers' include_prompt: false):
per row, the first position pooling counts."""
ADAPTER = "adapter"
"""The graph input of a model with task adapters (compile/adapters.py): per row, 1 + the index of its task in the
manifest's `adapters`, 0 for none."""
ROW_INPUTS = (POOLING_START, ADAPTER)
"""Graph inputs of one value per row, each a `Tokens` field of the same name."""


class Tokens(NamedTuple):
    """One engine row: token ids and segment ids, special tokens included."""

    ids: list[int]
    type_ids: list[int]
    pooling_start: int = 0
    """Positions before this are attended to but not pooled (the prompt, where the model excludes it)."""
    adapter: int = 0
    """The task adapter this row runs with (ADAPTER), 0 for none."""
    attended: int = -1
    """How many leading tokens the encoder attends to, -1 for all: a ColBERT query's expansion tokens after them
    are run (their vectors are scored) but not attended to."""


def _load(path: Path) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


SEQUENTIAL_TEXTS = 8
SEQUENTIAL_CHARS = 4096
"""Up to SEQUENTIAL_TEXTS texts of SEQUENTIAL_CHARS characters in all are tokenised on the calling thread, one
by one. encode_batch hands even a single text to its thread pool and waits for it; on a server whose cores
are busy running batches, the woken pool thread waits for a core, and a one-query request spent 600 us in
encode_batch on the event loop (47 us on an idle machine; 2-core EPYC, 32 clients). `encode` holds the GIL,
though, so long texts still go to encode_batch, which releases it: its `_fast` form, which leaves out the characters'
offsets (nothing here reads them) for 15% less tokenizer CPU (20,000 passages, all-MiniLM-L6-v2: 2.0 core-seconds
against 2.35, the same ids)."""


def _encode_all(tokenizer: Tokenizer, texts: Sequence[str], add_special_tokens: bool = True) -> list[Encoding]:
    try:
        if len(texts) <= SEQUENTIAL_TEXTS and sum(map(len, texts)) <= SEQUENTIAL_CHARS:
            return [tokenizer.encode(text, add_special_tokens=add_special_tokens) for text in texts]
        return tokenizer.encode_batch_fast(list(texts), add_special_tokens=add_special_tokens)
    except TypeError:
        _check_unicode(texts)
        raise


def _check_unicode(texts: Sequence[str]) -> None:
    """A text the tokenizer refused (a TypeError of its own) for a lone surrogate, which a Python str may hold and
    no UTF-8 text does, is the caller's error, named; found only after a refusal, so tokenising pays nothing."""
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidRequest(f"a text is not valid Unicode: it holds a lone surrogate ({text[exc.start]!r}) at "
                                 f"character {exc.start}, after {text[max(0, exc.start - 20):exc.start]!r}") from None


def _tokens(encoding: Encoding) -> Tokens:
    return Tokens(encoding.ids, encoding.type_ids)


MEMO_CHARS = 256
"""Texts up to this many characters (queries, with their prompt) are remembered where the tokenizer has a memo."""


class TokensMemo(Protocol):
    """Where a tokenizer remembers how short texts tokenised (the engine's result cache, runtime/result_cache.py):
    search traffic repeats its queries, and tokenising one is 40-80 us of the event loop a request."""

    def tokens(self, key: tuple[Hashable, ...]) -> Tokens | None: ...

    def keep_tokens(self, key: tuple[Hashable, ...], tokens: Tokens) -> None: ...


def check_token_ids(index: int, ids: Sequence[int], vocab_size: int) -> None:
    for token in ids:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
            raise InvalidRequest(f"token ids of input {index} must be integers from 0 to {vocab_size - 1}; got {token!r}")


class TextTokenizer:
    def __init__(self, tokenizer_file: str | Path, max_length: int, pad_token_id: int, input_names: Sequence[str],
                 limit_owner: str = "the model's", chat_template: ChatTemplate | None = None,
                 text_messages: MessageFormat | None = None, memo: TokensMemo | None = None):
        """`memo`: where short texts' tokens are remembered (MEMO_CHARS), None: nowhere."""
        path = Path(tokenizer_file)
        self.path = path
        self.max_length = max_length
        self.limit_owner = limit_owner
        """Whose limit max_length is, for the over-long error: the model's, or a request's own."""
        self.pad_token_id = pad_token_id
        self.input_names = tuple(input_names)
        self.chat_template = chat_template
        self.text_messages = text_messages
        self.memo = memo
        self._plain = _load(path)
        self._renderer = (ChatRenderer(chat_template, self._plain, PAIR_ROLES, text_messages or "flat")
                          if chat_template else None)
        """A causal-LM reranker's pairs go through its chat template (runtime/chat_template.py), and a cross-encoder's
        where its sentence-transformers folder reads inputs as chat messages."""
        self._texts = ChatRenderer(chat_template, self._plain, TEXT_ROLES, text_messages) if text_messages else None
        """An embedder's texts go through it, where its sentence-transformers folder says so."""
        self._truncating = _load(path)
        self._truncating.enable_truncation(max_length, strategy="longest_first")
        self._truncating_left = _load(path)  # keeps a text's end (Cohere's truncate=START, TEI's Left)
        self._truncating_left.enable_truncation(max_length, strategy="longest_first", direction="left")
        self._cut_second = _load(path)
        self._cut_second.enable_truncation(max_length, strategy="only_second")
        self.pair_special_tokens = self._plain.num_special_tokens_to_add(is_pair=True)

    @classmethod
    def for_artifact(cls, manifest: Any, artifact_dir: str | Path, memo: TokensMemo | None = None) -> "TextTokenizer":
        """The tokenizer an artifact's manifest describes."""
        return cls(Path(artifact_dir) / TOKENIZER_FILE, manifest.max_length, manifest.pad_token_id, manifest.inputs,
                   chat_template=manifest.chat_template, text_messages=manifest.text_messages, memo=memo)

    @lru_cache(maxsize=8)
    def limited(self, max_length: int) -> "TextTokenizer":
        """A tokenizer that truncates at `max_length` (<= the model's limit), for per-request truncation."""
        if max_length == self.max_length:
            return self
        return TextTokenizer(self.path, max_length, self.pad_token_id, self.input_names, "the request's",
                             self.chat_template, self.text_messages, self.memo)

    def from_ids(self, token_ids: Sequence[Sequence[int]], vocab_size: int, truncate: bool = True) -> list[Tokens]:
        """Rows from caller-supplied token ids, used as given (special tokens are the caller's)."""
        rows = []
        for index, ids in enumerate(token_ids):
            ids = list(ids)
            check_token_ids(index, ids, vocab_size)
            if not ids:
                raise InvalidRequest(f"input {index} has no token ids")
            if len(ids) > self.max_length:
                if not truncate:
                    raise InputTooLong(index, len(ids), self.max_length, self.limit_owner)
                ids = ids[: self.max_length]
            rows.append(Tokens(ids, [0] * len(ids)))
        return rows

    def encode(self, texts: Sequence[str], truncate: bool = True, check_length: bool = True,
               side: str = "right", prompt: str = "") -> list[Tokens]:
        """Without truncation an over-long text is InputTooLong, unless check_length is off (tokenize endpoints);
        truncation cuts the end (side "right") or the start ("left") of the text, special tokens kept. `prompt` goes
        in front of each text, or, where texts are chat messages, in a system message before it."""
        if self._texts is not None:
            return self._encode_messages(texts, truncate, check_length, side, prompt)
        texts = [prompt + text for text in texts] if prompt else texts
        if truncate:
            rule, tokenizer = ("left", self._truncating_left) if side == "left" else ("right", self._truncating)
            return self._encoded(rule, tokenizer, texts)
        encodings = self._encoded("whole", self._plain, texts)
        if check_length:
            self._check_lengths(encodings)
        return encodings

    def _encoded(self, rule: str, tokenizer: Tokenizer, texts: Sequence[str]) -> list[Tokens]:
        """`texts` by `tokenizer`, whose truncation `rule` names; a few short ones through the memo."""
        memo = self.memo
        if memo is None or len(texts) > SEQUENTIAL_TEXTS or any(len(text) > MEMO_CHARS for text in texts):
            return [_tokens(e) for e in _encode_all(tokenizer, texts)]
        rows = []
        for text in texts:
            key = (self.max_length, rule, text)
            row = memo.tokens(key)
            if row is None:
                row = _tokens(_encode_all(tokenizer, [text])[0])
                memo.keep_tokens(key, row)
            rows.append(row)
        return rows

    def _encode_messages(self, texts: Sequence[str], truncate: bool, check_length: bool, side: str,
                         prompt: str) -> list[Tokens]:
        """Texts rendered through the chat template, cut on the right with its tail written back, as
        sentence-transformers cuts them (it has no other side for a chat message)."""
        if truncate and side != "right":
            raise InvalidRequest("this model reads each text inside its chat template, which is cut at its end: "
                                 "truncation from the left (the start of the text) is not available for it")
        return self._rendered(self._texts, [[text] for text in texts], prompt, truncate, check_length)

    def _rendered(self, renderer: ChatRenderer, conversations: Sequence[Sequence[str]], prompt: str, truncate: bool,
                  check_length: bool = True) -> list[Tokens]:
        """Each conversation's contents rendered through `renderer` (the prompt as its instruction) and tokenised
        without special tokens; truncation cuts with the template's tail written back, else an over-long one is
        InputTooLong unless check_length is off."""
        instruction = prompt or None
        rendered = [renderer.render(contents, instruction) for contents in conversations]
        ids = [encoding.ids for encoding in _encode_all(self._plain, rendered, add_special_tokens=False)]
        rows = [Tokens(row, [0] * len(row)) for row in (renderer.cut(ids, self.max_length, instruction) if truncate
                                                        else ids)]
        if check_length and not truncate:
            self._check_lengths(rows)
        return rows

    def words(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids without special tokens, uncut (an inference-free sparse model's queries)."""
        return [encoding.ids for encoding in _encode_all(self._plain, texts, add_special_tokens=False)]

    def encode_chunks(self, texts: Sequence[str]) -> list[list[Tokens]]:
        """Each text as consecutive chunks of at most max_length tokens, each with the special tokens."""
        if self._texts is not None:
            raise InvalidRequest("this model reads each text inside its chat template: a long text cannot be read "
                                 "in chunks; truncate it instead")
        return [[_tokens(e), *map(_tokens, e.overflowing)] for e in _encode_all(self._truncating, texts)]

    def encode_pairs(self, firsts: Sequence[str], seconds: Sequence[str], truncate: bool = True,
                     prompt: str = "") -> list[Tokens]:
        """Encode (query, document) pairs; truncation cuts the document, or both if the query alone is too long.

        `prompt` goes where sentence-transformers' CrossEncoder puts it: in front of each query, or, through a chat
        template, in a system message (the instruction of Qwen3-Reranker's kind)."""
        if len(firsts) != len(seconds):
            raise ValueError(f"{len(firsts)} first texts for {len(seconds)} second texts")
        if self._renderer is not None:
            return self._rendered(self._renderer, list(zip(firsts, seconds)), prompt, truncate)
        if prompt:
            firsts = [prompt + first for first in firsts]
        unique_firsts = list(dict.fromkeys(firsts))
        first_encodings = dict(zip(unique_firsts, _encode_all(self._plain, unique_firsts, add_special_tokens=False)))
        second_encodings = _encode_all(self._plain, seconds, add_special_tokens=False)
        pairs = []
        for first, second in zip(firsts, second_encodings):
            query = first_encodings[first]
            if not truncate:
                tokenizer = self._plain
            elif len(query.ids) + self.pair_special_tokens < self.max_length:
                tokenizer = self._cut_second
            else:  # only_second fails when the query leaves no room for even one document token
                tokenizer = self._truncating
            pairs.append(_tokens(tokenizer.post_process(query, second)))
        if not truncate:
            self._check_lengths(pairs)
        return pairs

    def pair_overhead(self, prompt: str = "") -> tuple[int, str]:
        """The tokens a pair takes besides its texts, and what takes them: the special tokens, or the chat template."""
        if self._renderer is not None:
            return self._renderer.overhead(prompt or None), "the chat template"
        return self.pair_special_tokens, "its special tokens"

    def decode(self, batch: Sequence[Sequence[int]], vocab_size: int, skip_special_tokens: bool = True) -> list[str]:
        for index, ids in enumerate(batch):
            check_token_ids(index, ids, vocab_size)
        return self._plain.decode_batch([list(ids) for ids in batch], skip_special_tokens=skip_special_tokens)

    @lru_cache(maxsize=64)
    def prompt_length(self, prompt: str) -> int:
        """The tokens a prompt occupies at the start of a prompted text, by sentence-transformers' rule: the prompt
        tokenised alone, special tokens included, less a trailing special token (the [SEP] that closes it)."""
        if not prompt or self._texts is not None:  # in a system message, pooled with the rest (as in s-t)
            return 0
        encoding = self._plain.encode(prompt)
        trailing = 1 if encoding.special_tokens_mask and encoding.special_tokens_mask[-1] else 0
        return len(encoding.ids) - trailing

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Token counts with special tokens and without truncation."""
        return [len(e.ids) for e in _encode_all(self._plain, texts)]

    def _check_lengths(self, rows: Sequence[Tokens]) -> None:
        for index, row in enumerate(rows):
            if len(row.ids) > self.max_length:
                raise InputTooLong(index, len(row.ids), self.max_length, self.limit_owner)

    def pad(self, rows: Sequence[Tokens]) -> dict[str, np.ndarray]:
        """Right-pad to the longest row; feeds hold exactly the inputs the graph declares."""
        width = max((len(r.ids) for r in rows), default=0)
        input_ids = np.full((len(rows), width), self.pad_token_id, dtype=np.int64)
        attention_mask = np.zeros((len(rows), width), dtype=np.int64)
        token_type_ids = np.zeros((len(rows), width), dtype=np.int64)
        for row, tokens in enumerate(rows):
            n = len(tokens.ids)
            input_ids[row, :n] = tokens.ids
            attention_mask[row, : n if tokens.attended < 0 else tokens.attended] = 1
            token_type_ids[row, :n] = tokens.type_ids
        all_feeds = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        for name in ROW_INPUTS:
            if name in self.input_names:
                all_feeds[name] = np.array([getattr(tokens, name) for tokens in rows], dtype=np.int64)
        return {name: all_feeds[name] for name in self.input_names}
