"""onnxruntime-gpu: the backend for artifacts with target "cuda" (CUDA, with TensorRT's EP first where present)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from encoderrt.runtime.backends.base import BackendOptions, BackendUnavailable
from encoderrt.runtime.manifest import Manifest

TARGET = "cuda"


class OnnxRuntimeCudaBackend:
    def __init__(self, model_path: Path, input_names: tuple[str, ...]):
        try:
            import onnxruntime as ort
        except ImportError:
            raise BackendUnavailable("the cuda target needs onnxruntime-gpu: pip install 'encoderrt[cuda]'") from None
        available = ort.get_available_providers()
        if "CUDAExecutionProvider" not in available:
            raise BackendUnavailable(
                "the cuda target needs onnxruntime-gpu (this onnxruntime offers only "
                f"{', '.join(available)}): pip uninstall onnxruntime && pip install 'encoderrt[cuda]'")
        providers = [p for p in ("TensorrtExecutionProvider", "CUDAExecutionProvider") if p in available]
        options = ort.SessionOptions()
        options.log_severity_level = 3
        self._session = ort.InferenceSession(str(model_path), options, providers=providers)
        self.input_names = input_names
        self.max_batch_tokens = None
        self._output = self._session.get_outputs()[0].name

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        return self._session.run([self._output], feeds)[0]


def create(manifest: Manifest, artifact_dir: Path, options: BackendOptions) -> OnnxRuntimeCudaBackend:
    return OnnxRuntimeCudaBackend(artifact_dir / manifest.model_file, manifest.inputs)
