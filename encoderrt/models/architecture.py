"""What encoderrt needs to know about one transformer family.

An `Architecture` holds the facts that differ between BERT-like families and nothing else:
which inputs the graph takes, where position ids start, how long a sequence may be, how its
config names the sizes, and what its graph is expected to fuse into.
Everything else (export, fusion, batching) is shared and reads these facts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping


@dataclass(frozen=True)
class TextTower:
    """A multimodal model's text tower, which compile reads, loads and exports alone: text requests never reach the
    other towers."""

    config: str
    """The config.json key that holds the tower's sizes (EmbeddingGemma 2's `text_config`); its keys are read as the
    model's own."""
    module: str
    """The attribute of the tower in the loaded model (`language_model`)."""
    placeholders: tuple[str, ...] = ()
    """The multimodal config's keys of the placeholder tokens (image, video, audio) that the model reads as padding
    before the tower, as the exported tower must too: a text can hold one typed out."""


@dataclass(frozen=True)
class Architecture:
    name: str
    model_types: tuple[str, ...]
    """Values of config.json's `model_type` that this family covers."""
    uses_token_type_ids: bool
    """BERT cross-encoders put the second text of a pair in segment 1; dropping the ids changes scores."""
    position_offset_from_padding: bool
    """RoBERTa counts positions from padding_idx + 1, which costs padding_idx + 1 slots of the table."""
    classifier_input: Literal["pooler", "first_token"]
    """What the sequence-classification head reads: BERT's pooler output, or RoBERTa's first-token state.

    The padded graph runs transformers' own head; the packed graph rebuilds the call from this.
    """
    fusion_model_type: str = "bert"
    """onnxruntime.transformers optimizer family whose fusion patterns fit this graph."""
    config_aliases: Mapping[str, str] = field(default_factory=dict)
    """config.json keys this family spells its own way, by the BERT name encoderrt reads (DistilBERT's `dim`)."""
    layer_gelus: int = 1
    """GELUs each layer's feed-forward fuses into: one, or none where it gates with SiLU (SwiGLU)."""
    layer_gelus_of: Callable[[Mapping[str, Any]], int] | None = None
    """`layer_gelus` for a family whose checkpoints differ in it (T5: GELU-gated in v1.1, ReLU in v1.0), from the
    canonical config."""
    encoder_class: str | None = None
    """The transformers class of the bare encoder where AutoModel builds more than that (T5: the encoder-decoder;
    T5EncoderModel, as sentence-transformers loads it)."""
    rms_norm: bool = False
    """Whether the layers normalise with RMSNorm (Llama-style), which OpenVINO fuses only when it compiles for
    the CPU, so the fusion check reads the compiled model for it."""
    head_gelus: int = 0
    """GELUs in the sequence-classification head (ELECTRA's dense + GELU), counted by the fusion check."""
    sdpa: bool = True
    """Whether transformers runs this family with SDPA attention, which OpenVINO fuses into one op per layer."""
    packed_layout: bool = False
    """Whether TensorRT's padding-free graph (compile/packed.py) knows this family's embeddings and head."""
    rewrite_attention: Callable[[Any, str], None] | None = None
    """For export only: route the loaded torch model's attention through one fusable op (models/attention.py),
    traced for "onnxruntime" or "sdpa", with whatever else the family's graph needs to fuse (EmbeddingGemma 2's
    RMSNorm in the form onnxruntime matches); None where the exporters' own patterns already fuse it."""
    attention_interface: bool = False
    """For export only: transformers calls this family's attention through its AttentionInterface (rotary
    families), so export routes it through models/attention.py's one op without code of the family's own
    (before `rewrite_attention`, where a family has one too)."""
    causal: bool = False
    """A decoder (Qwen3): each token attends to those before it. Rows stay right-padded, where a real token never
    sees padding, so export runs attention causal with no mask (models/attention.py), and the last real token's
    state is the one that has seen the whole text (`lasttoken` pooling, a causal LM's score)."""
    state_width: str = "hidden_size"
    """The config key of the width of the token states the encoder returns (EmbeddingGemma 2 projects its last layer
    to `embedding_dim`)."""
    text_tower: TextTower | None = None
    """Where a folder of this family can be a multimodal model, how to find its text tower in it."""
    unsupported: Callable[[Mapping[str, Any]], str | None] | None = None
    """What in a config.json this family's file cannot compile (a variant it does not cover), or None."""

    @property
    def input_names(self) -> tuple[str, ...]:
        if self.uses_token_type_ids:
            return ("input_ids", "attention_mask", "token_type_ids")
        return ("input_ids", "attention_mask")

    def canonical_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """config.json with the BERT names filled in from this family's own, and a multimodal folder's text sizes
        lifted from its nested config, so the rest of compile reads one set."""
        canonical = dict(config)
        nested = config.get(self.text_tower.config) if self.text_tower else None
        if isinstance(nested, Mapping):
            canonical.update({key: value for key, value in nested.items()
                              if key not in ("model_type", "architectures")})
        for name, own in self.config_aliases.items():
            if own in config and name not in config:
                canonical[name] = config[own]
        return canonical

    def expected_gelus(self, task: str, config: Mapping[str, Any]) -> int:
        """Per layer the family's count, plus the classification head's, or the MLM head's one (dense + GELU +
        LayerNorm) for sparse; none more for the tasks that run the bare encoder (embed, multi_vector, hybrid)."""
        per_layer = self.layer_gelus_of(config) if self.layer_gelus_of else self.layer_gelus
        head = {"embed": 0, "multi_vector": 0, "hybrid": 0, "sparse": 1}.get(task, self.head_gelus)
        return int(config["num_hidden_layers"]) * per_layer + head

    def position_offset(self, config: Mapping[str, Any]) -> int:
        """The position id of a sequence's first token."""
        return int(config.get("pad_token_id", 1)) + 1 if self.position_offset_from_padding else 0

    def max_positions(self, config: Mapping[str, Any]) -> int:
        """The longest sequence (special tokens included) the position table can address."""
        return int(config.get("max_position_embeddings", 512)) - self.position_offset(config)
