"""MPNet (all-mpnet-base-v2 and its kin): no segment input, RoBERTa's position rule, and one
relative-position bias, computed once from the sequence length and added to every layer's scores.

onnxruntime's optimizer does not match attention with that bias, and transformers runs MPNet with
eager attention only, so export routes each layer through models/attention.py's biased attention:
onnxruntime's MultiHeadAttention with the bias as an input, or SDPA for OpenVINO and TensorRT.
"""

from __future__ import annotations

import types
from typing import Any

from encoderrt.models.architecture import Architecture


def _rewrite_attention(model: Any, export: str) -> None:
    from transformers.models.mpnet.modeling_mpnet import MPNetSelfAttention

    from encoderrt.models.attention import biased_attention, key_padding_mask

    def forward(self, hidden_states, attention_mask=None, position_bias=None, output_attentions=False, **kwargs):
        q, k, v = self.q(hidden_states), self.k(hidden_states), self.v(hidden_states)
        bias = position_bias[:1]  # the same for every row of the batch
        attended = biased_attention(q, k, v, key_padding_mask(attention_mask, hidden_states), bias,
                                    self.num_attention_heads, export)
        return (self.o(attended),)

    for module in model.modules():
        if isinstance(module, MPNetSelfAttention):
            module.forward = types.MethodType(forward, module)


ARCHITECTURE = Architecture(
    name="mpnet",
    model_types=("mpnet",),
    uses_token_type_ids=False,
    classifier_input="first_token",
    position_offset_from_padding=True,
    sdpa=False,
    rewrite_attention=_rewrite_attention,
)
