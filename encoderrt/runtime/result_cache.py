"""Answers to rows run before, kept so a repeated row is answered without running it (EngineConfig.result_cache_mb).

Search traffic repeats itself: popular queries come back, and a rerank's candidate documents recur from one query
to the next. The scheduler already runs identical rows that wait together once; this keeps their answers after the
batch, in a least-recently-used table bounded by bytes. The key is the row as it runs (token ids, segment ids,
pooling start, adapter, attention) and the outputs asked for, so a prompt, a truncation rule or a task adapter that
changes the tokens is another entry by construction; what happens after the graph (normalising, Matryoshka
dimensions, quantising, scoring) runs on every request as before. An answer comes from whichever batch first ran the
row: batches of other shapes round the last bits differently (fp32) or more (dynamic int8), as any rerun would.

The same table remembers how short texts tokenised (the tokenizer's memo, `tokens` / `keep_tokens`), within the same
bound: a repeated query is then answered without tokenising it either, which was a fifth of a cached answer's cost on
the event loop.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

from encoderrt.runtime.tokenizer import Tokens

Answer = np.ndarray | dict[str, np.ndarray]
"""A row's answer as the scheduler delivers it: its row of the first output, or its outputs by name."""
ENTRY_BYTES = 256
"""What an entry costs beyond its key's bytes and its arrays' data: the bytes object, the array's header, the
table's node. tracemalloc over 10,000 pooled 384-wide answers of 12-token rows: 1,863 bytes an entry, of which
1,536 data and 107 key; keys of Python ints, as the scheduler's, had made it 2,450."""
TOKENS_ENTRY_BYTES = 400
"""What a remembered tokenisation costs beyond its text's characters and TOKEN_BYTES a token: the key tuple, the
Tokens, its two lists, the table's node."""
TOKEN_BYTES = 48
"""Per token: a pointer in each of the two lists, and an int object for ids past the small ones Python shares.
tracemalloc over 10,000 remembered texts, with their strings: 846 bytes an entry for 4-word ones (8.6 tokens; these
constants count 837), 2,221 for 30-word ones (34.6 tokens; counted 2,234)."""


def row_key(tokens: Tokens, outputs: tuple[str, ...]) -> bytes:
    """The row as it runs and the outputs asked for, in 4 bytes a token: the scheduler's tuple of Python ints costs
    about 48, so a 512-token passage's key would outweigh its pooled answer 16 times."""
    header = f"{len(tokens.ids)},{tokens.pooling_start},{tokens.adapter},{tokens.attended},{','.join(outputs)};"
    return header.encode() + array("i", tokens.ids).tobytes() + array("i", tokens.type_ids).tobytes()


def _nbytes(answer: Answer) -> int:
    return answer.nbytes if isinstance(answer, np.ndarray) else sum(output.nbytes for output in answer.values())


def _size(key: bytes, answer: Answer) -> int:
    return len(key) + _nbytes(answer) + ENTRY_BYTES


def _tokens_size(key: tuple[Hashable, ...], tokens: Tokens) -> int:
    """The text (the key's last part), its tokens, and the entry's own cost."""
    return len(str(key[-1])) + TOKEN_BYTES * len(tokens.ids) + TOKENS_ENTRY_BYTES


def _copy(answer: Answer) -> Answer:
    """Callers own what they get (a plan may work in place), and the table owns what it keeps."""
    return answer.copy() if isinstance(answer, np.ndarray) else {name: output.copy() for name, output in answer.items()}


class ResultCache:
    """A thread-safe LRU table of row answers by `row_key`, and of texts' tokens by the tokenizer's keys, holding at
    most `max_bytes` (keys, arrays and ENTRY_BYTES an answer; see TOKENS_ENTRY_BYTES for tokens)."""

    def __init__(self, max_bytes: int):
        if max_bytes < 1:
            raise ValueError(f"a result cache holds at least one byte, got {max_bytes}")
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._answers: OrderedDict[Hashable, tuple[Answer | Tokens, int]] = OrderedDict()
        """Each entry with the bytes it counts for."""
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._answers)

    def get(self, key: bytes) -> Answer | None:
        """A copy of the answer kept under `key`, now the most recently used; None if none is."""
        with self._lock:
            entry = self._answers.get(key)
            if entry is None:
                return None
            self._answers.move_to_end(key)
        return _copy(entry[0])  # type: ignore[arg-type]

    def tokens(self, key: tuple[Hashable, ...]) -> Tokens | None:
        """The tokens kept under the tokenizer's `key`, now the most recently used; shared, never changed (a row's
        variants are made with _replace)."""
        with self._lock:
            entry = self._answers.get(key)
            if entry is None:
                return None
            self._answers.move_to_end(key)
        return entry[0]  # type: ignore[return-value]

    def keep_tokens(self, key: tuple[Hashable, ...], tokens: Tokens) -> None:
        """Remember a text's tokens under the tokenizer's `key` (its rule and the text), within the bound."""
        self._keep(key, tokens, _tokens_size(key, tokens))

    def put(self, key: bytes, answer: Answer) -> None:
        """Keep a copy of `answer`, forgetting the least recently used past the bound; an answer bigger than the
        whole bound is not kept."""
        size = _size(key, answer)
        if size > self.max_bytes:
            return
        with self._lock:
            if key in self._answers:
                self._answers.move_to_end(key)
                return
        self._keep(key, _copy(answer), size)  # the copy outside the lock: the event loop's lookups must not wait on it

    def _keep(self, key: Hashable, kept: Answer | Tokens, size: int) -> None:
        if size > self.max_bytes:
            return
        with self._lock:
            if key in self._answers:  # another batch kept it meanwhile
                return
            self._answers[key] = (kept, size)
            self.nbytes += size
            while self.nbytes > self.max_bytes:
                _, (_, evicted) = self._answers.popitem(last=False)
                self.nbytes -= evicted
