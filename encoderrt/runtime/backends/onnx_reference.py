"""onnx's reference evaluator (numpy): the backend for target "onnx-reference".

Slow, and not meant for serving: it runs every graph encoderrt writes, including the packed graph
whose attention is a GPU plugin, on any machine. Compile uses it to check that graph's parity
where there is no GPU, through the same Engine path (tokenizer, batching, packing) as serving.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from encoderrt.runtime.backends.base import BackendOptions, BackendUnavailable, Batch, Capabilities, Outputs
from encoderrt.runtime.manifest import Manifest
from encoderrt.runtime.packing import PACKED_ATTENTION_DOMAIN, PACKED_ATTENTION_OP

TARGET = "onnx-reference"
LAYOUTS = ("padded", "packed")


def packed_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, cu_seqlens: np.ndarray, sm_scale: float) -> np.ndarray:
    """What the plugin computes: softmax(q k^T * scale) v within each sequence; [tokens, heads, head_dim]."""
    out = np.empty_like(q)
    for start, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
        qs, ks, vs = (t[start:end].astype(np.float32).transpose(1, 0, 2) for t in (q, k, v))
        scores = qs @ ks.transpose(0, 2, 1) * sm_scale
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        out[start:end] = (weights @ vs).transpose(1, 0, 2).astype(q.dtype)
    return out


def plugin_ops() -> list[type]:
    from onnx.reference.op_run import OpRun

    class PackedAttention(OpRun):
        op_domain = PACKED_ATTENTION_DOMAIN

        def _run(self, q, k, v, cu_seqlens, max_seqlen=None, sm_scale=None, num_heads=None, head_dim=None,
                 plugin_namespace=None, plugin_version=None):
            scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[2])
            return (packed_attention(q, k, v, cu_seqlens, scale),)

    PackedAttention.__name__ = PACKED_ATTENTION_OP
    return [PackedAttention]


class OnnxReferenceBackend:
    def __init__(self, model_path: Path, input_names: tuple[str, ...], packed: bool):
        try:
            from onnx.reference import ReferenceEvaluator
        except ImportError:
            raise BackendUnavailable("the onnx-reference target needs onnx: pip install 'encoderrt[compile]'") from None
        self._session = ReferenceEvaluator(str(model_path), new_ops=plugin_ops())
        self.input_names = input_names
        self.output_names = tuple(self._session.output_names)
        self.max_batch_tokens = None
        self.parallel_runs = 1
        self.execution = "onnx reference evaluator (numpy)"
        self.capabilities = Capabilities(packed_input=packed)
        self._graph_inputs = set(self._session.input_names)

    def run(self, batch: Batch) -> Outputs:
        feeds = batch.packed() if self.capabilities.packed_input else batch.padded()
        names = batch.wanted(self.output_names)
        return dict(zip(names, self._session.run(list(names), {name: feeds[name] for name in self._graph_inputs})))


def create(manifest: Manifest, artifact_dir: Path, options: BackendOptions) -> OnnxReferenceBackend:
    return OnnxReferenceBackend(artifact_dir / manifest.model_file, manifest.inputs, manifest.layout == "packed")
