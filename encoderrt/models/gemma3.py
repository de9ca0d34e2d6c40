"""EmbeddingGemma (embeddinggemma-300m): Gemma 3 run bidirectionally (`use_bidirectional_attention`), RMSNorm
around each sublayer and on q and k, rotary positions with a base per layer type, global layers and
sliding-window layers (the window on both sides of a token), GeGLU with tanh GELU, 2,048 positions. Its
sentence-transformers folder adds mean pooling, two Dense modules and prompts per task.

`gemma3_text` is also Gemma 3's causal language model: a folder without bidirectional attention is a decoder,
and is refused by name rather than served as an encoder.

transformers rotates q and k before its attention function, which models/attention.py takes over. Its masks
it builds with vmap over mask functions, which TorchScript cannot trace; Gemma3TextModel also takes them
ready-made, one per layer type, so export hands it both, built from the padding mask with plain tensor ops:
global layers see every real token, windowed ones the real tokens within `sliding_window` on either side.
"""

from __future__ import annotations

from typing import Any, Mapping

from encoderrt.models.architecture import Architecture


def _unsupported(config: Mapping[str, Any]) -> str | None:
    if not config.get("use_bidirectional_attention"):
        return ("causal attention (use_bidirectional_attention is not set): this is Gemma 3's language model, "
                "not an encoder such as EmbeddingGemma")
    if any("ForSequenceClassification" in name for name in config.get("architectures") or ()):
        return "a sequence-classification head (encoderrt compiles EmbeddingGemma's embedding model)"
    return None


def _ready_made_masks(model: Any, export: str) -> None:
    from encoderrt.models.attention import window_masks_ready_made

    window_masks_ready_made(model, "Gemma3TextModel", radius=lambda config: config.sliding_window - 1)


ARCHITECTURE = Architecture(
    name="gemma3",
    model_types=("gemma3_text",),
    uses_token_type_ids=False,
    classifier_input="first_token",
    position_offset_from_padding=False,
    rms_norm=True,
    attention_interface=True,
    rewrite_attention=_ready_made_masks,
    unsupported=_unsupported,
)
