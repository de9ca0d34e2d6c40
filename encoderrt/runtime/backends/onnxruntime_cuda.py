"""onnxruntime-gpu: the backend for artifacts with target "cuda" (CUDA, with TensorRT's EP first where present)."""

from __future__ import annotations

from pathlib import Path

from encoderrt.runtime.backends.base import BackendOptions, BackendUnavailable
from encoderrt.runtime.backends.onnxruntime_cpu import OnnxRuntimeBackend
from encoderrt.runtime.manifest import Manifest

TARGET = "cuda"


def create(manifest: Manifest, artifact_dir: Path, options: BackendOptions) -> OnnxRuntimeBackend:
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
    session_options = ort.SessionOptions()
    session_options.log_severity_level = 3
    model_path = artifact_dir / manifest.model_file
    return OnnxRuntimeBackend([ort.InferenceSession(str(model_path), session_options, providers=providers)], model_path,
                              manifest.inputs)
