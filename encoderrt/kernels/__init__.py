"""GPU kernels (Triton) for padding-free batching; they need torch and triton (`encoderrt[gpu]`).

On a machine without a GPU they run under Triton's interpreter (TRITON_INTERPRET=1), which is how
CI checks them against the PyTorch reference.
"""

PACKED_HEAD_DIMS = (32, 64)
"""Head sizes the packed attention kernel is built for (MiniLM / bge-small, BERT-base)."""
