"""NomicBERT (nomic-embed-text-v1, v1.5): BERT's embeddings and post-norm layers with rotary positions instead
of a position table, a SwiGLU feed-forward and no biases; 2,048 positions in transformers' config (8,192 with
the hub's rotary scaling). Segment embeddings, and a BERT pooler under the classification head.

Its prompts (`search_query: `, `search_document: `, ...) come from the folder's sentence-transformers config,
as for every family.
"""

from __future__ import annotations

from encoderrt.models.architecture import Architecture

ARCHITECTURE = Architecture(
    name="nomic_bert",
    model_types=("nomic_bert",),
    uses_token_type_ids=True,
    classifier_input="pooler",
    position_offset_from_padding=False,
    layer_gelus=0,
    attention_interface=True,
)
