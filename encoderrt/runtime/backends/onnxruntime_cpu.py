"""onnxruntime on the CPU: the backend for artifacts with target "cpu".

`OnnxRuntimeBackend` serves any onnxruntime session; the cuda target builds its session with
other providers and reuses it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from encoderrt.runtime.backends.base import BackendOptions, BackendUnavailable, Batch, Capabilities, Outputs
from encoderrt.runtime.manifest import TOKEN_EMBEDDINGS, Manifest

TARGET = "cpu"
KEEP_UNFUSED = ["SkipLayerNormFusion"]
"""Compile leaves residual Adds beside LayerNormalization on purpose (faster on CPU; see compile/optimize.py)."""


class OnnxRuntimeBackend:
    def __init__(self, session: Any, model_path: Path, input_names: tuple[str, ...]):
        declared = tuple(i.name for i in session.get_inputs())
        if set(declared) != set(input_names):
            raise ValueError(f"{model_path.name} takes inputs {declared}, the manifest says {input_names}")
        self._session = session
        self._output = session.get_outputs()[0].name
        self.input_names = input_names
        self.max_batch_tokens = None
        self.parallel_runs = 1
        self.execution = f"onnxruntime {', '.join(session.get_providers())}"
        self.capabilities = Capabilities(token_states=TOKEN_EMBEDDINGS in {o.name for o in session.get_outputs()})

    def run(self, batch: Batch) -> Outputs:
        if batch.token_states and self._output == TOKEN_EMBEDDINGS:  # a multi-vector graph: token vectors alone
            states = self._session.run([TOKEN_EMBEDDINGS], batch.padded())[0]
            return Outputs(states, states)
        if batch.token_states:
            pooled, states = self._session.run([self._output, TOKEN_EMBEDDINGS], batch.padded())
            return Outputs(pooled, states)
        return Outputs(self._session.run([self._output], batch.padded())[0])


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
