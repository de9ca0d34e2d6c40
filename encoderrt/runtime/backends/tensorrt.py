"""TensorRT on an NVIDIA GPU: the backend for artifacts with target "tensorrt".

Padded engines have one execution context per optimisation profile, chosen by the batch's shape.
Packed engines (attention through encoderrt's plugin, compiled into the engine) have one profile;
the backend drops the batch's padding before the run, and splits a batch with more rows than the
profile holds. One CUDA stream; pinned host staging buffers and device buffers sized for the
largest batch at load; copies and the run are asynchronous, with one synchronisation per run.
CUDA is reached through cuda-python, not torch: the serving path stays torch-free.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from encoderrt.runtime.backends.base import BackendOptions, BackendUnavailable, Batch, Capabilities, Outputs
from encoderrt.runtime.engine_record import EngineRecord, check_engine_compatibility, pick_profile
from encoderrt.runtime.manifest import Manifest
from encoderrt.runtime.packing import packed_input_names

TARGET = "tensorrt"
LAYOUTS = ("padded", "packed")
_INSTALL = "pip install 'encoderrt[gpu]' (tensorrt and cuda-python)"


def _cuda_check(result):
    error, *values = result if isinstance(result, tuple) else (result,)
    if int(error) != 0:
        raise RuntimeError(f"CUDA call failed with error {int(error)}")
    return values[0] if len(values) == 1 else values


def _register_plugin() -> None:
    """The packed attention plugin's kernel is inside the engine; registering its description too costs
    nothing and lets TensorRT versions that look the plugin up at load find it. No torch is imported."""
    try:
        import encoderrt.kernels.tensorrt_plugin  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailable(f"packed engines need TensorRT's plugin module ({exc.name} is missing): {_INSTALL}") from None


def input_capacities(record: EngineRecord, graph_inputs: tuple[str, ...]) -> dict[str, tuple[int, type]]:
    """The most elements each graph input holds in any profile, and its dtype: what the buffers are sized for."""
    if record.packed:
        return {name: (record.packed.max_sequences + 1, np.int32) if name == "cu_seqlens" else (record.packed.max_tokens, np.int64)
                for name in graph_inputs}
    largest = max(p.max_batch * p.max_length for p in record.profiles)
    return {name: (largest, np.int64) for name in graph_inputs}


def max_rows(record: EngineRecord) -> int:
    return record.packed.max_sequences if record.packed else max(p.max_batch for p in record.profiles)


class TensorRTBackend:
    def __init__(self, manifest: Manifest, artifact_dir: Path):
        try:
            import tensorrt as trt
            from cuda.bindings import runtime as cudart
        except ImportError as exc:
            raise BackendUnavailable(f"the tensorrt target needs TensorRT and cuda-python ({exc.name} is missing): {_INSTALL}") from None
        if not manifest.engine:
            raise BackendUnavailable("the manifest has no TensorRT engine record; recompile with compile-model --target tensorrt")
        self._cudart = cudart
        record = EngineRecord.from_dict(manifest.engine["record"])
        count = _cuda_check(cudart.cudaGetDeviceCount())
        if not count:
            raise BackendUnavailable("the tensorrt target needs an NVIDIA GPU; none is visible")
        properties = _cuda_check(cudart.cudaGetDeviceProperties(0))
        check_engine_compatibility(record, trt.__version__, f"{properties.major}.{properties.minor}")
        self.input_names = manifest.inputs
        self.max_batch_tokens = record.max_batch_tokens
        self.parallel_runs = 1
        self.capabilities = Capabilities(packed_input=record.packed is not None)
        self.execution = f"TensorRT {record.tensorrt_version} {record.precision} on compute capability {record.compute_capability}"
        self._record = record
        self._graph_inputs = packed_input_names("token_type_ids" in manifest.inputs) if record.packed else manifest.inputs
        self._output = manifest.outputs[0]
        self.output_names = (self._output,)
        """The engine is built for the first output alone (compile/tensorrt.py)."""
        if record.packed:
            _register_plugin()
        logger = trt.Logger(trt.Logger.WARNING)
        self._engine = trt.Runtime(logger).deserialize_cuda_engine((artifact_dir / manifest.engine["file"]).read_bytes())
        if self._engine is None:
            raise BackendUnavailable("TensorRT could not load the engine file (see its log above)")
        self._stream = _cuda_check(cudart.cudaStreamCreate())
        self._contexts = []
        for index in range(len(record.profiles) or 1):
            context = self._engine.create_execution_context()
            context.set_optimization_profile_async(index, self._stream)
            self._contexts.append(context)
        self._host, self._device = {}, {}
        for name, (elements, dtype) in input_capacities(record, self._graph_inputs).items():
            nbytes = elements * np.dtype(dtype).itemsize
            self._host[name] = _cuda_check(cudart.cudaMallocHost(nbytes))
            self._device[name] = _cuda_check(cudart.cudaMalloc(nbytes))
        output_bytes = max_rows(record) * manifest.shape.output_dim * 4
        self._out_host = _cuda_check(cudart.cudaMallocHost(output_bytes))
        self._out_device = _cuda_check(cudart.cudaMalloc(output_bytes))

    def run(self, batch: Batch) -> Outputs:
        batch.wanted(self.output_names)
        if not self._record.packed:
            profile = pick_profile(self._record.profiles, len(batch.rows), batch.width)
            return {self._output: self._execute(self._contexts[profile], batch.padded())}
        parts = [self._execute(self._contexts[0], part.packed()) for part in batch.split(self._record.packed.max_sequences)]
        return {self._output: parts[0] if len(parts) == 1 else np.concatenate(parts)}

    def _execute(self, context, arrays: dict[str, np.ndarray]) -> np.ndarray:
        cudart = self._cudart
        to_device = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        for name in self._graph_inputs:
            data = np.ascontiguousarray(arrays[name])
            ctypes.memmove(self._host[name], data.ctypes.data, data.nbytes)
            _cuda_check(cudart.cudaMemcpyAsync(self._device[name], self._host[name], data.nbytes, to_device, self._stream))
            context.set_input_shape(name, data.shape)
            context.set_tensor_address(name, self._device[name])
        context.set_tensor_address(self._output, self._out_device)
        if not context.execute_async_v3(self._stream):
            raise RuntimeError("TensorRT execution failed")
        shape = tuple(context.get_tensor_shape(self._output))
        nbytes = int(np.prod(shape)) * 4
        _cuda_check(cudart.cudaMemcpyAsync(self._out_host, self._out_device, nbytes,
                                           cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, self._stream))
        _cuda_check(cudart.cudaStreamSynchronize(self._stream))
        out = np.ctypeslib.as_array((ctypes.c_float * (nbytes // 4)).from_address(self._out_host))
        return out.reshape(shape).copy()


def create(manifest: Manifest, artifact_dir: Path, options: BackendOptions) -> TensorRTBackend:
    return TensorRTBackend(manifest, artifact_dir)
