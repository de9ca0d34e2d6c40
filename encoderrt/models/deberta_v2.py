"""DeBERTa-v2 and v3 (mxbai-rerank, deberta-v3 cross-encoders): disentangled attention, where each layer's
scores add content-to-position and position-to-content terms computed from its own q and k against
shared relative-position embeddings, all scaled by 1/sqrt(3 head_dim). No absolute positions, and no
segment input in the checkpoints users run (type_vocab_size 0).

onnxruntime has no pattern for that attention. Export keeps transformers' computation of the two
position terms (ordinary MatMuls and gathers) and hands q, k, v, the padding and their sum as the
bias to models/attention.py's biased attention: one MultiHeadAttention (or SDPA) per layer.
The classification head is a pooler (dense + GELU on the first token) and the classifier.
"""

from __future__ import annotations

import types
from typing import Any, Mapping

from encoderrt.models.architecture import Architecture


def _rewrite_attention(model: Any, export: str) -> None:
    from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention

    from encoderrt.models.attention import biased_attention, key_padding_mask

    def forward(self, hidden_states, attention_mask, output_attentions=False, query_states=None, relative_pos=None,
                rel_embeddings=None):
        heads = self.num_attention_heads
        q, k, v = self.query_proj(hidden_states), self.key_proj(hidden_states), self.value_proj(hidden_states)
        query_layer, key_layer = self.transpose_for_scores(q, heads), self.transpose_for_scores(k, heads)
        scale_factor = 1 + ("c2p" in self.pos_att_type) + ("p2c" in self.pos_att_type)
        batch, sequence = hidden_states.shape[:2]
        if self.relative_attention:
            bias = self.disentangled_attention_bias(query_layer, key_layer, relative_pos, rel_embeddings, scale_factor)
            bias = bias.view(batch, heads, sequence, sequence)
        else:
            bias = hidden_states.new_zeros((1, 1, sequence, sequence))
        scale = (self.attention_head_size * scale_factor) ** -0.5
        attended = biased_attention(q, k, v, key_padding_mask(attention_mask.bool(), hidden_states), bias, heads, export,
                                    scale=scale)
        return (attended, None)

    for module in model.modules():
        if isinstance(module, DisentangledSelfAttention):
            module.forward = types.MethodType(forward, module)


def _unsupported(config: Mapping[str, Any]) -> str | None:
    if int(config.get("type_vocab_size", 0)) > 0:
        return "DeBERTa checkpoints with segment embeddings (type_vocab_size > 0) are not supported"
    if config.get("position_biased_input", False):
        return "DeBERTa checkpoints with absolute position embeddings (position_biased_input) are not supported"
    return None


ARCHITECTURE = Architecture(
    name="deberta-v2",
    model_types=("deberta-v2",),
    uses_token_type_ids=False,
    classifier_input="first_token",
    position_offset_from_padding=False,
    head_gelus=1,
    sdpa=False,
    rewrite_attention=_rewrite_attention,
    unsupported=_unsupported,
)
