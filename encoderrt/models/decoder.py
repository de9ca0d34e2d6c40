"""What decoder families (Qwen3, Qwen2, Mistral, Llama, Gemma) share: pre-norm layers with RMSNorm, rotary positions, a
gated feed-forward (SwiGLU; Gemma's GeGLU), grouped-query attention, all run causal, and no segment input.

Decoders embed through their last token (sentence-transformers' `lasttoken` pooling, after the end-of-text token
their tokenizers append) and rerank through a causal LM's next-token logits. encoderrt pads on the right: a
causal model's real tokens never see the padding, and rotary attention depends only on distances, so its rows
equal the left-padded ones sentence-transformers runs.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from encoderrt.models.architecture import Architecture

Refusal = Callable[[Mapping[str, Any]], str | None]
"""What in a config.json a family cannot compile, or None."""


def _own_code(config: Mapping[str, Any]) -> str | None:
    remote = (config.get("auto_map") or {}).get("AutoModel")
    if remote:
        # gte-Qwen2's code, for one, makes the attention bidirectional: transformers' class would serve other vectors
        return (f"the folder's own model code ({remote}, auto_map): encoderrt runs transformers' {config.get('model_type')} "
                "class, which may attend differently; export the model with transformers' classes first")
    return None


def decoder(name: str, *model_types: str, layer_gelus: int = 0, unsupported: Refusal | None = None) -> Architecture:
    """The Architecture of a decoder family whose transformers class calls attention through its interface;
    `layer_gelus`: 1 where the feed-forward gates with GELU (GeGLU); `unsupported`: the family's own refusals, asked
    before the shared one (a folder with model code of its own)."""

    def refusal(config: Mapping[str, Any]) -> str | None:
        return (unsupported(config) if unsupported else None) or _own_code(config)

    return Architecture(
        name=name,
        model_types=model_types or (name,),
        uses_token_type_ids=False,
        classifier_input="first_token",
        position_offset_from_padding=False,
        layer_gelus=layer_gelus,
        rms_norm=True,
        attention_interface=True,
        causal=True,
        unsupported=refusal,
    )
