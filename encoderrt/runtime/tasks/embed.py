"""Embeddings, as SentenceTransformer.encode makes them: prompt, pooled vector, Matryoshka dimensions, normalising,
and int8 / binary precisions; long inputs cut or embedded in chunks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from encoderrt.runtime.chunking import chunk_rows, merge_chunks
from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.postprocess import shape_embeddings
from encoderrt.runtime.prompts import with_prompt
from encoderrt.runtime.quantization import PRECISIONS, Precision
from encoderrt.runtime.requests import TextOrTexts, Truncation, as_texts
from encoderrt.runtime.tasks.base import ModelContext, Plan, Request


@dataclass(frozen=True)
class EmbedRequest(Request[np.ndarray]):
    """Embeddings as SentenceTransformer.encode returns them: the model's default prompt applies unless prompt_name
    or prompt says otherwise; precision int8 / uint8 / binary / ubinary quantises as runtime/quantization.py says."""

    texts: TextOrTexts = ()
    normalize: bool | None = None
    """None: the model's default from the manifest."""
    dimensions: int | None = None
    """None: the model's default width (the folder's truncate_dim), else all of it."""
    truncate: Truncation = True
    prompt_name: str | None = None
    """One of the model's prompts; None: its default prompt, if it has one."""
    prompt: str | None = None
    """A prompt given verbatim, over prompt_name; "" turns the default prompt off."""
    precision: Precision = "float32"
    truncation_side: Literal["right", "left"] = "right"
    """Which end truncation cuts: "left" keeps a text's end (a prompt at its start is cut first, as TEI does)."""
    token_ids: Sequence[Sequence[int]] | None = None
    """Pre-tokenised input (OpenAI's token-array form), used as given instead of `texts` (no prompt added)."""

    def texts_for_sizing(self) -> Sequence[object]:
        return [self.texts] if isinstance(self.texts, str) else self.texts

    def plan(self, model: ModelContext) -> Plan[np.ndarray]:
        model.require("embed", "embed", "hybrid")
        check_dimensions(self.dimensions, model.manifest.shape.output_dim)
        if self.precision not in PRECISIONS:
            raise InvalidRequest(f"precision must be one of {', '.join(PRECISIONS)}; got {self.precision!r}")
        normalize = model.manifest.normalize if self.normalize is None else self.normalize
        tokenizer, cut = model.tokenizer_for(self.truncate)
        prefix = model.prompt(self.prompt_name, self.prompt)
        merge = None
        if self.token_ids is not None:
            if self.texts:
                raise InvalidRequest("give texts or token ids, not both")
            if self.prompt_name is not None or self.prompt:
                raise InvalidRequest("a prompt applies to texts, not to token ids")
            rows = tokenizer.from_ids(self.token_ids, model.manifest.shape.vocab_size, cut)
        elif model.chunk_long_inputs and isinstance(self.truncate, bool) and self.truncation_side == "right":
            # a per-request length, or an explicit cut at the start, still cuts
            rows, counts = chunk_rows(model.tokenizer, with_prompt(as_texts(self.texts, "texts"), prefix))
            if start := model.excluded_prompt_tokens(prefix):  # the prompt is in each text's first chunk
                firsts = set(np.cumsum([0, *counts[:-1]]).tolist())
                rows = [row._replace(pooling_start=start) if i in firsts else row for i, row in enumerate(rows)]
            merge = counts
        else:
            rows = model.pooled_after(prefix, model.prompted_rows(self.texts, prefix, tokenizer, cut, self.truncation_side))
        rows = model.with_adapter(rows, self.prompt_name)

        dimensions = self.dimensions if self.dimensions is not None else model.manifest.truncate_dim

        def finish(outputs: np.ndarray) -> np.ndarray:
            if merge is not None:
                outputs = merge_chunks(outputs, rows, merge)
            vectors = shape_embeddings(outputs, normalize, dimensions)
            if self.precision == "float32":
                return vectors
            return model.quantizer.quantize(vectors, self.precision, self.normalize, dimensions)

        return Plan(rows, finish, blocking_finish=self.precision in ("int8", "uint8"))


def check_dimensions(dimensions: int | None, width: int) -> None:
    if dimensions is None:
        return
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or not 1 <= dimensions <= width:
        raise InvalidRequest(f"dimensions must be an integer from 1 to {width}, the model's embedding size; got {dimensions!r}")
