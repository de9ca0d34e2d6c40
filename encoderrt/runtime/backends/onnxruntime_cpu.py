"""onnxruntime on the CPU: the backend for artifacts with target "cpu".

`OnnxRuntimeBackend` serves any onnxruntime session; the cuda target builds its session with
other providers and reuses it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from encoderrt.runtime.backends.base import BackendOptions, BackendUnavailable, Batch, Capabilities, Outputs
from encoderrt.runtime.manifest import Manifest

TARGET = "cpu"
KEEP_UNFUSED = ["SkipLayerNormFusion"]
"""Compile leaves residual Adds beside LayerNormalization on purpose (faster on CPU; see compile/optimize.py)."""


class OnnxRuntimeBackend:
    def __init__(self, session: Any, model_path: Path, input_names: tuple[str, ...]):
        declared = tuple(i.name for i in session.get_inputs())
        if set(declared) != set(input_names):
            raise ValueError(f"{model_path.name} takes inputs {declared}, the manifest says {input_names}")
        self._session = session
        self.input_names = input_names
        self.output_names = tuple(o.name for o in session.get_outputs())
        self.max_batch_tokens = None
        self.parallel_runs = 1
        self.execution = f"onnxruntime {', '.join(session.get_providers())}"
        self.capabilities = Capabilities()

    def run(self, batch: Batch) -> Outputs:
        names = batch.wanted(self.output_names)
        return dict(zip(names, self._session.run(list(names), batch.padded())))


def create(manifest: Manifest, artifact_dir: Path, options: BackendOptions) -> OnnxRuntimeBackend:
    try:
        import onnxruntime as ort
    except ImportError:
        raise BackendUnavailable("the cpu target needs onnxruntime: pip install onnxruntime") from None
    session_options = ort.SessionOptions()
    session_options.intra_op_num_threads = options.resolved_threads()
    session_options.inter_op_num_threads = 1
    session_options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session_options.log_severity_level = 3
    model_path = artifact_dir / manifest.model_file
    session = ort.InferenceSession(str(model_path), session_options, providers=["CPUExecutionProvider"],
                                   disabled_optimizers=KEEP_UNFUSED)
    return OnnxRuntimeBackend(session, model_path, manifest.inputs)
