"""What encoderrt needs to know about one transformer family.

An `Architecture` holds the facts that differ between BERT-like families and nothing else:
which inputs the graph takes, where position ids start, and how long a sequence may be.
Everything else (export, fusion, batching) is shared and reads these facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping


@dataclass(frozen=True)
class Architecture:
    name: str
    model_types: tuple[str, ...]
    """Values of config.json's `model_type` that this family covers."""
    uses_token_type_ids: bool
    """BERT cross-encoders put the second text of a pair in segment 1; dropping the ids changes scores."""
    position_offset_from_padding: bool
    """RoBERTa counts positions from padding_idx + 1, which costs padding_idx + 1 slots of the table."""
    classifier_input: Literal["pooler", "first_token"]
    """What the sequence-classification head reads: BERT's pooler output, or RoBERTa's first-token state.

    The padded graph runs transformers' own head; the packed graph rebuilds the call from this.
    """
    fusion_model_type: str = "bert"
    """onnxruntime.transformers optimizer family whose fusion patterns fit this graph."""

    @property
    def input_names(self) -> tuple[str, ...]:
        if self.uses_token_type_ids:
            return ("input_ids", "attention_mask", "token_type_ids")
        return ("input_ids", "attention_mask")

    def position_offset(self, config: Mapping[str, Any]) -> int:
        """The position id of a sequence's first token."""
        return int(config.get("pad_token_id", 1)) + 1 if self.position_offset_from_padding else 0

    def max_positions(self, config: Mapping[str, Any]) -> int:
        """The longest sequence (special tokens included) the position table can address."""
        return int(config.get("max_position_embeddings", 512)) - self.position_offset(config)
