"""Inference-free sparse models (OpenSearch's neural-sparse doc-v2/v3 kind): a sentence-transformers Router whose
documents go through an MLM and SpladePooling, and whose queries through a SparseStaticEmbedding, a fixed weight per
vocabulary token (an IDF) for each token the query holds, with no model run at all.

The document route compiles as any SparseEncoder does; the query route's weights go into the artifact beside it
(runtime/tasks/sparse.py applies them). Only that layout is read: other routes or modules are refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from encoderrt.compile.errors import InputError

ROUTER_CONFIG = "router_config.json"
WEIGHTS_FILE = "query_weights.npy"
"""The query side's weight per token id, float32 [vocab], in the artifact."""
_DOCUMENT_TRANSFORMERS = ("MLMTransformer", "Transformer")


@dataclass(frozen=True)
class QuerySide:
    """An inference-free model's query side as compile read it, once, before any candidate is built."""

    weights: np.ndarray
    """float32 [vocab]: the weight per token id."""
    max_length: int | None
    """Where its tokenizer cuts a query (None: never), as SparseStaticEmbedding tokenises with truncation."""
    default_side: str


@dataclass(frozen=True)
class RouterLayout:
    """Where a Router folder's parts are, relative to the folder."""

    transformer_path: str
    pooling_path: str
    static_path: str
    default_side: str


def read_router(folder: Path, router_path: str) -> RouterLayout:
    """The layout of the Router at `folder / router_path`: query -> SparseStaticEmbedding, document -> an MLM
    Transformer -> SpladePooling, nothing else."""
    config_path = folder / router_path / ROUTER_CONFIG
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        types: dict[str, str] = {name: str(kind).rsplit(".", 1)[-1] for name, kind in config["types"].items()}
        structure: dict[str, list[str]] = config["structure"]
        parameters: dict[str, Any] = config.get("parameters") or {}
        routes = {side: [types[name] for name in names] for side, names in structure.items()}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"cannot read the Router's {config_path}: {exc}") from None
    described = "; ".join(f"{side}: {' -> '.join(kinds)}" for side, kinds in routes.items())
    if (set(routes) != {"query", "document"} or routes["query"] != ["SparseStaticEmbedding"]
            or len(routes["document"]) != 2 or routes["document"][0] not in _DOCUMENT_TRANSFORMERS
            or routes["document"][1] != "SpladePooling"):
        raise InputError(f"the Router in {folder / router_path} routes {described}; encoderrt compiles the inference-free "
                         "sparse layout, query: SparseStaticEmbedding and document: MLMTransformer -> SpladePooling")
    if parameters.get("route_mappings"):
        raise InputError(f"the Router in {folder / router_path} maps tasks and modalities to its routes "
                         f"({parameters['route_mappings']}); encoderrt routes by the side a request names")
    # no default route: the Router's first (where allow_empty_key is off, sentence-transformers refuses a request that
    # names no side; here it takes that one too)
    default = parameters.get("default_route") or next(iter(structure))
    document, query = structure["document"], structure["query"]
    return RouterLayout(str(Path(router_path) / document[0]), str(Path(router_path) / document[1]),
                        str(Path(router_path) / query[0]), str(default))


def query_weights(static_folder: Path, weights_folder: Path, vocab_size: int) -> np.ndarray:
    """The SparseStaticEmbedding's weight per token id, checked against the documents' vocabulary: its tokenizer must
    be theirs, since the artifact holds one."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    try:
        own, documents = (Tokenizer.from_file(str(path / "tokenizer.json")) for path in (static_folder, weights_folder))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises its own Exception type for a broken file
        raise InputError(f"cannot read the tokenizers of {static_folder} and {weights_folder}: {exc}") from None
    if own.get_vocab() != documents.get_vocab():
        raise InputError(f"the query tokenizer in {static_folder} is not the documents' ({weights_folder}); encoderrt "
                         "serves both sides with one tokenizer")
    try:
        weight = load_file(str(static_folder / "model.safetensors"))["weight"]
    except (OSError, SafetensorError, KeyError) as exc:
        raise InputError(f"cannot read the SparseStaticEmbedding's weights in {static_folder}: {exc}") from None
    if weight.shape != (vocab_size,):
        raise InputError(f"the SparseStaticEmbedding in {static_folder} holds {weight.shape} weights for a vocabulary "
                         f"of {vocab_size}")
    return weight.astype(np.float32)
