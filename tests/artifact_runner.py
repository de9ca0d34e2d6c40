"""Run a compiled artifact without the scheduler: the raw graph output for texts or pairs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from encoderrt.runtime.backends import load_backend
from encoderrt.runtime.manifest import read_manifest
from encoderrt.runtime.tokenizer import TOKENIZER_FILE, TextTokenizer


def run_artifact(artifact: Path, texts=None, pairs=None, drop: str | None = None) -> np.ndarray:
    manifest = read_manifest(artifact)
    tokenizer = TextTokenizer(artifact / TOKENIZER_FILE, manifest.max_length, manifest.pad_token_id, manifest.inputs)
    encodings = tokenizer.encode_pairs(*zip(*pairs)) if pairs is not None else tokenizer.encode(texts)
    feeds = tokenizer.pad(encodings)
    if drop:  # what a serving stack that forgets an input would compute
        feeds[drop] = np.zeros_like(feeds[drop])
    return load_backend(manifest, artifact).run(feeds)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
