"""onnxruntime on the CPU: the backend for artifacts with target "cpu".

`OnnxRuntimeBackend` serves any onnxruntime sessions; the cuda target builds its session with
other providers and reuses it.

Streams, as OpenVINO's (openvino.py): on a CPU of several cores a small model runs one single-threaded session per
core, each taking its own batch, and a batch that is the only work runs on one more session over every core. An
op of a short batch is too short to split across cores without waiting, so one session over two cores left half of
them idle. all-MiniLM-L6-v2 fp32, 2-core AVX2 EPYC, the engine at 8 / 32 clients, two rounds: passages
5,500-5,800 -> 6,500-7,000 tokens/s, single queries at 32 clients 4,050-4,300 -> 4,550-4,650; a lone query still
takes 3.1 ms (one thread: 5.0-5.5). Compile writes the weights beside the graph (WEIGHTS_SUFFIX), where
onnxruntime maps them rather than copying them into each session: the sessions share one copy, and each adds only
its prepacked GEMM weights. MiniLM's three sessions took 318 MB with the weights inside the graph and 162 MB with
them beside it, at the same speed and the same outputs. Streams pay off for base-sized models too: GTE base
fp32 (453 MB of GEMM weights), passages at 8 clients, four interleaved rounds: 477 -> 524 tokens/s (each round +5%
to +17%), resident memory 0.57 -> 1.49 GB. So every session's copy counts against STREAMS_MEMORY_BYTES, and a model
whose copies would pass it keeps one session over every core.
"""

from __future__ import annotations

import queue
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from encoderrt.runtime.backends.base import BackendOptions, BackendUnavailable, Batch, Capabilities, Outputs
from encoderrt.runtime.manifest import Manifest

TARGET = "cpu"
KEEP_UNFUSED = ["SkipLayerNormFusion"]
"""Compile leaves residual Adds beside LayerNormalization on purpose (faster on CPU; see compile/optimize.py)."""
STREAMS_MEMORY_BYTES = 2 * 2**30
"""What the prepacked GEMM weights of a session per core plus one for lone batches may take together (a base-sized
model at fp32 on 2 cores, 1.4 GB; a large one keeps one session, as a base one does past 4 cores)."""
WEIGHTS_SUFFIX = ".data"
"""The graph's weights, as ONNX external data: model.onnx.data beside model.onnx (artifacts compiled before this
keep them inside the graph, and load as they did)."""


class OnnxRuntimeBackend:
    def __init__(self, sessions: Sequence[Any], model_path: Path, input_names: tuple[str, ...], alone: Any = None):
        """`sessions`: one per stream; `alone`: a session over every core for lone batches (None: they take a
        stream)."""
        declared = tuple(i.name for i in sessions[0].get_inputs())
        if set(declared) != set(input_names):
            raise ValueError(f"{model_path.name} takes inputs {declared}, the manifest says {input_names}")
        self._streams: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for session in sessions:
            self._streams.put(session)
        self._alone = alone
        self.input_names = input_names
        self.output_names = tuple(o.name for o in sessions[0].get_outputs())
        self.max_batch_tokens = None
        self.parallel_runs = len(sessions)
        streams = f", {len(sessions)} streams" if len(sessions) > 1 else ""
        lone = "; a lone batch on every core" if alone is not None else ""
        self.execution = f"onnxruntime {', '.join(sessions[0].get_providers())}{streams}{lone}"
        self.capabilities = Capabilities(runs_alone=alone is not None)

    def run(self, batch: Batch) -> Outputs:
        names = batch.wanted(self.output_names)
        if batch.alone and self._alone is not None:
            return dict(zip(names, self._alone.run(list(names), batch.padded())))
        session = self._streams.get()  # never waits while callers respect parallel_runs
        try:
            return dict(zip(names, session.run(list(names), batch.padded())))
        finally:
            self._streams.put(session)


def create(manifest: Manifest, artifact_dir: Path, options: BackendOptions) -> OnnxRuntimeBackend:
    try:
        import onnxruntime as ort
    except ImportError:
        raise BackendUnavailable("the cpu target needs onnxruntime: pip install onnxruntime") from None
    model_path = artifact_dir / manifest.model_file

    def session(threads: int) -> Any:
        session_options = ort.SessionOptions()
        session_options.intra_op_num_threads = threads
        session_options.inter_op_num_threads = 1
        session_options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session_options.log_severity_level = 3
        return ort.InferenceSession(str(model_path), session_options, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=KEEP_UNFUSED)

    threads = options.resolved_threads()
    if threads == 1 or (threads + 1) * prepacked_bytes(manifest) > STREAMS_MEMORY_BYTES:
        return OnnxRuntimeBackend([session(threads)], model_path, manifest.inputs)
    alone = session(threads) if options.lone_runs else None
    return OnnxRuntimeBackend([session(1) for _ in range(threads)], model_path, manifest.inputs, alone=alone)


def prepacked_bytes(manifest: Manifest) -> int:
    """What one session's prepacked GEMM weights take: the model's per-token matrix weights, a byte each at int8
    and four at fp32 (the embedding tables are not prepacked, and stay mapped from the weights file)."""
    return manifest.shape.per_token_weights() * (1 if manifest.precision == "int8" else 4)


def weights_file(model_path: Path) -> Path:
    """Where the graph's weights are stored beside it (model.onnx.data)."""
    return model_path.with_name(model_path.name + WEIGHTS_SUFFIX)
