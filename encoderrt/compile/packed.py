"""The packed (padding-free) graph for TensorRT: the tokens of every sequence in one stream.

Inputs are input_ids [T] (and token_type_ids [T]) plus cu_seqlens [B + 1] (int32), where sequence
b is tokens cu_seqlens[b]:cu_seqlens[b + 1]; the output is [B, dim], as from the padded graph.
Everything but attention works token by token, so only attention needs to know the sequences: it
is one `encoderrt::packed_attention` node per layer, which TensorRT maps to the plugin in
encoderrt/kernels/tensorrt_plugin.py. Position ids and pooling come from cu_seqlens inside the
graph, so a runtime only has to drop the padding (runtime/packing.py).

The model is transformers' own with its attention function swapped (AttentionInterface), so the
weights and every other op are those the parity reference runs.
"""

from __future__ import annotations

import warnings
from functools import cache
from pathlib import Path

import torch

from encoderrt.compile.errors import FusionError
from encoderrt.compile.source import SourceModel
from encoderrt.models.attention import OPSET
from encoderrt.runtime.packing import PACKED_ATTENTION_DOMAIN, PACKED_ATTENTION_OP, packed_input_names

ATTENTION_IMPLEMENTATION = "encoderrt_packed"
_TORCH_OP = "encoderrt_export::packed_attention"


@cache
def _register() -> None:
    """The torch op and the attention function using it.

    The op exports as the plugin node; it runs the PyTorch reference on the CPU and the Triton kernel
    on a GPU, so the same packed model serves export, parity and the device check.
    """
    from torch.onnx import symbolic_helper
    from transformers import AttentionInterface

    from encoderrt.kernels.reference import reference_attention

    @torch.library.custom_op(_TORCH_OP, mutates_args=())
    def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                         sm_scale: float, num_heads: int, head_dim: int) -> torch.Tensor:
        return reference_attention(q, k, v, cu_seqlens, sm_scale)

    @packed_attention.register_fake
    def _(q, k, v, cu_seqlens, max_seqlen, sm_scale, num_heads, head_dim):
        return torch.empty_like(q)

    @packed_attention.register_kernel("cuda")
    def _(q, k, v, cu_seqlens, max_seqlen, sm_scale, num_heads, head_dim):
        from encoderrt.kernels.packed_attention import packed_attention as triton_packed_attention

        return triton_packed_attention(q, k, v, cu_seqlens, max_seqlen, sm_scale)

    @symbolic_helper.parse_args("v", "v", "v", "v", "i", "f", "i", "i")
    def to_onnx(g, q, k, v, cu_seqlens, max_seqlen, sm_scale, num_heads, head_dim):
        # TensorRT's parser finds a plugin by the node's op type and its plugin_namespace attribute
        out = g.op(f"{PACKED_ATTENTION_DOMAIN}::{PACKED_ATTENTION_OP}", q, k, v, cu_seqlens, max_seqlen_i=max_seqlen,
                   sm_scale_f=sm_scale, num_heads_i=num_heads, head_dim_i=head_dim,
                   plugin_namespace_s=PACKED_ATTENTION_DOMAIN, plugin_version_s="1")
        out.setType(q.type())
        return out

    torch.onnx.register_custom_op_symbolic(_TORCH_OP, to_onnx, OPSET)

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        """transformers hands [1, heads, T, head_dim]; the packed op takes [T, heads, head_dim]."""
        cu_seqlens = kwargs["cu_seq_lens_q"]
        heads, head_dim = query.shape[1], query.shape[3]
        q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))
        scale = float(scaling) if scaling is not None else head_dim ** -0.5
        out = torch.ops.encoderrt_export.packed_attention(q, k, v, cu_seqlens, int(kwargs["max_length_q"]), scale,
                                                          int(heads), int(head_dim))
        return out[None], None

    AttentionInterface.register(ATTENTION_IMPLEMENTATION, attention)


class PackedModel(torch.nn.Module):
    """[T] tokens and cu_seqlens in, [B, dim] out: pooled embeddings or raw logits."""

    def __init__(self, model: torch.nn.Module, source: SourceModel):
        super().__init__()
        self.model = model
        self.task = source.task
        self.pooling = source.pooling
        self.max_length = source.max_length
        self.position_offset = source.architecture.position_offset(source.config)
        self.classifier_input = source.architecture.classifier_input

    def forward(self, input_ids, cu_seqlens, token_type_ids=None):
        index = torch.arange(input_ids.shape[0], device=input_ids.device)
        sequence = (cu_seqlens[1:-1, None] <= index[None, :]).sum(0)  # [T]: the sequence each token belongs to
        positions = index - cu_seqlens[sequence] + self.position_offset
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        hidden = self.model.base_model(
            input_ids=input_ids[None], token_type_ids=token_type_ids[None], position_ids=positions[None],
            cu_seq_lens_q=cu_seqlens, cu_seq_lens_k=cu_seqlens, max_length_q=self.max_length, max_length_k=self.max_length,
        ).last_hidden_state[0]
        first = hidden[cu_seqlens[:-1].long()]
        if self.task != "embed":
            head_input = first[:, None]
            if self.classifier_input == "pooler":
                head_input = self.model.base_model.pooler(head_input)
            return self.model.classifier(head_input)
        if self.pooling == "cls":
            return first
        sequences = torch.arange(cu_seqlens.shape[0] - 1, device=input_ids.device)
        membership = (sequence[None, :] == sequences[:, None]).to(hidden.dtype)  # [B, T]
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).clamp(min=1).to(hidden.dtype)
        return (membership @ hidden) / lengths[:, None]


def load_packed_model(source: SourceModel) -> PackedModel:
    from encoderrt.compile.export import load_torch_model

    _register()
    wrapper = load_torch_model(source, attention=ATTENTION_IMPLEMENTATION)
    return PackedModel(wrapper.encoder if source.task == "embed" else wrapper.classifier, source).eval()


def example_packed_inputs(source: SourceModel) -> tuple[torch.Tensor, ...]:
    """Two sequences of 5 and 3 tokens, in the packed graph's input order."""
    lengths = (5, 3)
    example = {
        "input_ids": torch.full((sum(lengths),), 5, dtype=torch.long),
        "cu_seqlens": torch.tensor([0, lengths[0], sum(lengths)], dtype=torch.int32),
        "token_type_ids": torch.zeros(sum(lengths), dtype=torch.long),
    }
    return tuple(example[name] for name in packed_input_names(source.architecture.uses_token_type_ids))


def export_packed(source: SourceModel, path: Path) -> None:
    from encoderrt.compile.export import output_name

    module = load_packed_model(source)
    names = list(packed_input_names(source.architecture.uses_token_type_ids))
    dynamic_axes = {name: {0: "tokens"} for name in names}
    dynamic_axes["cu_seqlens"] = {0: "sequences_plus_one"}
    dynamic_axes[output_name(source)] = {0: "sequences"}
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, example_packed_inputs(source), str(path), input_names=names,
                          output_names=[output_name(source)], dynamic_axes=dynamic_axes, opset_version=OPSET,
                          do_constant_folding=True, dynamo=False)


def packed_attention_count(path: Path, num_layers: int) -> int:
    """One plugin node per layer, and no attention computed any other way."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    nodes = [n for n in graph.node if n.domain == PACKED_ATTENTION_DOMAIN and n.op_type == PACKED_ATTENTION_OP]
    stray = sorted({n.op_type for n in graph.node if n.op_type in ("Softmax", "Attention")})
    if stray:
        raise FusionError(f"the packed graph still computes attention with {stray}")
    if len(nodes) != num_layers:
        raise FusionError(f"the packed graph has {len(nodes)} packed attention nodes for {num_layers} layers")
    return len(nodes)
