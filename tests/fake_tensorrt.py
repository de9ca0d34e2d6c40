"""Stand-ins for `tensorrt` and `cuda.bindings.runtime`, enough to run the TensorRT backend on a CPU.

"Device memory" is host memory and the "engine file" is an ONNX graph, run by onnxruntime (padded)
or onnx's reference evaluator (packed, the plugin in numpy). Everything the backend does itself
(staging through pinned buffers, shapes, dtypes, profile choice, splitting packed batches,
refusing a mismatched engine) runs for real, and the numbers it returns come from the graph.
"""

from __future__ import annotations

import ctypes
import sys
import types

import numpy as np


class _Graph:
    def __init__(self, model_bytes: bytes):
        import onnx

        model = onnx.load_from_string(model_bytes)
        self.output = model.graph.output[0].name
        self.inputs = {i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) for i in model.graph.input}
        if any(op.domain == "encoderrt" for op in model.opset_import):
            from onnx.reference import ReferenceEvaluator

            from encoderrt.runtime.backends.onnx_reference import plugin_ops

            evaluator = ReferenceEvaluator(model, new_ops=plugin_ops())
            self.run = lambda feeds: evaluator.run(None, feeds)[0]
        else:
            import onnxruntime

            options = onnxruntime.SessionOptions()
            if any(node.op_type == "DequantizeLinear" for node in model.graph.node):
                # TensorRT accumulates int8 products in 32 bits; onnxruntime's fused int8 kernels on a CPU without
                # VNNI add pairs in int16 and saturate (an AVX2 EPYC: MiniLM's mean cosine 0.9957 against 0.9961
                # unfused). Unfused, each DequantizeLinear feeds a float MatMul: the int8 values, summed exactly.
                options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
            session = onnxruntime.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
            self.run = lambda feeds: session.run(None, feeds)[0]


class FakeContext:
    def __init__(self, engine: "FakeEngine"):
        self.engine, self.profile, self.shapes, self.addresses = engine, None, {}, {}

    def set_optimization_profile_async(self, index, stream):
        self.profile = index

    def set_input_shape(self, name, shape):
        self.shapes[name] = tuple(shape)

    def set_tensor_address(self, name, address):
        self.addresses[name] = address

    def execute_async_v3(self, stream):
        graph = self.engine.graph
        feeds = {}
        for name, dtype in graph.inputs.items():
            count = int(np.prod(self.shapes[name]))
            raw = ctypes.string_at(self.addresses[name], count * np.dtype(dtype).itemsize)
            feeds[name] = np.frombuffer(raw, dtype=dtype).reshape(self.shapes[name])
        out = np.ascontiguousarray(graph.run(feeds), dtype=np.float32)
        ctypes.memmove(self.addresses[graph.output], out.ctypes.data, out.nbytes)
        self.output_shape = out.shape
        self.engine.calls.append((self.profile, {name: feeds[name].shape for name in feeds}))
        return True

    def get_tensor_shape(self, name):
        return self.output_shape


class FakeEngine:
    def __init__(self, model_bytes: bytes):
        self.graph, self.calls = _Graph(model_bytes), []

    def create_execution_context(self):
        return FakeContext(self)


class FakePlugins(types.ModuleType):
    """`tensorrt.plugin`: records what a module registers, by plugin id and kind (register, autotune, aot_impl)."""

    def __init__(self):
        super().__init__("tensorrt.plugin")
        self.registered: dict[str, dict[str, object]] = {}
        for kind in ("register", "autotune", "aot_impl", "impl"):
            setattr(self, kind, self._decorator(kind))
        self.TensorDesc = self.Tensor = object
        self.AutoTuneCombination = lambda *formats: formats
        self.KernelLaunchParams = types.SimpleNamespace
        self.SymIntExprs = lambda count: ("SymIntExprs", count)

    def _decorator(self, kind):
        def decorate(plugin_id):
            def record(function):
                self.registered.setdefault(plugin_id, {})[kind] = function
                return function
            return record
        return decorate


def install(monkeypatch, version: str = "10.14.1", capability: tuple[int, int] = (9, 0)) -> list[FakeEngine]:
    """Put the fakes where the backend imports them; returns the list that collects the loaded engines.

    `sys.modules["tensorrt"].plugin.registered` then shows the plugins registered with the fake.
    """
    engines: list[FakeEngine] = []
    memory: list[ctypes.Array] = []

    def allocate(nbytes):
        buffer = ctypes.create_string_buffer(int(nbytes))
        memory.append(buffer)
        return 0, ctypes.addressof(buffer)

    def copy(destination, source, nbytes, kind, stream):
        ctypes.memmove(destination, source, nbytes)
        return (0,)

    def deserialize(self, data):
        engines.append(FakeEngine(bytes(data)))
        return engines[-1]

    tensorrt = types.ModuleType("tensorrt")
    tensorrt.__version__ = version
    tensorrt.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, level=None: None})
    tensorrt.Runtime = type("Runtime", (), {"__init__": lambda self, logger: None, "deserialize_cuda_engine": deserialize})
    tensorrt.plugin = FakePlugins()
    tensorrt.float16, tensorrt.bfloat16 = "float16", "bfloat16"
    runtime = types.ModuleType("cuda.bindings.runtime")
    runtime.cudaGetDeviceCount = lambda: (0, 1)
    runtime.cudaGetDeviceProperties = lambda device: (0, types.SimpleNamespace(major=capability[0], minor=capability[1]))
    runtime.cudaStreamCreate = lambda: (0, 1)
    runtime.cudaMalloc = allocate
    runtime.cudaMallocHost = allocate
    runtime.cudaMemcpyKind = types.SimpleNamespace(cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2)
    runtime.cudaMemcpyAsync = copy
    runtime.cudaStreamSynchronize = lambda stream: (0,)
    cuda, bindings = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
    cuda.bindings, bindings.runtime = bindings, runtime
    modules = {"tensorrt": tensorrt, "tensorrt.plugin": tensorrt.plugin, "cuda": cuda, "cuda.bindings": bindings,
               "cuda.bindings.runtime": runtime}
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "encoderrt.kernels.tensorrt_plugin", raising=False)  # registers again, with the fake
    return engines
