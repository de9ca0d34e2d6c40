"""The backend for target "static": a static embedding model (model2vec's potion, sentence-transformers'
static-retrieval-mrl), whose text's vector is the mean of its tokens' rows of one table, as sentence-transformers'
StaticEmbedding computes it (an EmbeddingBag in mean mode). There is no graph to run: numpy gathers a batch's real
tokens and sums each row's with one reduceat, so padding costs nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from encoderrt.runtime.backends.base import BackendOptions, Batch, Capabilities, Outputs
from encoderrt.runtime.manifest import Manifest

TARGET = "static"


class StaticBackend:
    def __init__(self, table: np.ndarray, output_name: str, threads: int):
        self._table = table
        self.input_names = ("input_ids", "attention_mask")
        self.output_names = (output_name,)
        self.max_batch_tokens = None
        self.parallel_runs = threads
        """numpy's gather and sum release the GIL: a run per core keeps them all busy."""
        self.execution = "numpy (a static embedding table, fp32)"
        self.capabilities = Capabilities(empty_rows=True)

    def run(self, batch: Batch) -> Outputs:
        names = batch.wanted(self.output_names)
        feeds = batch.padded()
        real = feeds["attention_mask"].astype(bool)
        lengths = real.sum(axis=1)
        means = np.zeros((len(lengths), self._table.shape[1]), np.float32)  # a text with no tokens: zeros
        some = lengths > 0
        if some.any():
            starts = np.concatenate(([0], np.cumsum(lengths[some])[:-1]))
            sums = np.add.reduceat(self._table[feeds["input_ids"][real]], starts, axis=0)
            means[some] = sums / lengths[some, None].astype(np.float32)
        return {names[0]: means}


def create(manifest: Manifest, artifact_dir: Path, options: BackendOptions) -> StaticBackend:
    # mapped, not read: every session of the engine shares the one table the page cache holds
    table = np.load(artifact_dir / manifest.model_file, mmap_mode="r", allow_pickle=False)
    return StaticBackend(table, manifest.outputs[0], max(1, options.resolved_threads()))
