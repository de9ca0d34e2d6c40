"""ModernBERT (gte-modernbert, modernbert-embed): rotary positions, no biases, GeGLU, and attention that
alternates between global layers (every `global_attn_every_n_layers`-th, their own rotary base) and
sliding-window layers (`local_attention` tokens wide), up to 8,192 positions. No segment input.

transformers builds one mask per layer type (padding, and the window for local layers) and applies
rotary to q and k before its attention function, which models/attention.py takes over.

The classification head is dense + GELU + LayerNorm over the CLS state or the mean of the tokens
(`classifier_pooling`), then the classifier: one GELU more than the layers.
"""

from __future__ import annotations

from encoderrt.models.architecture import Architecture

ARCHITECTURE = Architecture(
    name="modernbert",
    model_types=("modernbert",),
    uses_token_type_ids=False,
    classifier_input="first_token",
    position_offset_from_padding=False,
    head_gelus=1,
    attention_interface=True,
)
