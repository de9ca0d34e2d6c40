"""Device check for the packed attention kernel: correctness and speed on an NVIDIA GPU.

    python scripts/gpu_check.py            # finishes in a few minutes on an H200

1. Correctness: the Triton kernel against the PyTorch reference, fp16 and bf16, head sizes 32
   and 64, sequence lengths from 1 to 512.
2. Speed: on a realistic length mix (lognormal around 80 tokens with a tail to 512), the packed
   kernel against PyTorch's scaled_dot_product_attention on the same batch padded to its longest
   row (with a key mask, and without one as a lower bound of padded work). Prints tokens/s,
   achieved TFLOP/s on the real tokens, and the fraction of the H200's dense bf16 peak.
"""

from __future__ import annotations

import math
import sys

import torch

H200_BF16_PEAK_TFLOPS = 989.0


def lengths_mix(count: int, seed: int = 0, mean: float = 80.0, max_length: int = 512) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    sigma = 0.6
    values = torch.empty(count).log_normal_(math.log(mean) - sigma**2 / 2, sigma, generator=generator)
    values = values.clamp(1, max_length).round().int().tolist()
    values[0], values[-1] = 1, max_length
    return values


def check_correctness() -> bool:
    from encoderrt.kernels.packed_attention import packed_attention, reference_attention

    ok = True
    for dtype in (torch.float16, torch.bfloat16):
        for head_dim in (32, 64):
            lengths = [1, 7, 64, 129, 512, 300]
            total = sum(lengths)
            q, k, v = (torch.randn(total, 12, head_dim, device="cuda", dtype=dtype) for _ in range(3))
            cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
            out = packed_attention(q, k, v, cu, max(lengths))
            ref = reference_attention(q, k, v, cu)
            error = (out.float() - ref.float()).abs().max().item()
            limit = 2e-2 if dtype == torch.bfloat16 else 5e-3
            ok &= error <= limit
            print(f"correctness {str(dtype):15} head_dim {head_dim}: max |error| {error:.2e} (limit {limit}) "
                  f"{'ok' if error <= limit else 'FAIL'}")
    return ok


def timed(function, repeats: int = 20) -> float:
    """Median milliseconds with CUDA events."""
    for _ in range(3):
        function()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def check_speed(heads: int, head_dim: int, sequences: int = 512, dtype=torch.bfloat16) -> dict[str, float]:
    from encoderrt.kernels.packed_attention import packed_attention

    lengths = lengths_mix(sequences)
    total, longest = sum(lengths), max(lengths)
    q, k, v = (torch.randn(total, heads, head_dim, device="cuda", dtype=dtype) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    padded = [torch.zeros(sequences, heads, longest, head_dim, device="cuda", dtype=dtype) for _ in range(3)]
    mask = torch.zeros(sequences, 1, 1, longest, dtype=torch.bool, device="cuda")
    for row, (start, length) in enumerate(zip(cu[:-1].tolist(), lengths)):
        for source, target in zip((q, k, v), padded):
            target[row, :, :length] = source[start : start + length].transpose(0, 1)
        mask[row, ..., :length] = True
    sdpa = torch.nn.functional.scaled_dot_product_attention
    packed_ms = timed(lambda: packed_attention(q, k, v, cu, longest))
    masked_ms = timed(lambda: sdpa(*padded, attn_mask=mask))
    unmasked_ms = timed(lambda: sdpa(*padded))
    real_flops = 4 * head_dim * heads * sum(n * n for n in lengths)
    padding_ratio = sequences * longest * longest / sum(n * n for n in lengths)
    tflops = real_flops / packed_ms / 1e9
    print(f"speed heads {heads} x head_dim {head_dim}, {sequences} sequences, {total} tokens (longest {longest}), {dtype}:")
    print(f"  packed kernel      {packed_ms:8.3f} ms  {total / packed_ms * 1e3:12.0f} tokens/s  {tflops:7.1f} TFLOP/s "
          f"({tflops / H200_BF16_PEAK_TFLOPS:.1%} of bf16 peak)")
    print(f"  SDPA padded+mask   {masked_ms:8.3f} ms  {total / masked_ms * 1e3:12.0f} tokens/s  speed-up {masked_ms / packed_ms:.2f}x")
    print(f"  SDPA padded, flash {unmasked_ms:8.3f} ms  {total / unmasked_ms * 1e3:12.0f} tokens/s  speed-up {unmasked_ms / packed_ms:.2f}x")
    print(f"  attention padding ratio (padded / real score entries) {padding_ratio:.2f}")
    return {"packed_ms": packed_ms, "masked_ms": masked_ms, "padding_ratio": padding_ratio}


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: this check needs an NVIDIA GPU")
        return 2
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    ok = check_correctness()
    for heads, head_dim in ((12, 32), (12, 64)):
        result = check_speed(heads, head_dim)
        beats = result["masked_ms"] / result["packed_ms"] >= result["padding_ratio"]
        print(f"  goal: beat padded SDPA by at least the padding ratio: {'met' if beats else 'not met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
