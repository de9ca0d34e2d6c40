"""What the user asked `compile-model` for; `None` and "auto" mean: read it from the model folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

TENSORRT_BATCH_TOKENS = 16384
"""The largest batch a TensorRT engine's optimisation profiles hold unless --max-batch-tokens says otherwise."""


@dataclass(frozen=True)
class CompileOptions:
    model_dir: Path
    output_dir: Path
    task: Literal["auto", "embed", "score", "classify"] = "auto"
    precision: Literal["auto", "fastest", "fp32", "int8", "fp16", "bf16"] = "auto"
    """auto: the fastest here of fp32 and, where the CPU computes it natively and it meets the lossless tier, bf16;
    fastest: the same candidates, bf16 held to its own tolerance only (compile/selection.py)."""
    target: Literal["auto", "cpu", "openvino", "cuda", "tensorrt"] = "auto"
    """auto: the fastest of the CPU targets (onnxruntime, OpenVINO) on this machine (compile/selection.py)."""
    layout: Literal["padded", "packed"] = "padded"
    """TensorRT only: padded batches with TensorRT's fused attention, or packed (padding-free) with encoderrt's plugin."""
    max_batch_tokens: int = TENSORRT_BATCH_TOKENS
    """TensorRT only: the largest batch (padded tokens) the optimisation profiles must hold."""
    max_length: int | None = None
    pooling: Literal["auto", "cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken"] = "auto"
    normalize: bool | None = None
    force: bool = False
    quiet: bool = False
    name: str | None = None
    """The model's name in the manifest (and the default served name); None: the folder's name."""
