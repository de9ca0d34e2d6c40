"""TensorRT on an NVIDIA GPU: the backend for artifacts with target "tensorrt".

One execution context per optimisation profile, chosen by the batch's shape; one CUDA stream;
pinned host staging buffers and device buffers sized for each profile's largest batch at load;
copies and the run are asynchronous on the stream, with one synchronisation per batch. CUDA is
reached through cuda-python, not torch: the serving path stays torch-free.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from encoderrt.runtime.backends.base import BackendOptions, BackendUnavailable
from encoderrt.runtime.engine_record import EngineRecord, check_engine_compatibility, pick_profile
from encoderrt.runtime.manifest import Manifest

TARGET = "tensorrt"
_INSTALL = "pip install 'encoderrt[gpu]' (tensorrt and cuda-python)"


def _cuda_check(result):
    error, *values = result if isinstance(result, tuple) else (result,)
    if int(error) != 0:
        raise RuntimeError(f"CUDA call failed with error {int(error)}")
    return values[0] if len(values) == 1 else values


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
        self._output = manifest.outputs[0]
        self._profiles = record.profiles
        logger = trt.Logger(trt.Logger.WARNING)
        self._engine = trt.Runtime(logger).deserialize_cuda_engine((artifact_dir / manifest.engine["file"]).read_bytes())
        if self._engine is None:
            raise BackendUnavailable("TensorRT could not load the engine file")
        self._stream = _cuda_check(cudart.cudaStreamCreate())
        self._contexts = []
        for index, _ in enumerate(self._profiles):
            context = self._engine.create_execution_context()
            context.set_optimization_profile_async(index, self._stream)
            self._contexts.append(context)
        largest = max(p.max_batch * p.max_length for p in self._profiles)
        rows = max(p.max_batch for p in self._profiles)
        width = manifest.shape.output_dim
        self._host = {name: self._pinned(largest * 8) for name in self.input_names}
        self._device = {name: _cuda_check(cudart.cudaMalloc(largest * 8)) for name in self.input_names}
        self._out_host = self._pinned(rows * width * 4)
        self._out_device = _cuda_check(cudart.cudaMalloc(rows * width * 4))
        self._out_dtype = np.float32

    def _pinned(self, size: int) -> int:
        return _cuda_check(self._cudart.cudaMallocHost(size))

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        cudart = self._cudart
        rows, width = feeds["input_ids"].shape
        context = self._contexts[pick_profile(self._profiles, rows, width)]
        kind_h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        for name in self.input_names:
            data = np.ascontiguousarray(feeds[name], dtype=np.int64)
            staging = np.ctypeslib.as_array((ctypes.c_int64 * data.size).from_address(self._host[name]))
            staging[:] = data.ravel()
            _cuda_check(cudart.cudaMemcpyAsync(self._device[name], self._host[name], data.nbytes, kind_h2d, self._stream))
            context.set_input_shape(name, (rows, width))
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
