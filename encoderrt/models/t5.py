"""T5 encoders (GTR, sentence-T5, and other T5EncoderModel embedders): RMSNorm without a bias, no absolute
positions but a relative-position bias over log-spaced distance buckets, computed by the first layer and added
to every layer's unscaled scores; a ReLU feed-forward (T5 v1.0) or a GELU-gated one (v1.1). No segment input.

transformers calls T5's attention through its AttentionInterface with the bias beside the mask, so export
hands both to models/attention.py's one op. The bare encoder is T5EncoderModel, as sentence-transformers loads
it: AutoModel would build the encoder-decoder. T5's sequence classifier reads the decoder, so only embedding
models are compiled.
"""

from __future__ import annotations

from typing import Any, Mapping

from encoderrt.models.architecture import Architecture


def _gelus(config: Mapping[str, Any]) -> int:
    return int("gelu" in str(config.get("feed_forward_proj", "relu")))


def _unsupported(config: Mapping[str, Any]) -> str | None:
    if "T5ForSequenceClassification" in (config.get("architectures") or []):
        return ("T5's sequence classifier reads its decoder; encoderrt compiles T5 encoders (T5EncoderModel) as "
                "embedding models")
    return None


ARCHITECTURE = Architecture(
    name="t5",
    model_types=("t5",),
    uses_token_type_ids=False,
    classifier_input="first_token",
    position_offset_from_padding=False,
    config_aliases={"hidden_size": "d_model", "num_hidden_layers": "num_layers", "num_attention_heads": "num_heads",
                    "intermediate_size": "d_ff", "max_position_embeddings": "n_positions", "head_dim": "d_kv"},
    layer_gelus_of=_gelus,
    rms_norm=True,
    attention_interface=True,
    encoder_class="T5EncoderModel",
    unsupported=_unsupported,
)
