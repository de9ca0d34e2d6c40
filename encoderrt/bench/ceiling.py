"""The machine's own GEMM ceiling, measured on the spot with the engine's own kernels.

For onnxruntime artifacts, fp32 and int8 (u8 x s8, the VNNI/AMX path of dynamic quantisation) run
through onnxruntime's MatMul / MatMulInteger on an FFN-shaped product, and bf16 through torch where
the CPU has bf16 instructions. For OpenVINO artifacts, f32, bf16 and int8 (FakeQuantize-fed MatMul,
which OpenVINO lowers to its AMX/VNNI int8 kernels) run through OpenVINO itself, with the
backend's streams. So the ceiling is what this CPU and this runtime can reach, not a datasheet figure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from encoderrt.runtime.backends.base import BackendOptions
from encoderrt.runtime.cpu import REPORTED_FLAGS, cpu_model_and_flags

ROWS = 512
"""Tokens in the measured product: a typical batch."""


@dataclass(frozen=True)
class Ceiling:
    precision: str
    gflops: float
    shape: tuple[int, int, int]
    kernel: str


def cpu_description() -> dict[str, object]:
    model, flags = cpu_model_and_flags()
    return {"model": model, "cores": BackendOptions().resolved_threads(), "flags": [f for f in REPORTED_FLAGS if f in flags]}


def cpu_tier(flags: list[str]) -> str:
    """The CPU's class for bf16/int8 speed: what a baseline's expectations are recorded per."""
    if "amx_bf16" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    if "avx512f" in flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "other"


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


def _openvino_gemm(k: int, n: int, precision: str, threads: int, seconds: float) -> float:
    from encoderrt.runtime.backends.base import Batch
    from encoderrt.runtime.backends.openvino import OpenVinoBackend, import_openvino
    from encoderrt.runtime.throughput import pass_seconds

    ov = import_openvino()
    import openvino.opset13 as ops  # after openvino itself, imported without its usage event

    rng = np.random.default_rng(0)
    a = ops.parameter([ROWS, k], ov.Type.f32, name="a")
    b = ops.constant(rng.standard_normal((k, n), dtype=np.float32))
    if precision == "int8":
        def fake_quantize(x, bound: float, levels: int):
            low, high = ops.constant(np.float32(-bound)), ops.constant(np.float32(bound))
            return ops.fake_quantize(x, low, high, low, high, levels)

        a_in, b_in = fake_quantize(a, 4.0, 256), fake_quantize(b, 4.0, 255)
    else:
        a_in, b_in = a, b
    product = ops.matmul(a_in, b_in, False, False)
    product.output(0).set_names({"product"})
    model = ov.Model([product], [a], "gemm")
    compiled = ov.Core().compile_model(model, "CPU", {"PERFORMANCE_HINT": "THROUGHPUT", "INFERENCE_NUM_THREADS": threads,
                                                       "INFERENCE_PRECISION_HINT": "f32" if precision == "fp32" else "bf16"})
    backend = OpenVinoBackend(compiled, ("a",), ("product",), "gemm")
    feeds = [Batch((), padded={"a": rng.standard_normal((ROWS, k), dtype=np.float32)})] * (4 * backend.parallel_runs)
    pass_seconds(backend, feeds)
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        best = min(best, pass_seconds(backend, feeds))
    return 2 * ROWS * k * n * len(feeds) / best / 1e9


def measure(hidden: int, intermediate: int, threads: int, flags: list[str], target: str = "cpu",
            seconds: float = 0.5) -> list[Ceiling]:
    """Every precision the target's runtime offers here (to compare an artifact with the other precisions too).

    `flags` are cpu_description()'s.
    """
    shape = (ROWS, hidden, intermediate)
    bf16 = "avx512_bf16" in flags or "amx_bf16" in flags
    if target == "openvino":
        precisions = ("fp32", "bf16", "int8") if bf16 else ("fp32", "int8")
        return [Ceiling(p, _openvino_gemm(hidden, intermediate, p, threads, seconds), shape, f"OpenVINO MatMul {p}")
                for p in precisions]
    ceilings = [Ceiling("fp32", _ort_gemm(hidden, intermediate, False, threads, seconds), shape, "onnxruntime MatMul")]
    ceilings.append(Ceiling("int8", _ort_gemm(hidden, intermediate, True, threads, seconds), shape, "onnxruntime MatMulInteger"))
    if bf16:
        rate = _torch_bf16(hidden, intermediate, threads, seconds)
        if rate is not None:
            ceilings.append(Ceiling("bf16", rate, shape, "torch matmul (oneDNN)"))
    return ceilings


def best(*measurements: list[Ceiling]) -> list[Ceiling]:
    """Per precision, the highest of several measurements: a busy moment on a shared machine only slows one down."""
    chosen: dict[str, Ceiling] = {}
    for ceilings in measurements:
        for c in ceilings:
            if c.precision not in chosen or c.gflops > chosen[c.precision].gflops:
                chosen[c.precision] = c
    return list(chosen.values())
