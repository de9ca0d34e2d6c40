"""EmbeddingGemma 2 (embeddinggemma-2): a bidirectional Gemma encoder whose text tower carries its own projection to
the embedding width. Each layer is sandwich-normed attention and a GeGLU feed-forward, then a per-layer-input block
(a GELU-gated bottleneck mixing in a slice of a projection of the token embeddings) and a per-layer scalar.
Attention normalises q, k and v, scales by 1, and differs by layer type: windowed layers (a window of
`sliding_window` on each side of a token, inclusive) with more key-value heads, global layers with wider heads and
fewer; rotary positions with a base per type.

Its folder is the multimodal model (`embedding_gemma2`: text, vision and audio towers) or the text tower alone
(`embedding_gemma2_text`). encoderrt compiles the text path: the composite's sizes are read from its `text_config`,
and its text tower is exported alone, after the composite's own first step: a text's placeholder tokens for images,
video or audio are read as padding.

Export builds its masks as EmbeddingGemma's (models/gemma3.py), ready-made per layer type from the padding mask.
"""

from __future__ import annotations

from typing import Any, Mapping

from encoderrt.models.architecture import Architecture, TextTower


def _unsupported(config: Mapping[str, Any]) -> str | None:
    if any("ForSequenceClassification" in name for name in config.get("architectures") or ()):
        return "a sequence-classification head (encoderrt compiles EmbeddingGemma 2's embedding model)"
    return None


def _for_export(model: Any, export: str) -> None:
    """Masks ready-made per layer type, and RMSNorm as x * rsqrt(mean(x^2) + eps), the form onnxruntime fuses:
    transformers writes it with pow(-0.5), to match JAX, which no fusion pattern matches."""
    import torch

    from encoderrt.models.attention import window_masks_ready_made

    def rsqrt_norm(eps: float) -> Any:
        return lambda hidden_states: hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + eps)

    window_masks_ready_made(model, "EmbeddingGemma2TextModel", radius=lambda config: config.sliding_window)
    for module in model.modules():
        if type(module).__name__ == "EmbeddingGemma2RMSNorm":  # its epsilon is `eps` before transformers 5.25
            module._norm = rsqrt_norm(getattr(module, "variance_epsilon", getattr(module, "eps", None)))


ARCHITECTURE = Architecture(
    name="embedding_gemma2",
    model_types=("embedding_gemma2", "embedding_gemma2_text"),
    uses_token_type_ids=False,
    classifier_input="first_token",
    position_offset_from_padding=False,
    layer_gelus=2,
    rms_norm=True,
    attention_interface=True,
    rewrite_attention=_for_export,
    state_width="embedding_dim",
    text_tower=TextTower(config="text_config", module="language_model",
                         placeholders=("image_token_id", "video_token_id", "audio_token_id")),
    unsupported=_unsupported,
)
