"""Attention with an additive score bias as one op in the exported graph, for families whose layers add
a bias that onnxruntime's fusion patterns do not match (MPNet's relative-position bias), or rotate q and
k before attending (rotary positions: ModernBERT, NomicBERT, GTE, EuroBERT).

A family's `rewrite_attention` (encoderrt/models/) routes its layers through `biased_attention`. The
op exports as onnxruntime's `com.microsoft.MultiHeadAttention` with the key padding mask and the bias
as inputs; traced for SDPA (OpenVINO, TensorRT) it is torch's scaled_dot_product_attention with the
bias and mask folded into one float mask, which both of those fuse into their own attention op.

Families whose transformers code calls attention through `AttentionInterface` (every rotary family, and
T5, whose relative-position bias comes beside the mask) need no code of their own:
`through_attention_interface` registers one implementation that hands the rotated q, k, v and
transformers' additive mask (padding, and a layer's window where it has one; T5's bias added to it) to
`biased_attention`. The mask must be additive (eager's finite minimum): with a boolean SDPA mask, a
padded query whose whole window is padding has no key left, OpenVINO's SDPA returns NaN for it, and the
NaN survives mean pooling (NaN x 0).

Causal families (decoders: Qwen3) get no mask at all: their rows are right-padded, so a real token's causal
window holds only real tokens, and the op runs causal (onnxruntime's `unidirectional`, SDPA's `is_causal`)
instead of adding a [B, 1, S, S] mask; a padded position's state is never read.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Callable, Literal

import torch

OPSET = 17
"""The ONNX opset of the TorchScript export (compile/export.py, compile/packed.py): the custom ops register at it."""
AttentionExport = Literal["onnxruntime", "sdpa"]
"""How a rewritten attention is traced: onnxruntime's contrib op, or torch's SDPA."""
_TORCH_OP = "encoderrt_export::biased_attention"


def _split(t: torch.Tensor, heads: int) -> torch.Tensor:
    batch, sequence, hidden = t.shape
    return t.view(batch, sequence, heads, hidden // heads).transpose(1, 2)


def _sdpa(q, k, v, key_padding_mask, bias, num_heads: int, scale: float | None = None) -> torch.Tensor:
    """[B, S, H] projections, key_padding_mask [B, S] (1 = attend), bias broadcastable to [B, heads, S, S];
    no bias: causal attention."""
    blocked = torch.finfo(q.dtype).min
    mask = bias if key_padding_mask is None or bias is None else (
        bias + torch.where(key_padding_mask[:, None, None, :].bool(), 0.0, blocked).to(q.dtype))
    out = torch.nn.functional.scaled_dot_product_attention(_split(q, num_heads), _split(k, num_heads),
                                                           _split(v, num_heads), attn_mask=mask, scale=scale,
                                                           is_causal=mask is None)
    return out.transpose(1, 2).reshape(q.shape)


@cache
def _register() -> None:
    from torch.onnx import symbolic_helper

    @torch.library.custom_op(_TORCH_OP, mutates_args=())
    def biased_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor,
                            bias: torch.Tensor, num_heads: int, scale: float) -> torch.Tensor:
        return _sdpa(q, k, v, key_padding_mask, bias, num_heads, scale)

    @biased_attention_op.register_fake
    def _(q, k, v, key_padding_mask, bias, num_heads, scale):
        return torch.empty_like(q)

    @torch.library.custom_op(_TORCH_OP + "_unpadded", mutates_args=())
    def masked_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                            num_heads: int, scale: float) -> torch.Tensor:
        return _sdpa(q, k, v, None, bias, num_heads, scale)

    @masked_attention_op.register_fake
    def _(q, k, v, bias, num_heads, scale):
        return torch.empty_like(q)

    @torch.library.custom_op(_TORCH_OP + "_causal", mutates_args=())
    def causal_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int,
                            scale: float) -> torch.Tensor:
        return _sdpa(q, k, v, None, None, num_heads, scale)

    @causal_attention_op.register_fake
    def _(q, k, v, num_heads, scale):
        return torch.empty_like(q)

    @symbolic_helper.parse_args("v", "v", "v", "v", "v", "i", "f")
    def to_onnx(g, q, k, v, key_padding_mask, bias, num_heads, scale):
        no_qkv_bias = symbolic_helper._optional_input_placeholder_tensor(g)
        out = g.op("com.microsoft::MultiHeadAttention", q, k, v, no_qkv_bias, key_padding_mask, bias, num_heads_i=num_heads,
                   scale_f=scale)
        out.setType(q.type())
        return out

    @symbolic_helper.parse_args("v", "v", "v", "v", "i", "f")
    def to_onnx_unpadded(g, q, k, v, bias, num_heads, scale):
        absent = symbolic_helper._optional_input_placeholder_tensor(g)
        out = g.op("com.microsoft::MultiHeadAttention", q, k, v, absent, absent, bias, num_heads_i=num_heads, scale_f=scale)
        out.setType(q.type())
        return out

    @symbolic_helper.parse_args("v", "v", "v", "i", "f")
    def to_onnx_causal(g, q, k, v, num_heads, scale):
        out = g.op("com.microsoft::MultiHeadAttention", q, k, v, num_heads_i=num_heads, scale_f=scale, unidirectional_i=1)
        out.setType(q.type())
        return out

    torch.onnx.register_custom_op_symbolic(_TORCH_OP, to_onnx, OPSET)
    torch.onnx.register_custom_op_symbolic(_TORCH_OP + "_causal", to_onnx_causal, OPSET)
    torch.onnx.register_custom_op_symbolic(_TORCH_OP + "_unpadded", to_onnx_unpadded, OPSET)


def biased_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_padding_mask: torch.Tensor | None,
                     bias: torch.Tensor | None, num_heads: int, export: AttentionExport,
                     scale: float | None = None) -> torch.Tensor:
    """softmax(scale q k^T + bias) v over unpadded keys (scale 1/sqrt(head_dim) unless given), heads split from and
    merged back into H.

    With no key_padding_mask, the bias alone masks (transformers' additive mask, padding and windows in it); with
    neither, attention is causal (right-padded rows of a decoder).
    """
    if export == "sdpa":
        return _sdpa(q, k, v, key_padding_mask, bias, num_heads, scale)
    _register()
    scale = float(scale if scale is not None else (q.shape[-1] // num_heads) ** -0.5)
    if bias is None:
        return torch.ops.encoderrt_export.biased_attention_causal(q, k, v, num_heads, scale)
    if key_padding_mask is None:
        return torch.ops.encoderrt_export.biased_attention_unpadded(q, k, v, bias, num_heads, scale)
    return torch.ops.encoderrt_export.biased_attention(q, k, v, key_padding_mask.to(torch.int32), bias, num_heads, scale)


def key_padding_mask(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """[B, S] with 1 for real keys, from a [B, 1, S or 1, S] mask, additive (0 = attend) or boolean (True = attend),
    whose first query row is a real token (None: nothing padded)."""
    if mask is None:
        return torch.ones(like.shape[:2], dtype=torch.int32, device=like.device)
    keys = mask[:, 0, 0, :]
    return (keys if keys.dtype == torch.bool else keys == 0).to(torch.int32)


def _padding_only(fallback: Any, additive: bool) -> Any:
    """A mask function for transformers' AttentionMaskInterface that, for plain bidirectional attention (every query
    sees every real key), returns the padding alone as [B, 1, 1, S], which SDPA broadcasts, instead of `fallback`'s
    [B, 1, S, S]: OpenVINO computed and kept that one (a lone 8k row: 256 MiB as floats). Windows and other
    patterns keep `fallback`'s full mask. Not for TensorRT's graph: the standard ONNX Attention op that it is
    checked on takes no mask it would have to broadcast."""
    from transformers.masking_utils import bidirectional_mask_function

    def mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None,
             dtype=torch.float32, **kwargs):
        if mask_function is bidirectional_mask_function and attention_mask is not None and not q_offset and not kv_offset:
            keys = attention_mask[:, None, None, :kv_length].bool()
            return torch.where(keys, 0.0, torch.finfo(dtype).min).to(dtype) if additive else keys
        return fallback(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                        kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask, dtype=dtype,
                        **kwargs)

    return mask


def _no_causal_mask(fallback: Any) -> Any:
    """A mask function that, for plain causal attention, returns no mask: the attention runs causal by itself
    (`biased_attention` with no bias) over right-padded rows. Windows and other patterns keep `fallback`'s."""
    from transformers.masking_utils import causal_mask_function

    def mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, **kwargs):
        if mask_function is causal_mask_function and not q_offset and not kv_offset:
            return None
        return fallback(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                        kv_offset=kv_offset, mask_function=mask_function, **kwargs)

    return mask


@cache
def sdpa_with_padding_masks() -> str:
    """transformers' SDPA attention, registered under a name of its own whose masks are `_padding_only`'s: how
    OpenVINO's export runs families without an attention rewrite."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    name = "encoderrt_sdpa_padding"
    AttentionInterface.register(name, sdpa_attention_forward)
    AttentionMaskInterface.register(name, _padding_only(sdpa_mask, additive=False))
    return name


@cache
def _interface_name(export: AttentionExport, padding_masks: bool, causal: bool) -> str:
    """The name of the attention implementation for `export`, registered with transformers; with `padding_masks`,
    plain bidirectional masks are the padding alone (`_padding_only`); with `causal`, plain causal ones are none
    (`_no_causal_mask`)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        """transformers hands [B, heads, S, head_dim] (key and value with fewer heads under grouped-query
        attention) and an additive [B, 1, S, S] mask; returns [B, S, heads, head_dim]."""
        batch, heads, sequence, head_dim = query.shape
        if key.shape[1] != heads:
            key, value = (t.repeat_interleave(heads // t.shape[1], dim=1) for t in (key, value))
        q, k, v = (t.transpose(1, 2).reshape(batch, sequence, heads * head_dim) for t in (query, key, value))
        if attention_mask is None and causal and getattr(module, "is_causal", False):
            mask = None
        else:
            mask = attention_mask if attention_mask is not None else query.new_zeros((batch, 1, sequence, sequence))
        if (position_bias := kwargs.get("position_bias")) is not None:  # T5's relative positions, [1, heads, S, S]
            mask = position_bias if mask is None else mask + position_bias
        out = biased_attention(q, k, v, None, mask, heads, export, scale=scaling)
        return out.view(batch, sequence, heads, head_dim), None

    name = f"encoderrt_biased_{export}" + ("_padding" if padding_masks else "") + ("_causal" if causal else "")
    AttentionInterface.register(name, attention)
    masks = _padding_only(eager_mask, additive=True) if padding_masks else eager_mask  # eager's additive float mask
    AttentionMaskInterface.register(name, _no_causal_mask(masks) if causal else masks)
    return name


def through_attention_interface(model: Any, export: AttentionExport, padding_masks: bool = False,
                                causal: bool = False) -> None:
    """Route a family's attention through `biased_attention` where transformers calls it through its
    AttentionInterface (an Architecture's `attention_interface`); `padding_masks` for SDPA in OpenVINO
    (`_padding_only`); `causal` for a decoder family (`_no_causal_mask`)."""
    set_attention(model, _interface_name(export, padding_masks, causal))


def set_attention(model: Any, name: str) -> None:
    """Run the transformers model inside `model` with the attention implementation registered as `name`."""
    next(module for module in model.modules() if hasattr(module, "set_attn_implementation")).set_attn_implementation(name)


def _window_masks(padding: torch.Tensor, radius: int) -> dict[str, torch.Tensor]:
    """Additive [B, 1, S, S] masks per layer type from a [B, S] padding mask (1 = real token): global layers see every
    real key, windowed ones the real keys at most `radius` positions away on either side."""
    positions = torch.arange(padding.shape[1], device=padding.device)
    near = (positions[:, None] - positions[None, :]).abs() <= radius
    keys = padding[:, None, None, :].bool()
    blocked = torch.finfo(torch.float32).min
    full = torch.where(keys, 0.0, blocked).expand(-1, -1, padding.shape[1], -1)
    return {"full_attention": full, "sliding_attention": torch.where(keys & near, 0.0, blocked)}


def window_masks_ready_made(model: Any, text_model: str, radius: Callable[[Any], int]) -> None:
    """Hand the `text_model` class inside `model` its masks ready-made, one per layer type (`_window_masks`), for a
    bidirectional family with windowed layers: transformers builds them with vmap over mask functions, which
    TorchScript cannot trace, and these text models also take them as a mapping. `radius(config)`: how far a windowed
    layer's token sees on each side, by the family's rule."""
    import types

    text = next(module for module in model.modules() if type(module).__name__ == text_model)
    window, forward = radius(text.config), text.forward

    def with_masks(self, input_ids=None, attention_mask=None, **kwargs):
        if attention_mask is not None and attention_mask.dim() == 2:
            attention_mask = _window_masks(attention_mask, window)
        return forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    text.forward = types.MethodType(with_masks, text)
