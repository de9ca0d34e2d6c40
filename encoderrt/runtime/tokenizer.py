"""Tokenisation with the artifact's fast tokenizer, and padding of a batch into engine feeds.

A `tokenizers.Tokenizer` keeps truncation as mutable state, so this wrapper builds one instance
per truncation rule at load and never changes them afterwards: safe to share between threads,
and the batch encoders release the GIL.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

TOKENIZER_FILE = "tokenizer.json"


class InputTooLong(ValueError):
    def __init__(self, index: int, length: int, limit: int):
        super().__init__(
            f"input {index} is {length} tokens long, above the model's limit of {limit} tokens; "
            "shorten it or allow truncation"
        )
        self.index, self.length, self.limit = index, length, limit


def _load(path: Path) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


class TextTokenizer:
    def __init__(self, tokenizer_file: str | Path, max_length: int, pad_token_id: int, input_names: Sequence[str]):
        path = Path(tokenizer_file)
        self.max_length = max_length
        self.pad_token_id = pad_token_id
        self.input_names = tuple(input_names)
        self._plain = _load(path)
        self._truncating = _load(path)
        self._truncating.enable_truncation(max_length, strategy="longest_first")
        self._cut_second = _load(path)
        self._cut_second.enable_truncation(max_length, strategy="only_second")
        self._pair_specials = self._plain.num_special_tokens_to_add(is_pair=True)

    def encode(self, texts: Sequence[str], truncate: bool = True) -> list[Encoding]:
        if truncate:
            return self._truncating.encode_batch(list(texts))
        encodings = self._plain.encode_batch(list(texts))
        self._check_lengths(encodings)
        return encodings

    def encode_pairs(self, firsts: Sequence[str], seconds: Sequence[str], truncate: bool = True) -> list[Encoding]:
        """Encode (query, document) pairs; truncation cuts the document, or both if the query alone is too long."""
        pairs = list(zip(firsts, seconds, strict=True))
        if not truncate:
            encodings = self._plain.encode_batch(pairs)
            self._check_lengths(encodings)
            return encodings
        first_lengths = [len(e.ids) for e in self._plain.encode_batch(list(firsts), add_special_tokens=False)]
        # only_second fails when the first text leaves no room for even one token of the second.
        too_long = [i for i, n in enumerate(first_lengths) if n + self._pair_specials >= self.max_length]
        if not too_long:
            return self._cut_second.encode_batch(pairs)
        long_set = set(too_long)
        cut_second = self._cut_second.encode_batch([p for i, p in enumerate(pairs) if i not in long_set])
        cut_both = self._truncating.encode_batch([pairs[i] for i in too_long])
        second_iter, both_iter = iter(cut_second), iter(cut_both)
        return [next(both_iter) if i in long_set else next(second_iter) for i in range(len(pairs))]

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Token counts with special tokens and without truncation."""
        return [len(e.ids) for e in self._plain.encode_batch(list(texts))]

    def _check_lengths(self, encodings: Sequence[Encoding]) -> None:
        for index, encoding in enumerate(encodings):
            if len(encoding.ids) > self.max_length:
                raise InputTooLong(index, len(encoding.ids), self.max_length)

    def pad(self, encodings: Sequence[Encoding]) -> dict[str, np.ndarray]:
        """Right-pad to the longest row; feeds hold exactly the inputs the graph declares."""
        rows = len(encodings)
        width = max((len(e.ids) for e in encodings), default=0)
        input_ids = np.full((rows, width), self.pad_token_id, dtype=np.int64)
        attention_mask = np.zeros((rows, width), dtype=np.int64)
        token_type_ids = np.zeros((rows, width), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            n = len(encoding.ids)
            input_ids[row, :n] = encoding.ids
            attention_mask[row, :n] = 1
            token_type_ids[row, :n] = encoding.type_ids
        all_feeds = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        return {name: all_feeds[name] for name in self.input_names}
