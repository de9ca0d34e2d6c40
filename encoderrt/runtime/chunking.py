"""Long inputs embedded in chunks (opt-in, as vLLM's chunked processing): a text longer than the model's limit
is cut into chunks that fit, each with the model's special tokens, embedded in the same batches as everything
else, and merged as the token-count-weighted mean of the chunk vectors (normalised afterwards, if the model
normalises). Usage counts every token of every chunk.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from encoderrt.runtime.tokenizer import TextTokenizer, Tokens


def chunk_rows(tokenizer: TextTokenizer, texts: Sequence[str]) -> tuple[list[Tokens], list[int]]:
    """Every text's chunks as rows, in order, and how many rows each text has (1 where it fits)."""
    chunks = tokenizer.encode_chunks(texts)
    return [row for text_chunks in chunks for row in text_chunks], [len(text_chunks) for text_chunks in chunks]


def merge_chunks(outputs: np.ndarray, rows: Sequence[Tokens], counts: Sequence[int]) -> np.ndarray:
    """One vector per text: its chunks' vectors weighted by their token counts."""
    merged, start = [], 0
    weights = np.array([len(row.ids) for row in rows], dtype=np.float64)
    for count in counts:
        part = slice(start, start + count)
        merged.append((outputs[part] * weights[part, None]).sum(axis=0) / weights[part].sum())
        start += count
    return np.asarray(merged, dtype=outputs.dtype).reshape(len(counts), outputs.shape[-1])
