"""Classification: each text's label, probabilities and logits, by the model's activation (a classifier's softmax, or
sigmoid for each label of a multi-label one, as transformers' text-classification pipeline applies them; a
cross-encoder's own)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from encoderrt.runtime.postprocess import ACTIVATIONS
from encoderrt.runtime.requests import TextOrTexts, Truncation, as_texts
from encoderrt.runtime.tasks.base import ModelContext, Plan, Request


@dataclass(frozen=True)
class Classification:
    label: str
    probs: list[float]
    logits: list[float]


@dataclass(frozen=True)
class ClassifyRequest(Request[list[Classification]]):
    """One Classification per text."""

    texts: TextOrTexts
    truncate: Truncation = True

    def texts_for_sizing(self) -> Sequence[object]:
        return [self.texts] if isinstance(self.texts, str) else self.texts

    def plan(self, model: ModelContext) -> Plan[list[Classification]]:
        model.require("classify", "classify", "score")
        labels = model.manifest.labels
        tokenizer, cut = model.tokenizer_for(self.truncate)
        rows = tokenizer.encode(as_texts(self.texts, "texts"), cut)
        activation = ACTIVATIONS[model.manifest.activation]

        def classified(outputs: np.ndarray) -> list[Classification]:
            return [Classification(labels[int(np.argmax(p))], p.astype(float).tolist(), row.astype(float).tolist())
                    for p, row in zip(activation(outputs), outputs)]

        return Plan(rows, classified)
