"""Token embeddings: every token's final hidden state, before pooling (sentence-transformers'
output_value="token_embeddings", TEI's /embed_all)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.manifest import TOKEN_EMBEDDINGS
from encoderrt.runtime.requests import TextOrTexts, Truncation
from encoderrt.runtime.tasks.base import ModelContext, Plan, Request


@dataclass(frozen=True)
class TokenEmbedRequest(Request[list[np.ndarray]]):
    """Every token's final hidden state, one [tokens, hidden] array per text, special and prompt tokens included,
    as SentenceTransformer.encode(output_value="token_embeddings") returns them (TEI's /embed_all)."""

    texts: TextOrTexts
    truncate: Truncation = True
    prompt_name: str | None = None
    prompt: str | None = None
    truncation_side: Literal["right", "left"] = "right"

    def texts_for_sizing(self) -> Sequence[object]:
        return [self.texts] if isinstance(self.texts, str) else self.texts

    def plan(self, model: ModelContext) -> Plan[list[np.ndarray]]:
        model.require("embed_all", "embed", "hybrid")
        if TOKEN_EMBEDDINGS not in model.manifest.outputs:
            raise InvalidRequest(f"this artifact of {model.name} has no token embeddings output (compiled for "
                                 f"{model.manifest.target}, or by an older encoderrt); recompile it for cpu or openvino")
        tokenizer, cut = model.tokenizer_for(self.truncate)
        prefix = model.prompt(self.prompt_name, self.prompt)
        rows = model.with_adapter(model.prompted_rows(self.texts, prefix, tokenizer, cut, self.truncation_side),
                                  self.prompt_name)
        model.limit_token_vectors(rows, f"token embeddings ({model.manifest.shape.hidden_size} floats each)")
        return Plan(rows, lambda outputs: [output[TOKEN_EMBEDDINGS].astype(np.float32, copy=False) for output in outputs],
                    outputs=(TOKEN_EMBEDDINGS,))
