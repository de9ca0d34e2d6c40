"""jina-embeddings-v3: XLM-RoBERTa's vocabulary and post-norm layers with rotary positions instead of a position
table, 8,192 tokens, and a LoRA adapter per task (`retrieval.query`, `retrieval.passage`, `separation`,
`classification`, `text-matching`) that a request picks by its prompt_name, the same name as the task's prompt.

The adapters are PEFT folders beside the weights, compiled into the one graph (compile/adapters.py); its
Matryoshka widths are the request's `dimensions`. One segment (type_vocab_size 1), so the graph takes no
segment input; XLM-R's classification head reads the first token.
"""

from __future__ import annotations

from encoderrt.models.architecture import Architecture
from encoderrt.models.gte import single_segment

ARCHITECTURE = Architecture(
    name="jina_embeddings_v3",
    model_types=("jina_embeddings_v3",),
    uses_token_type_ids=False,
    classifier_input="first_token",
    position_offset_from_padding=False,
    attention_interface=True,
    unsupported=single_segment,
)
