"""The packed attention kernel under Triton's interpreter (CPU), against the PyTorch reference.

TRITON_INTERPRET=1 is set by tests/conftest.py before triton is first imported.
"""

import pytest
import torch

from encoderrt.kernels.packed_attention import packed_attention
from encoderrt.kernels.packing import pack, unpack
from encoderrt.kernels.reference import reference_attention


def _packed_inputs(lengths, heads, head_dim, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q, k, v = (torch.randn(total, heads, head_dim, generator=generator).to(dtype) for _ in range(3))
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, cu_seqlens


@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kernel_matches_reference(head_dim, dtype):
    lengths = [1, 17, 40, 3, 64]  # includes a single token and the maximum length
    q, k, v, cu_seqlens = _packed_inputs(lengths, heads=3, head_dim=head_dim, dtype=dtype)
    out = packed_attention(q, k, v, cu_seqlens, max(lengths), block_m=16, block_n=16)
    expected = reference_attention(q, k, v, cu_seqlens)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 5e-3
    torch.testing.assert_close(out.float(), expected.float(), atol=tolerance, rtol=tolerance)


def test_sequences_do_not_see_each_other():
    q, k, v, cu_seqlens = _packed_inputs([5, 7], heads=2, head_dim=32, dtype=torch.float16, seed=1)
    alone = packed_attention(q[:5], k[:5], v[:5], torch.tensor([0, 5], dtype=torch.int32), 5, block_m=16, block_n=16)
    together = packed_attention(q, k, v, cu_seqlens, 7, block_m=16, block_n=16)
    torch.testing.assert_close(together[:5], alone)


def test_custom_scale_and_bad_shapes():
    q, k, v, cu_seqlens = _packed_inputs([9, 4], heads=1, head_dim=32, dtype=torch.float16)
    scaled = packed_attention(q, k, v, cu_seqlens, 9, sm_scale=0.5, block_m=16, block_n=16)
    torch.testing.assert_close(scaled.float(), reference_attention(q, k, v, cu_seqlens, 0.5).float(), atol=5e-3, rtol=5e-3)
    with pytest.raises(ValueError, match="head_dim 48 is not supported"):
        packed_attention(*(torch.zeros(4, 1, 48, dtype=torch.float16) for _ in range(3)), cu_seqlens, 9)
    with pytest.raises(ValueError, match="int32"):
        packed_attention(q, k, v, cu_seqlens.long(), 9)


def test_matches_padded_sdpa_on_a_batch():
    """The packed path gives what padded SDPA with a key mask gives, on the real tokens."""
    batch, seqlen, heads, head_dim = 3, 20, 2, 32
    mask = torch.zeros(batch, seqlen, dtype=torch.long)
    for row, length in enumerate([20, 6, 1]):
        mask[row, :length] = 1
    generator = torch.Generator().manual_seed(3)
    qkv = [torch.randn(batch, seqlen, heads, head_dim, generator=generator) for _ in range(3)]
    keep = mask.bool()[:, None, None, :]  # [B, 1, 1, S]: which keys each query may see
    padded = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in qkv), attn_mask=keep).transpose(1, 2)
    packed = [pack(t.half(), mask) for t in qkv]
    out = packed_attention(packed[0].tokens, packed[1].tokens, packed[2].tokens, packed[0].cu_seqlens,
                           packed[0].max_seqlen, block_m=16, block_n=16)
    restored = unpack(out, packed[0])
    real = mask.bool()
    torch.testing.assert_close(restored[real].float(), padded[real], atol=5e-3, rtol=5e-3)


def test_pack_unpack_round_trip():
    batch, seqlen = 4, 9
    mask = torch.zeros(batch, seqlen, dtype=torch.long)
    for row, length in enumerate([9, 1, 0, 5]):
        mask[row, :length] = 1
    hidden = torch.randn(batch, seqlen, 6)
    packed = pack(hidden, mask)
    assert packed.tokens.shape == (15, 6) and packed.cu_seqlens.tolist() == [0, 9, 10, 10, 15]
    assert packed.max_seqlen == 9 and packed.cu_seqlens.dtype == torch.int32
    restored = unpack(packed.tokens, packed)
    torch.testing.assert_close(restored, hidden * mask[..., None])
    with pytest.raises(ValueError, match="right-padded"):
        pack(hidden, torch.tensor([[0, 1] + [0] * 7] * 4))


def test_output_buffer_and_upper_bound_on_length():
    """What the TensorRT plugin relies on: a caller-owned output, and max_seqlen as a mere upper bound."""
    q, k, v, cu_seqlens = _packed_inputs([3, 30, 9], heads=2, head_dim=64, dtype=torch.float16, seed=4)
    out = torch.full_like(q, float("nan"))
    result = packed_attention(q, k, v, cu_seqlens, 512, block_m=16, block_n=16, out=out)
    assert result is out
    torch.testing.assert_close(out.float(), reference_attention(q, k, v, cu_seqlens).float(), atol=5e-3, rtol=5e-3)
    with pytest.raises(ValueError, match="out must be a contiguous"):
        packed_attention(q, k, v, cu_seqlens, 30, out=torch.empty(3, 2, 64))
