"""What a user would run instead: sentence-transformers on the very same inputs, with its own backends.

`torch` (fp32, batch 32) is the reference every ratio is measured against; `torch-bf16` is the same
under torch.autocast(bfloat16), `onnx` and `openvino` are sentence-transformers' `backend=` flag (OpenVINO
runs bf16 by itself wherever the CPU has it, AMX or avx512_bf16: its default precision hint). The optimum
extras must be installed; the error says which.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from encoderrt.bench.workloads import Workload

KINDS = ("torch", "torch-bf16", "onnx", "openvino")
_BACKENDS = {"onnx": ("optimum.onnxruntime", "optimum[onnxruntime]"), "openvino": ("optimum.intel", "optimum-intel[openvino]")}
"""sentence-transformers' backend -> (the module it needs, the pip line that installs it)."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package is missing
        return False


@dataclass(frozen=True)
class ReferenceResult:
    workload: str
    kind: str
    name: str
    items: int
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds


def parse_kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown reference {', '.join(unknown) or repr(text)}; choose from {', '.join(KINDS)}")
    return tuple(dict.fromkeys(kinds))


class Reference:
    """One sentence-transformers model, loaded once, timed one pass at a time."""

    def __init__(self, source: Path, task: str, max_length: int, kind: str = "torch"):
        warnings.filterwarnings("ignore", module="sentence_transformers")
        if task not in ("embed", "score", "multi_vector"):
            raise ValueError(f"no sentence-transformers reference for {task} models")
        backend = kind if kind in _BACKENDS else "torch"
        # sentence-transformers raises a bare Exception for a missing optimum: ask before loading
        module, extra = _BACKENDS.get(backend, ("sentence_transformers", "sentence-transformers"))
        if not _installed(module):
            raise ValueError(f"--reference {kind} needs sentence-transformers' {backend} backend ({module} is not "
                             f"installed): pip install '{extra}'")
        loading = {"device": "cpu", "local_files_only": True, "backend": backend}
        if task == "embed":
            from sentence_transformers import SentenceTransformer

            self.model = SentenceTransformer(str(source), **loading)
            if type(self.model[0]).__name__ == "StaticEmbedding":  # no max_seq_length: its tokenizer cuts instead
                self.model[0].tokenizer.enable_truncation(max_length)
            else:
                self.model.max_seq_length = max_length
        elif task == "multi_vector":
            from sentence_transformers import MultiVectorEncoder

            self.model = MultiVectorEncoder(str(source), **loading)
        else:
            from sentence_transformers import CrossEncoder

            self.model = CrossEncoder(str(source), max_length=max_length, **loading)
        if kind == "torch-bf16":
            import torch

            if not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
                raise ValueError("--reference torch-bf16 needs a CPU with bf16 instructions (AMX or avx512_bf16)")
        self.task, self.kind = task, kind
        verb = {"embed": "SentenceTransformer.encode", "multi_vector": "MultiVectorEncoder.encode + MaxSim"}.get(
            task, "CrossEncoder.predict")
        self.name = f"{verb} {'fp32' if kind == 'torch' else kind}, batch 32"

    def _precision(self) -> contextlib.AbstractContextManager:
        if self.kind != "torch-bf16":
            return contextlib.nullcontext()
        import torch

        return torch.autocast("cpu", dtype=torch.bfloat16)

    def run(self, workload: Workload, tokens: int) -> ReferenceResult:
        """One pass over the workload's texts or pairs."""
        start = time.perf_counter()
        with self._precision():
            if self.task == "multi_vector":
                items = self._late_interaction(workload)
            elif self.task == "embed":
                self.model.encode(workload.reference_texts, batch_size=32, show_progress_bar=False)
                items = len(workload.reference_texts)
            else:
                self.model.predict(workload.reference_pairs, batch_size=32, show_progress_bar=False)
                items = len(workload.reference_pairs)
        return ReferenceResult(workload.name, self.kind, self.name, items, tokens, time.perf_counter() - start)

    def _late_interaction(self, workload: Workload) -> int:
        """MultiVectorEncoder's pass: each query with its documents scored by its own similarity (MaxSim), as a
        user reranks; or the texts encoded as queries or documents."""
        model = self.model
        if workload.reference_pairs:
            documents: dict[str, list[str]] = {}
            for query, document in workload.reference_pairs:
                documents.setdefault(query, []).append(document)
            for query, these in documents.items():
                model.similarity(model.encode_query([query], show_progress_bar=False),
                                 model.encode_document(these, batch_size=32, show_progress_bar=False))
            return len(workload.reference_pairs)
        encode = model.encode_query if workload.name == "queries" else model.encode_document
        encode(workload.reference_texts, batch_size=32, show_progress_bar=False)
        return len(workload.reference_texts)

