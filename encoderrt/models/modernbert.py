"""ModernBERT (gte-modernbert, modernbert-embed): rotary positions, no biases, GeGLU, and attention that
alternates between global layers (every `global_attn_every_n_layers`-th, their own rotary base) and
sliding-window layers (`local_attention` tokens wide), up to 8,192 positions. No segment input.

transformers builds one mask per layer type (padding, and the window for local layers) and applies
rotary to q and k before its attention function. Export swaps in an attention function that hands
the rotated q, k, v and the layer's additive mask to models/attention.py's biased attention:
onnxruntime's MultiHeadAttention with the mask as its bias, or SDPA with it for OpenVINO and
TensorRT. The mask must be additive (eager's finite minimum): with transformers' boolean SDPA mask,
a padded query whose whole window is padding has no key left, OpenVINO's SDPA returns NaN for it,
and the NaN survives mean pooling (NaN x 0).

The classification head is dense + GELU + LayerNorm over the CLS state or the mean of the tokens
(`classifier_pooling`), then the classifier: one GELU more than the layers.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from encoderrt.models.architecture import Architecture


@cache
def _register(export: str) -> str:
    """The name of the attention implementation for `export`, registered with transformers."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    from encoderrt.models.attention import biased_attention

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        """transformers hands [B, heads, S, head_dim] and an additive [B, 1, S, S] mask; returns [B, S, heads, head_dim]."""
        batch, heads, sequence, head_dim = query.shape
        q, k, v = (t.transpose(1, 2).reshape(batch, sequence, heads * head_dim) for t in (query, key, value))
        out = biased_attention(q, k, v, None, attention_mask, heads, export)
        return out.view(batch, sequence, heads, head_dim), None

    name = f"encoderrt_biased_{export}"
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, eager_mask)  # the additive float mask eager attention takes
    return name


def _rewrite_attention(model: Any, export: str) -> None:
    encoder = next(module for module in model.modules() if hasattr(module, "set_attn_implementation"))
    encoder.set_attn_implementation(_register(export))


ARCHITECTURE = Architecture(
    name="modernbert",
    model_types=("modernbert",),
    uses_token_type_ids=False,
    classifier_input="first_token",
    position_offset_from_padding=False,
    head_gelus=1,
    rewrite_attention=_rewrite_attention,
)
