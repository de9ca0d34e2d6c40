"""PyTorch -> ONNX with pooling or the classifier head inside the graph.

Export uses eager attention and the TorchScript exporter: onnxruntime's attention fusion
recognises that graph, while SDPA exports (and dynamo's decomposition) stay unfused.
The example batch carries padding so that the traced graph keeps the attention-mask path.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from encoderrt.compile.errors import InputError
from encoderrt.compile.pooling import pool
from encoderrt.compile.source import SourceModel
from encoderrt.models.attention import OPSET, sdpa_with_padding_masks, set_attention, through_attention_interface
from encoderrt.runtime.manifest import PER_TOKEN_OUTPUTS
from encoderrt.runtime.tokenizer import ADAPTER, POOLING_START, ROW_INPUTS


def load_torch_model(source: SourceModel, attention: str = "eager") -> torch.nn.Module:
    """The PyTorch module whose outputs the engine must reproduce (pooled embedding or logits).

    `attention` is transformers' attn_implementation: eager for onnxruntime's fusion, sdpa for the
    standard ONNX Attention op that TensorRT fuses.
    """
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSequenceClassification

    encoder = bare_encoder_class(source)
    bare = {"embed": encoder, "multi_vector": encoder, "hybrid": encoder, "sparse": AutoModelForMaskedLM}
    loader = (bare.get(source.head_task, AutoModelForSequenceClassification)
              if source.answer_tokens is None else AutoModelForCausalLM)
    nested = _multimodal(source)  # a multimodal model's other towers load as eager, which every one of them supports
    implementation = {nested: attention, "": "eager"} if nested else attention
    try:
        model = loader.from_pretrained(source.weights_folder, attn_implementation=implementation, dtype=torch.float32)
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:
        raise InputError(f"cannot load weights from {source.weights_folder}: {exc}") from None
    model = _text_path(source, model).eval()
    model.config.use_cache = False  # a decoder would build a key/value cache that no one reads
    if source.task in ("embed", "hybrid"):
        module = PooledEncoder(model, source.pooling, [_dense(path) for path in source.dense_folders])
        if source.hybrid_heads is not None:
            from encoderrt.compile.hybrid import HybridEncoder, load_head

            colbert, sparse = source.hybrid_heads
            module = HybridEncoder(module, load_head(colbert, source.hidden_size), load_head(sparse, source.hidden_size, 1))
        if source.adapters:
            from encoderrt.compile.lora import with_task_adapters

            module = with_task_adapters(module, model, source.adapters)
        return module.eval()
    if source.autoencoder is not None:
        from encoderrt.compile.sparse_autoencoder import AutoEncoderHead

        dense = [_dense(path) for path in source.dense_folders]
        return PooledEncoder(model, source.pooling, [*dense, AutoEncoderHead(source.autoencoder)]).eval()
    if source.task == "sparse":
        return SpladeEncoder(model, source.pooling).eval()
    if source.task == "multi_vector":
        from encoderrt.compile.multi_vector import token_dense

        return TokenVectors(model, [token_dense(path) for path in source.dense_folders]).eval()
    if source.answer_tokens is not None:
        return LastTokenLogits.answering(model, *source.answer_tokens).eval()
    if source.architecture.causal:
        return LastTokenLogits.of(model).eval()
    return ClassifierLogits(model).eval()


def per_token_matmul_weights(source: SourceModel) -> int:
    """Weights of the matrix multiplies every token runs through (the bench's FLOPs), counted on the family's own
    module tree built without weights: the encoder's layers, and a sparse model's MLM head. The pooler, the
    classification head and a causal LM's head run once a row, so they are left out."""
    from transformers import AutoConfig, AutoModelForMaskedLM

    config = AutoConfig.from_pretrained(source.weights_folder, local_files_only=True)
    with torch.device("meta"):
        encoder = bare_encoder_class(source)  # an Auto class builds from_config, a model class from its constructor
        model = _text_path(source, AutoModelForMaskedLM.from_config(config) if source.head_task == "sparse"
                           else getattr(encoder, "from_config", encoder)(config))
    return sum(module.weight.numel() for name, module in model.named_modules()
               if isinstance(module, torch.nn.Linear) and "pooler" not in name.split("."))


def _multimodal(source: SourceModel) -> str | None:
    """The key of the text tower's config where the folder is a multimodal model (Architecture.text_tower)."""
    tower = source.architecture.text_tower
    return tower.config if tower and isinstance(source.config.get(tower.config), dict) else None


def _text_path(source: SourceModel, model: Any) -> Any:
    """The module a text runs through: a multimodal model's text tower, fed as the model feeds it, else the model."""
    tower = source.architecture.text_tower
    if not (tower and _multimodal(source)):
        return model
    placeholders = [int(source.config[key]) for key in tower.placeholders if source.config.get(key) is not None]
    return TextPath(getattr(model, tower.module), placeholders, int(source.config.get("pad_token_id") or 0))


class TextPath(torch.nn.Module):
    """A multimodal model's text tower with the model's own first step: its placeholder tokens (image, video, audio)
    are read as padding, whose embedding the model puts in their place when no image or sound comes with them."""

    def __init__(self, tower: torch.nn.Module, placeholders: list[int], pad: int):
        super().__init__()
        self.tower, self.config, self.pad = tower, tower.config, pad
        self.register_buffer("placeholders", torch.tensor(placeholders, dtype=torch.long), persistent=False)

    def forward(self, input_ids, attention_mask, **kwargs):
        if self.placeholders.numel():
            held = (input_ids[..., None] == self.placeholders).any(-1)
            input_ids = torch.where(held, torch.full_like(input_ids, self.pad), input_ids)
        return self.tower(input_ids=input_ids, attention_mask=attention_mask, **kwargs)


def bare_encoder_class(source: SourceModel) -> Any:
    """transformers' class of the family's bare encoder: AutoModel, or the family's own where AutoModel builds more
    (Architecture.encoder_class)."""
    import transformers

    return getattr(transformers, source.architecture.encoder_class or "AutoModel")


def _dense(path: Path) -> torch.nn.Module:
    """A sentence-transformers Dense module, loaded by sentence-transformers itself (its weights, bias, activation)."""
    from sentence_transformers.sentence_transformer.modules import Dense

    try:
        dense = Dense.load(str(path), local_files_only=True)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise InputError(f"cannot load the Dense module in {path}: {exc}") from None
    if dense.module_input_name != "sentence_embedding" or (dense.module_output_name or "sentence_embedding") != "sentence_embedding":
        raise InputError(f"the Dense module in {path} maps {dense.module_input_name} to {dense.module_output_name}; "
                         "encoderrt compiles Dense modules on the pooled sentence embedding")
    return dense.eval()


def _feeds(input_ids, attention_mask, token_type_ids) -> dict:
    """The model's keyword inputs: families without segment embeddings (DistilBERT, MPNet) take no token_type_ids."""
    feeds = {"input_ids": input_ids, "attention_mask": attention_mask}
    if token_type_ids is not None:
        feeds["token_type_ids"] = token_type_ids
    return feeds


def load_export_model(source: SourceModel, attention: str, padding_masks: bool = False) -> torch.nn.Module:
    """The module to export: the reference's, with the family's attention made one op where it needs that.

    `attention` is "onnxruntime" (eager attention, fused by onnxruntime's optimizer or exported as its contrib
    op) or "sdpa" (one SDPA per layer, which OpenVINO and TensorRT fuse). `padding_masks` (OpenVINO): plain
    bidirectional masks as [B, 1, 1, S] padding, which its SDPA broadcasts, not [B, 1, S, S].
    """
    architecture = source.architecture
    implementation = "sdpa" if attention == "sdpa" and architecture.sdpa else "eager"
    module = load_torch_model(source, attention=implementation)
    if architecture.attention_interface:
        through_attention_interface(module, attention, padding_masks, architecture.causal)
    elif implementation == "sdpa" and padding_masks and architecture.rewrite_attention is None:
        set_attention(module, sdpa_with_padding_masks())
    if architecture.rewrite_attention is not None:
        architecture.rewrite_attention(module, attention)
    return module


class GraphInputs(torch.nn.Module):
    """The module as a graph: inputs in the graph's order, as the exporters pass them (positionally; a family
    without segment ids may still take pooling_start, which its keyword signature names), and an embedding
    model's token states as a second output."""

    def __init__(self, module: torch.nn.Module, source: SourceModel):
        super().__init__()
        self.module = module
        self.names = source.graph_inputs
        self.options = {"with_token_embeddings": True} if source.task == "embed" else {}

    def forward(self, *inputs):
        return self.module(**dict(zip(self.names, inputs)), **self.options)


class PooledEncoder(torch.nn.Module):
    """The encoder, its pooling, then any sentence-transformers Dense modules (normalising is the runtime's)."""

    def __init__(self, encoder: torch.nn.Module, pooling: str, dense: list[torch.nn.Module] = ()):
        super().__init__()
        self.encoder = encoder
        self.pooling = pooling
        self.dense = torch.nn.ModuleList(dense)

    def forward(self, input_ids, attention_mask, token_type_ids=None, pooling_start=None, with_token_embeddings=False):
        hidden = self.encoder(**_feeds(input_ids, attention_mask, token_type_ids)).last_hidden_state
        pooled = pool(hidden, attention_mask, self.pooling, pooling_start)
        for module in self.dense:
            pooled = module({"sentence_embedding": pooled})["sentence_embedding"]
        return (pooled, hidden) if with_token_embeddings else pooled


class TokenVectors(torch.nn.Module):
    """A multi-vector model: the encoder, then the Dense projections of every token ([rows, width, dim]);
    normalising and the per-side masks are the runtime's (compile/multi_vector.py)."""

    def __init__(self, encoder: torch.nn.Module, dense: list[torch.nn.Module]):
        super().__init__()
        self.encoder = encoder
        self.dense = torch.nn.ModuleList(dense)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        vectors = self.encoder(**_feeds(input_ids, attention_mask, token_type_ids)).last_hidden_state
        for module in self.dense:
            vectors = module({"token_embeddings": vectors})["token_embeddings"]
        return vectors


class ClassifierLogits(torch.nn.Module):
    def __init__(self, classifier: torch.nn.Module):
        super().__init__()
        self.classifier = classifier

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        return self.classifier(**_feeds(input_ids, attention_mask, token_type_ids)).logits


class LastTokenLogits(torch.nn.Module):
    """A decoder's head on one token, scored alone (the head's [tokens, labels], or a causal LM's [tokens, vocabulary],
    for every position is never made): a sequence-classification head on the last non-padding token as transformers
    picks it (the last position whose id is not the pad id, so an end-of-text token that doubles as pad is passed
    over); a causal-LM reranker's two answer logits on the last real token, where sentence-transformers' left-padded
    batch ends."""

    def __init__(self, decoder: torch.nn.Module, head: torch.nn.Module, pad_token_id: int | None):
        super().__init__()
        self.decoder = decoder
        self.head = head
        self.pad_token_id = pad_token_id

    @classmethod
    def of(cls, model: torch.nn.Module) -> "LastTokenLogits":
        return cls(model.base_model, model.score, model.config.pad_token_id)

    @classmethod
    def answering(cls, model: torch.nn.Module, true_token: int, false_token: int | None) -> "LastTokenLogits":
        """logit(true) - logit(false) (LogitScore), as one row of the output embeddings: their difference."""
        rows = model.get_output_embeddings().weight.detach()
        head = torch.nn.Linear(rows.shape[1], 1, bias=False)
        head.weight.data = (rows[true_token] - (rows[false_token] if false_token is not None else 0)).unsqueeze(0).clone()
        return cls(model.base_model, head, None)

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        hidden = self.decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        real = attention_mask.bool() if self.pad_token_id is None else attention_mask.bool() & (input_ids != self.pad_token_id)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        last = (positions * real.to(positions.dtype)).argmax(dim=-1)
        return self.head(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])


class SpladeEncoder(torch.nn.Module):
    """A sparse (SPLADE) model: log(1 + relu(logits)) over the MLM logits of the real tokens (log1p once more for
    the `log1p_relu` activation of OpenSearch's models), pooled (max or sum) to one [vocab] row per text, so the
    [batch, tokens, vocab] activation never leaves the graph; the runtime keeps the weights above zero
    (runtime/postprocess.py sparse_rows)."""

    def __init__(self, mlm: torch.nn.Module, pooling: str):
        super().__init__()
        self.mlm = mlm
        self.pooling = pooling

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        logits = self.mlm(**_feeds(input_ids, attention_mask, token_type_ids)).logits
        weights = torch.log1p(torch.relu(logits * attention_mask.unsqueeze(-1).to(logits.dtype)))
        if self.pooling.endswith("_log1p_relu"):
            weights = torch.log1p(weights)
        return weights.max(dim=1).values if self.pooling.startswith("splade_max") else weights.sum(dim=1)


def output_name(source: SourceModel) -> str:
    return source.output_name


def example_inputs(source: SourceModel) -> tuple[torch.Tensor, ...]:
    """A two-row batch whose second row is padded, in the graph's input order."""
    input_ids = torch.full((2, 8), 5, dtype=torch.long)
    attention_mask = torch.ones((2, 8), dtype=torch.long)
    attention_mask[1, 5:] = 0
    input_ids[1, 5:] = int(source.config.get("pad_token_id") or 0)
    example = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": torch.zeros_like(input_ids),
               POOLING_START: torch.tensor([2, 1], dtype=torch.long), ADAPTER: torch.tensor([1, 0], dtype=torch.long)}
    return tuple(example[name] for name in source.graph_inputs)


def export_onnx(source: SourceModel, module: torch.nn.Module, path: Path) -> None:
    names = list(source.graph_inputs)
    dynamic_axes = {name: {0: "batch"} if name in ROW_INPUTS else {0: "batch", 1: "sequence"} for name in names}
    for output in source.graph_outputs:
        dynamic_axes[output] = {0: "batch", 1: "sequence"} if output in PER_TOKEN_OUTPUTS else {0: "batch"}
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            GraphInputs(module, source),
            example_inputs(source),
            str(path),
            input_names=names,
            output_names=list(source.graph_outputs),
            dynamic_axes=dynamic_axes,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
