"""Run a compiled artifact without the scheduler: the raw graph output for texts or pairs; and PyTorch's own FLOP
count of a model, the bench's reference."""

from __future__ import annotations

import shutil
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from encoderrt.runtime.backends import Batch, first_output, load_backend
from encoderrt.runtime.manifest import read_manifest, sha256_file
from encoderrt.runtime.tokenizer import TextTokenizer


@lru_cache(maxsize=4)
def _loaded(artifact: Path, files: tuple[tuple[str, int], ...]):
    """The artifact's tokenizer and backend, loaded once while its files stay as they are (`files`: names and
    modification times): a test running an artifact row by row would otherwise load it for every row (an OpenVINO
    backend compiles its model at each load)."""
    manifest = read_manifest(artifact)
    tokenizer = TextTokenizer.for_artifact(manifest, artifact)
    return tokenizer, load_backend(manifest, artifact)


def run_artifact(artifact: Path, texts=None, pairs=None, drop_token_type_ids: bool = False) -> np.ndarray:
    artifact = Path(artifact)
    tokenizer, backend = _loaded(artifact, tuple(sorted((p.name, p.stat().st_mtime_ns) for p in artifact.iterdir())))
    encodings = tokenizer.encode_pairs(*zip(*pairs)) if pairs is not None else tokenizer.encode(texts)
    if drop_token_type_ids:  # what a serving stack that forgets the segment ids would compute
        encodings = [row._replace(type_ids=[0] * len(row.ids)) for row in encodings]
    return first_output(backend, Batch(encodings, tokenizer.pad))


def torch_flops_per_token(folder: Path, tokens: int, model_class: str = "AutoModel") -> float:
    """What PyTorch's own FLOP counter counts for one row of `tokens` through transformers' bare model in `folder`
    (every matrix multiply, attention's included), per token: the independent reference for the bench's count.
    `model_class`: transformers' class of that model (T5's encoder: T5EncoderModel)."""
    import torch
    import transformers
    from torch.utils.flop_counter import FlopCounterMode

    model = getattr(transformers, model_class).from_pretrained(folder, attn_implementation="eager").eval()
    ids = torch.arange(tokens).reshape(1, -1) % 50 + 5
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    return counter.get_total_flops() / tokens


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def tensorrt_graph_artifact(tiny_models, tiny_artifacts, name, tmp_path, layout="packed"):
    """The compiled CPU artifact with the TensorRT graph in place of its own, served on the CPU.

    padded: the opset-23 graph with standard Attention, on onnxruntime; packed: the plugin graph, on
    onnx's reference evaluator (the plugin in numpy).
    """
    from encoderrt.compile import CompileOptions
    from encoderrt.compile.packed import export_packed, packed_attention_count
    from encoderrt.compile.source import inspect_source
    from encoderrt.compile.tensorrt import export_for_tensorrt, standard_attention_count

    source = inspect_source(CompileOptions(model_dir=tiny_models[name], output_dir=tmp_path / "unused"))
    artifact = shutil.copytree(tiny_artifacts[name], tmp_path / f"{name}-{layout}")
    export, count = (export_packed, packed_attention_count) if layout == "packed" else (export_for_tensorrt, standard_attention_count)
    export(source, artifact / "model.onnx")
    assert count(artifact / "model.onnx", source.num_layers) == source.num_layers
    manifest = read_manifest(artifact, verify_files=False)
    files = {**manifest.files, "model.onnx": sha256_file(artifact / "model.onnx")}
    target = "onnx-reference" if layout == "packed" else "cpu"
    (artifact / "manifest.json").write_text(replace(manifest, files=files, layout=layout, target=target).to_json())
    return artifact
