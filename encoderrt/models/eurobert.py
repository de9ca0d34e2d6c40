"""EuroBERT (EuroBERT-210m/610m/2.1B and fine-tunes): a Llama-style encoder, pre-norm layers with RMSNorm,
rotary positions, a SwiGLU feed-forward, grouped-query attention, 8,192 positions, no segment input.

The classification head is dense + GELU + classifier over the first token, the mean of the tokens, or each
token then averaged (`classifier_pooling` "bos", "mean", "late"): one GELU, and no GELU in the layers.
"""

from __future__ import annotations

from encoderrt.models.architecture import Architecture

ARCHITECTURE = Architecture(
    name="eurobert",
    model_types=("eurobert",),
    uses_token_type_ids=False,
    classifier_input="first_token",
    position_offset_from_padding=False,
    layer_gelus=0,
    rms_norm=True,
    head_gelus=1,
    attention_interface=True,
)
