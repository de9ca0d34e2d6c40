"""OpenVINO on the CPU: the backend for artifacts with target "openvino" (an OpenVINO IR, model.xml + model.bin).

OpenVINO has what onnxruntime lacks on recent x86 CPUs: bf16 GEMMs on AMX tiles or avx512_bf16, and
int8 GEMMs on AMX for NNCF-quantised graphs. Precision is a hint at load, not a property of the IR:
an fp32 artifact is pinned to f32 (OpenVINO would otherwise pick bf16 by itself on AMX), a bf16 one
asks for bf16 and falls back to f32 on a CPU without bf16 instructions, which `execution` says.

Throughput comes from streams, not threads: on 2 cores two single-threaded streams, each running
its own batch, measured 1.25-1.7x one stream with two threads (all-MiniLM-L6-v2, bf16, AMX), since
a small model's ops are too short to split across cores without waiting on each other. So the
backend holds one infer request per stream and reports them as `parallel_runs`. A lone batch would then
get one core of two: a batch marked `alone` runs on a second compilation with one stream over every thread
(PERFORMANCE_HINT LATENCY). One short query took 3.8-5.2 ms there against 6.0-6.8 ms on one stream
(bf16 MiniLM, 2-core EPYC; int8 2.9-3.3 against 4.6-4.9), and the streams' throughput did not change.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from encoderrt.runtime.backends.base import (
    BackendOptions,
    BackendUnavailable,
    Batch,
    Capabilities,
    Outputs,
    padded_width,
)
from encoderrt.runtime.manifest import Manifest

TARGET = "openvino"
MODEL_FILE = "model.xml"
"""The IR's topology; its weights are model.bin beside it."""
_INSTALL = "pip install openvino"


ONEDNN_PRIMITIVES = 64
"""oneDNN primitives kept for reuse (its default: 1,024), read from ONEDNN_PRIMITIVE_CACHE_CAPACITY when OpenVINO
first runs a graph; the variable, where set, wins. Each new batch shape makes new primitives: with the default (and
SHAPE_CACHE_ENTRIES at 100) a bulk job of 200k short texts grew 541 -> 585 MB, and 1M rows peaked at 700 MB against
537 MB for 10k (bf16 MiniLM, 2-core EPYC); with 64 it held 541-573 MB, at the same speed (12.0-13.2k tokens/s
either way, alternating runs)."""


TELEMETRY_MODULE = "openvino_telemetry"


@contextlib.contextmanager
def without_usage_telemetry() -> Iterator[None]:
    """Imports made inside find no openvino_telemetry, so OpenVINO and NNCF bind their no-op stand-ins for it.

    `import openvino` sends a usage event to Google Analytics unless the user's consent file says no, from a process
    it forks: a server would try to reach the internet from a closed network, and fork beside gRPC's and the
    backends' threads. encoderrt sends nothing. The module is importable again afterwards, for whoever asks for it.
    """
    hidden = sys.modules.get(TELEMETRY_MODULE)
    sys.modules[TELEMETRY_MODULE] = None  # type: ignore[assignment]  # None in sys.modules: the import fails
    try:
        yield
    finally:
        if hidden is None:
            del sys.modules[TELEMETRY_MODULE]
        else:
            sys.modules[TELEMETRY_MODULE] = hidden


def import_openvino() -> Any:
    """The openvino module, imported without its usage event (without_usage_telemetry)."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(ONEDNN_PRIMITIVES))
    try:
        with without_usage_telemetry():
            import openvino
    except ImportError:
        raise BackendUnavailable(f"the openvino target needs OpenVINO: {_INSTALL}") from None
    return openvino


def _core() -> Any:
    return import_openvino().Core()


def _has_bf16(core: Any) -> bool:
    return "BF16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def native_bf16() -> bool:
    """Whether this CPU computes in bf16 natively (AMX or avx512_bf16), as OpenVINO sees it."""
    try:
        return _has_bf16(_core())
    except BackendUnavailable:
        return False


def execution_precision(precision: str, bf16: bool) -> str:
    """OpenVINO's inference precision for an artifact's precision on a CPU with (or without) native bf16.

    int8 graphs keep their non-quantised ops in bf16 where the CPU has it, as OpenVINO does by default.
    """
    if precision == "fp32":
        return "f32"
    if precision in ("bf16", "int8"):
        return "bf16" if bf16 else "f32"
    raise BackendUnavailable(f"the openvino target runs fp32, bf16 and int8 artifacts, not {precision}")


_GATE_ACTIVATIONS = ("Swish", "Gelu")


def gated_product(node: Any) -> bool:
    """Whether `node` is a gated FFN's product (SwiGLU, GeGLU): a Multiply with a Swish or a GELU beside the up
    projection, which feeds the down projection."""
    return node.get_type_name() == "Multiply" and any(
        node.input_value(i).get_node().get_type_name() in _GATE_ACTIVATIONS for i in range(2))


def keep_gated_ffns_unfused(model: Any) -> int:
    """Store every gated feed-forward's down projection weight transposed (its MatMul without transpose_b), in
    place, so that OpenVINO's CPU plugin keeps the FFN as oneDNN GEMMs; returns how many it rewrote.

    On AMX in bf16, the plugin fuses a gated FFN (SwiGLU, GeGLU: gate and up projections, the activation, their
    product, the down projection) into one `LLMMLP` node, whose kernel splits the down projection over half the
    threads of a stream: a stream of one thread (two streams on two cores, this backend's default) divides by zero
    and the process dies of SIGFPE as it compiles (OpenVINO 2026.4, every gated family: NomicBERT, GTE, EuroBERT,
    EmbeddingGemma, the decoders). Its pattern matches a down projection with transpose_b only. Without the node the
    FFNs are faster, too: a 6-layer EuroBERT of base width (768 / 3,072) ran 1.13-1.22x its tokens/s (8 x 128
    tokens) and 1.26-1.33x (32 x 16) on two single-thread streams, 1.12-1.18x on one stream of two threads (two runs,
    2-core Sapphire Rapids). Transposing a stored weight changes no value; an IR already rewritten has nothing left
    to rewrite."""
    ops = import_openvino().opset13
    rewritten = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "MatMul" or not node.get_attributes()["transpose_b"]:
            continue
        weight = node.input_value(1).get_node()
        if not gated_product(node.input_value(0).get_node()) or weight.get_type_name() != "Constant":
            continue
        transposed = ops.constant(np.ascontiguousarray(weight.get_data().T), shared_memory=False)
        down = ops.matmul(node.input_value(0), transposed, node.get_attributes()["transpose_a"], False)
        down.set_friendly_name(node.get_friendly_name())
        node.output(0).replace(down.output(0))
        rewritten += 1
    return rewritten


IDS_INPUT = "input_ids"
WIDTH_BUCKET = 16
"""A batch's feeds are padded to a multiple of this many tokens: OpenVINO's CPU plugin prepares every node again for
each input shape it has not just run, about 0.8 ms on a short query, so lone queries of 4-16 tokens took 2.3 ms a
query on the padded graph and 1.5 ms padded to 16 (bf16 all-MiniLM-L6-v2, 2-core Sapphire Rapids; padded to 32,
1.8). The padding is the batch's own kind (mask 0), so the answers are those of a batch with a longer row; an
unpadded graph (compile/unpad.py) spends no GEMM work on it, and groups its real rows likewise.

The scheduler counts rows at this width when it cuts batches (Capabilities.width_multiple), so the full batches of
one width share a shape: a bulk job at 1,024 tokens changed shape on 340 of 1,411 runs instead of 844 of 1,271,
and ran 39,430 tokens/s against 37,140 (20,000 passages, medians of 3 alternating rounds in one process); served
passages gained 2.2% at 8 clients and 1.2% at 32 (engine, 5 rounds), single queries moved within noise (0.993x)."""


def _bucketed(feeds: dict[str, np.ndarray], pad_token_id: int) -> dict[str, np.ndarray]:
    if IDS_INPUT not in feeds:  # a token graph's feeds only
        return feeds
    width = feeds[IDS_INPUT].shape[1]
    extra = padded_width(width, WIDTH_BUCKET) - width
    if not extra:
        return feeds
    return {name: _widened(value, extra, pad_token_id if name == IDS_INPUT else 0) if value.ndim == 2 else value
            for name, value in feeds.items()}


def _widened(value: np.ndarray, extra: int, fill: int) -> np.ndarray:
    """`value` with `extra` columns of `fill` on the right, made on the batcher's thread with the GIL held: a lone
    query's feeds took 78 us to make with np.pad, 11 us so (16 queries: 105 against 37; 2-core Sapphire Rapids)."""
    rows, width = value.shape
    widened = np.full((rows, width + extra), fill, dtype=value.dtype)
    widened[:, :width] = value
    return widened


class OpenVinoBackend:
    def __init__(self, compiled: Any, input_names: tuple[str, ...], output_names: tuple[str, ...], execution: str,
                 alone: Any = None, pad_token_id: int = 0):
        """`alone`: the model compiled for one stream over every thread, for lone batches (None: they run on a stream);
        `pad_token_id`: the input id of the padding the feeds get (WIDTH_BUCKET)."""
        declared = {name for port in compiled.inputs for name in port.get_names()}
        if not set(input_names) <= declared:
            raise ValueError(f"the OpenVINO model takes inputs {sorted(declared)}, the manifest says {input_names}")
        produced = {name for port in compiled.outputs for name in port.get_names()}
        if not set(output_names) <= produced:
            raise ValueError(f"the OpenVINO model has outputs {sorted(produced)}, the manifest says {output_names}")
        self.input_names = input_names
        self.output_names = output_names
        self.max_batch_tokens = None
        self.parallel_runs = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        self.execution = execution
        self._pad_token_id = pad_token_id
        warm_up = _warm_up_feeds(compiled)
        self._idle = _warmed_requests(compiled, self.parallel_runs, warm_up)
        self._alone = _warmed_requests(alone, 1, warm_up) if alone is not None else None
        self.capabilities = Capabilities(runs_alone=alone is not None,
                                         width_multiple=WIDTH_BUCKET if IDS_INPUT in input_names else 1)

    def run(self, batch: Batch) -> Outputs:
        requests = self._alone if batch.alone and self._alone is not None else self._idle
        names = batch.wanted(self.output_names)
        return dict(zip(names, self._infer(_bucketed(batch.padded(), self._pad_token_id), names, requests)))

    def _infer(self, feeds: dict[str, np.ndarray], outputs: tuple[str, ...],
               requests: queue.SimpleQueue[Any]) -> list[np.ndarray]:
        """Run on a request from `requests` (a stream's, or the lone compilation's)."""
        request = requests.get()  # never waits while callers respect parallel_runs (and lone batches one at a time)
        try:
            # inputs are read in place; only the outputs asked for are copied out, before the request is reused
            results = request.infer(feeds, share_inputs=True, share_outputs=True)
            return [np.array(results[key], copy=True) for key in outputs]
        finally:
            requests.put(request)


def _warmed_requests(compiled: Any, count: int, warm_up: dict[str, np.ndarray]) -> queue.SimpleQueue[Any]:
    """`count` infer requests, each run once, one at a time: OpenVINO's Python layer initialises C++ statics on
    the first run, and two threads doing that at once deadlocked a server (both in __cxa_guard_acquire)."""
    requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for _ in range(count):
        request = compiled.create_infer_request()
        request.infer(warm_up)
        requests.put(request)
    return requests


def _warm_up_feeds(compiled: Any) -> dict[str, np.ndarray]:
    """Ones in every input: one row of two tokens where a dimension is dynamic."""
    feeds = {}
    for port in compiled.inputs:
        dims = port.get_partial_shape()
        shape = [dims[i].get_length() if dims[i].is_static else (1 if i == 0 else 2) for i in range(dims.rank.get_length())]
        feeds[port.any_name] = np.ones(shape, dtype=port.get_element_type().to_dtype())
    return feeds


SHAPE_CACHE_ENTRIES = 100
"""Kernels OpenVINO keeps for the input shapes it saw last (its default: 5,000). Every batch of a new (rows, length)
is a new shape, so with the default a process embedding a corpus of short texts grew without end in practice: a
bulk job of 200k queries went from 545 to 642 MB resident (onnxruntime stayed flat), and 1M rows peaked at 739 MB
against 544 MB for 10k. With 100, MiniLM bf16 on a 2-core EPYC (avx512_bf16) ran the same job 7% faster (12.9k
against 12.0k tokens/s, medians of 4 alternating rounds in one process) and grew 541 -> 585 MB over 200k rows."""


def create(manifest: Manifest, artifact_dir: Path, options: BackendOptions) -> OpenVinoBackend:
    core = _core()
    bf16 = _has_bf16(core)
    precision = execution_precision(manifest.precision, bf16)
    threads = options.resolved_threads()
    model = core.read_model(str(artifact_dir / manifest.model_file))
    keep_gated_ffns_unfused(model)  # artifacts compiled before export did it themselves
    settings = {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads,
                "CPU_RUNTIME_CACHE_CAPACITY": str(SHAPE_CACHE_ENTRIES)}
    compiled = core.compile_model(model, "CPU", {"PERFORMANCE_HINT": "THROUGHPUT", **settings})
    streams = int(compiled.get_property("NUM_STREAMS"))
    lone = streams > 1 and options.lone_runs
    alone = core.compile_model(model, "CPU", {"PERFORMANCE_HINT": "LATENCY", **settings}) if lone else None
    fallback = " (bf16 asked for; this CPU has no bf16 instructions)" if manifest.precision == "bf16" and not bf16 else ""
    weights = " with int8 GEMMs" if manifest.precision == "int8" else ""
    lone = f"; a lone batch on all {threads}" if alone is not None else ""
    execution = f"openvino {precision}{weights}{fallback}, {streams} streams on {threads} threads{lone}"
    return OpenVinoBackend(compiled, manifest.inputs, manifest.outputs, execution, alone, manifest.pad_token_id)
