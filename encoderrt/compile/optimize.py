"""Graph fusion with onnxruntime's transformer optimizer, and the check that it really fused.

An encoder layer that keeps its attention as MatMul/Softmax chains runs several times slower
and nothing else notices, so compile counts the fused ops and refuses a partly fused graph.

LayerNorm chains fuse into the standard LayerNormalization op, with the residual Add left beside
it rather than folded into SkipLayerNormalization: onnxruntime's CPU SkipLayerNormalization kernel
measured 372 us a call against 66 us for LayerNormalization plus 2 x 35 us for the Adds
(all-MiniLM-L6-v2, 512-token batches, 2 cores), which made int8 engines 11% faster end to end.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from encoderrt.compile.errors import CompileError, FusionError
from encoderrt.compile.source import SourceModel
from encoderrt.compile.unpad import UNPADDED, scored_unattended, unpad_onnx

ATTENTION_OPS = ("Attention", "MultiHeadAttention", "ScaledDotProductAttention")
GELU_OPS = ("Gelu", "FastGelu", "BiasGelu", "GemmFastGelu")
LAYER_NORM_OPS = ("SkipLayerNormalization", "LayerNormalization", "EmbedLayerNormalization", "MVN",
                  "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "RMS")
"""onnxruntime's fused ops (SimplifiedLayerNormalization: RMSNorm), and OpenVINO's (ScaledDotProductAttention,
MVN for LayerNorm, RMS for RMSNorm)."""


def fuse(source: SourceModel, exported: Path, optimized: Path) -> dict[str, int]:
    """Fuse attention, LayerNorm and GELU chains, and run the token-wise ops on the real tokens only
    (compile/unpad.py); returns the count of each fused op, and of the MatMuls that skip padding (UNPADDED).

    The optimised graph keeps its weights beside it (optimized.onnx.data), as artifacts do: a graph past protobuf's
    2 GB (bge-m3, jina-embeddings-v3, Qwen3-Embedding-0.6B in fp32) cannot be written as one message."""
    import onnx

    family = (source.architecture.fusion_model_type, source.num_heads, source.hidden_size)
    graph = onnx.load(str(exported), load_external_data=False)
    if _weights_outside(graph):  # as the exporter leaves them past 2 GB
        counts = _optimize_in_child(exported, optimized, family)
    else:
        counts = optimize(graph, optimized, *family)
    check_fusion(counts, source.num_layers, source.architecture.expected_gelus(source.head_task, source.config))
    fused = onnx.load(str(optimized), load_external_data=False)  # the weights stay where they are, beside it
    if unpadded := unpad_onnx(fused, scored_unattended(source)):
        onnx.save_model(fused, str(optimized))
        counts[UNPADDED] = unpadded
    return counts


def optimize(graph: Any, optimized: Path, model_type: str, num_heads: int, hidden_size: int) -> dict[str, int]:
    """onnxruntime's transformer optimizer on `graph` (a ModelProto), saved to `optimized`: the fused-op counts.
    Weights stored beside the graph stay there: the optimizer reads those it needs from the working directory."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    options = FusionOptions(model_type)
    options.enable_skip_layer_norm = False
    model = optimize_model(graph, model_type=model_type, num_heads=num_heads, hidden_size=hidden_size, opt_level=0,
                           optimization_options=options)
    counts = {op: n for op, n in model.get_fused_operator_statistics().items() if n}
    model.save_model_to_file(str(optimized), use_external_data_format=True)
    return counts


def _weights_outside(graph: Any) -> bool:
    from onnx.external_data_helper import uses_external_data

    return any(uses_external_data(tensor) for tensor in graph.graph.initializer)


def _optimize_in_child(exported: Path, optimized: Path, family: tuple[str, int, int]) -> dict[str, int]:
    """`optimize` in a process of its own whose working directory is the graph's folder, where onnx finds the
    weights the optimizer reads, leaving the rest on disk. Loaded whole, a 2.3 GB graph took 11 GB in the optimizer
    (protobuf's copies of each table it reads) and 40 s; left on disk, 2.3 GB and 3 s (2-core EPYC)."""
    import encoderrt

    command = [sys.executable, "-m", "encoderrt.compile.optimize", str(exported), str(optimized), *map(str, family)]
    path = os.pathsep.join(p for p in (str(Path(encoderrt.__file__).parents[1]), os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run(command, cwd=exported.parent, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": path})  # this encoderrt, wherever it was imported from
    if result.returncode != 0:
        if f"[Errno {errno.ENOSPC}]" in result.stderr:
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: writing {optimized}")
        raise CompileError(f"graph optimisation failed (exit {result.returncode}): {result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def check_fusion(counts: dict[str, int], num_layers: int, gelus: int | None = None) -> None:
    """One attention and (unless the family says otherwise) one GELU per layer, two LayerNorms per layer."""
    gelus = num_layers if gelus is None else gelus
    attention = sum(counts.get(op, 0) for op in ATTENTION_OPS)
    gelu = sum(counts.get(op, 0) for op in GELU_OPS)
    layer_norms = sum(counts.get(op, 0) for op in LAYER_NORM_OPS if op != "EmbedLayerNormalization")
    problems = []
    if attention != num_layers:
        problems.append(f"{attention} fused attention ops for {num_layers} layers")
    if gelu != gelus:
        problems.append(f"{gelu} fused GELU ops for {num_layers} layers (expected {gelus})")
    if layer_norms < 2 * num_layers:  # two residual LayerNorms per layer
        problems.append(f"{layer_norms} fused LayerNorms for {num_layers} layers (expected {2 * num_layers})")
    if problems:
        raise FusionError("graph optimisation left layers unfused: " + "; ".join(problems) + f" (fused ops: {counts})")


if __name__ == "__main__":  # _optimize_in_child's process: the counts as the last line of its output
    import onnx

    exported_path, optimized_path, model_type, num_heads, hidden_size = sys.argv[1:]
    print(json.dumps(optimize(onnx.load(exported_path, load_external_data=False), Path(optimized_path), model_type,
                              int(num_heads), int(hidden_size))))
