"""RoBERTa, XLM-RoBERTa and CamemBERT (RoBERTa's graph under its own name): no segment input, and
positions that start after padding_idx.

jina-embeddings-v3's original folder says `xlm-roberta` too, but its rotary positions and in-weight LoRA need
its remote code; transformers would load it as XLM-R with those weights missing, so it is refused, naming the
family that serves it."""

from __future__ import annotations

from typing import Any, Mapping

from encoderrt.models.architecture import Architecture


def _unsupported(config: Mapping[str, Any]) -> str | None:
    if config.get("position_embedding_type") == "rotary" or "lora_adaptations" in config:
        return ("rotary positions (jina-embeddings-v3's remote-code checkpoint); encoderrt compiles it as transformers' "
                "jina_embeddings_v3, with its task adapters as PEFT folders beside the weights")
    return None


ARCHITECTURE = Architecture(
    name="roberta",
    model_types=("roberta", "xlm-roberta", "camembert"),
    uses_token_type_ids=False,
    classifier_input="first_token",
    position_offset_from_padding=True,
    packed_layout=True,
    unsupported=_unsupported,
)
