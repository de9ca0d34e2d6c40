"""The machine's own GEMM ceiling, measured on the spot with the engine's own kernels.

fp32 and int8 (u8 x s8, the VNNI/AMX path of dynamic quantisation) run through onnxruntime's
MatMul / MatMulInteger on an FFN-shaped product, so the ceiling is what this CPU and this
onnxruntime can reach, not a datasheet figure. bf16 is measured with torch where it is installed
and the CPU has bf16 instructions.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass

import numpy as np

from encoderrt.runtime.backends.base import BackendOptions

ROWS = 512
"""Tokens in the measured product: a typical batch."""


@dataclass(frozen=True)
class Ceiling:
    precision: str
    gflops: float
    shape: tuple[int, int, int]
    kernel: str


def cpu_description() -> dict[str, object]:
    model, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name") and model in ("unknown", ""):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
    return {"model": model, "cores": BackendOptions().resolved_threads(), "flags": [f for f in wanted if f in flags]}


def _ort_gemm(k: int, n: int, integer: bool, threads: int, seconds: float) -> float:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    if integer:
        a_type, b = TensorProto.UINT8, rng.integers(-127, 127, size=(k, n), dtype=np.int8)
        node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
        out_type = TensorProto.INT32
        a = rng.integers(0, 255, size=(ROWS, k), dtype=np.uint8)
    else:
        a_type, b = TensorProto.FLOAT, rng.standard_normal((k, n), dtype=np.float32)
        node = helper.make_node("MatMul", ["a", "b"], ["y"])
        out_type = TensorProto.FLOAT
        a = rng.standard_normal((ROWS, k), dtype=np.float32)
    graph = helper.make_graph([node], "gemm", [helper.make_tensor_value_info("a", a_type, [ROWS, k])],
                              [helper.make_tensor_value_info("y", out_type, [ROWS, n])],
                              [onnx.numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return _rate(lambda: session.run(None, {"a": a}), k, n, seconds)


def _rate(run, k: int, n: int, seconds: float) -> float:
    run()
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return 2 * ROWS * k * n / best / 1e9


def _torch_bf16(k: int, n: int, threads: int, seconds: float) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    a = torch.randn(ROWS, k, dtype=torch.bfloat16)
    b = torch.randn(k, n, dtype=torch.bfloat16)
    return _rate(lambda: a @ b, k, n, seconds)


def measure(hidden: int, intermediate: int, threads: int, flags: list[str], seconds: float = 0.5) -> list[Ceiling]:
    """fp32 and int8 always (to compare an artifact with the other precision too); bf16 where the CPU and torch allow.

    `flags` are cpu_description()'s.
    """
    shape = (ROWS, hidden, intermediate)
    ceilings = [Ceiling("fp32", _ort_gemm(hidden, intermediate, False, threads, seconds), shape, "onnxruntime MatMul")]
    ceilings.append(Ceiling("int8", _ort_gemm(hidden, intermediate, True, threads, seconds), shape, "onnxruntime MatMulInteger"))
    if "avx512_bf16" in flags or "amx_bf16" in flags:
        rate = _torch_bf16(hidden, intermediate, threads, seconds)
        if rate is not None:
            ceilings.append(Ceiling("bf16", rate, shape, "torch matmul (oneDNN)"))
    return ceilings
