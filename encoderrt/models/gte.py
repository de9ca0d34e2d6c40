"""GTE v1.5 and multilingual (gte-base-en-v1.5, gte-large-en-v1.5, gte-multilingual-base and its reranker,
snowflake-arctic-embed-m-v2.0): post-norm layers with rotary positions (NTK scaling in the config), a GeGLU
feed-forward, 8,192 positions. A BERT pooler under the classification head.

Segment embeddings exist only as one row (type_vocab_size 1) or not at all (gte-base-en-v1.5's 0), so the
graph takes no segment input; a folder with more than one segment is refused rather than served with every
token in segment 0. The hub's remote-code folders say `model_type: "new"`; transformers loads them once
config.json says "gte" (it renames the weights itself).
"""

from __future__ import annotations

from typing import Any, Mapping

from encoderrt.models.architecture import Architecture


def single_segment(config: Mapping[str, Any]) -> str | None:
    """A config with segments past 0, which a graph without a segment input would serve as segment 0."""
    if int(config.get("type_vocab_size") or 0) > 1:
        return f"type_vocab_size {config['type_vocab_size']} (segment ids past 0 are not compiled)"
    return None


ARCHITECTURE = Architecture(
    name="gte",
    model_types=("gte",),
    uses_token_type_ids=False,
    classifier_input="pooler",
    position_offset_from_padding=False,
    attention_interface=True,
    unsupported=single_segment,
)
