"""Quantised embeddings as Cohere's embed API and sentence-transformers' `quantize_embeddings` define them.

binary / ubinary: one bit per dimension (value > 0), packed eight to a byte, as int8 (minus 128) or uint8.
int8 / uint8: each dimension mapped linearly from its [min, max] onto 256 steps. The ranges come from the
model's own embeddings of built-in calibration texts (runtime/texts.py; sentence-transformers'
`calibration_embeddings`), never from the request's batch, so a text quantises the same in every
request; values beyond the calibrated range clip to its ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Literal, get_args

import numpy as np

from encoderrt.runtime.texts import calibration_texts

Precision = Literal["float32", "int8", "uint8", "binary", "ubinary"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
_STEPS = 255


def ranges_of(calibration: np.ndarray) -> np.ndarray:
    """Per-dimension [min, max] rows (2, dim) of calibration embeddings."""
    return np.vstack((calibration.min(axis=0), calibration.max(axis=0)))


def quantize(vectors: np.ndarray, precision: str, ranges: np.ndarray | None = None) -> np.ndarray:
    if precision == "float32":
        return vectors.astype(np.float32, copy=False)
    if precision in ("binary", "ubinary"):
        packed = np.packbits(vectors > 0, axis=-1)
        return (packed.astype(np.int16) - 128).astype(np.int8) if precision == "binary" else packed
    if precision not in ("int8", "uint8"):
        raise ValueError(f"unknown embedding precision '{precision}'; expected one of {', '.join(PRECISIONS)}")
    assert ranges is not None, "int8 and uint8 need calibrated ranges"
    ranges = ranges.astype(np.float32, copy=False)  # sentence-transformers' arithmetic, step for step
    starts = ranges[0]
    steps = (ranges[1] - starts) / _STEPS
    levels = np.clip(np.floor((vectors - starts) / np.where(steps == 0, 1, steps)), 0, _STEPS)
    return (levels - 128).astype(np.int8) if precision == "int8" else levels.astype(np.uint8)


class EmbeddingQuantizer:
    """One model's calibrated ranges, computed on first use for each (normalize, dimensions) and kept."""

    def __init__(self, embed: Callable[[list[str], bool | None, int | None], np.ndarray]):
        self._embed = embed
        self._ranges: dict[tuple[bool | None, int | None], np.ndarray] = {}
        self._lock = threading.Lock()

    def ranges(self, normalize: bool | None = None, dimensions: int | None = None) -> np.ndarray:
        key = (normalize, dimensions)
        with self._lock:
            if key not in self._ranges:
                self._ranges[key] = ranges_of(self._embed(calibration_texts(), normalize, dimensions))
            return self._ranges[key]

    def quantize(self, vectors: np.ndarray, precision: str, normalize: bool | None = None,
                 dimensions: int | None = None) -> np.ndarray:
        ranges = self.ranges(normalize, dimensions) if precision in ("int8", "uint8") else None
        return quantize(vectors, precision, ranges)
