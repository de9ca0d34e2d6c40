"""What a job computes for each row, and the columns it writes: one small class per output kind (dense vectors,
sparse weights, token vectors, pair scores, labels), each turning a shard's values into one engine request and the
answer into Arrow columns. Adding a kind is adding a class here and naming it in KINDS."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from encoderrt.runtime.manifest import Side
from encoderrt.runtime.quantization import Precision
from encoderrt.runtime.settings import check_choices, setting
from encoderrt.runtime.tasks import (
    ClassifyRequest,
    EmbedRequest,
    MultiVectorRequest,
    Request,
    ScoreRequest,
    SparseEmbedRequest,
    check_count,
)
from encoderrt.runtime.token_pooling import for_request


@dataclass(frozen=True)
class Output:
    """One kind of job output; `fields` is how many input values a row carries."""

    fields = 1
    name = ""
    dense = False
    """Writes one fixed-width vector a row (the only kind `--output-format npy` holds)."""

    def __post_init__(self) -> None:
        check_choices(self)

    def request(self, values: Sequence[tuple[str, ...]]) -> Request:
        raise NotImplementedError

    def columns(self, value: Any) -> dict[str, Any]:
        """The answer for a shard's good rows as Arrow arrays, by column name."""
        raise NotImplementedError

    def settings(self) -> dict[str, Any]:
        """What changes the output: a resumed job must have the same."""
        return {"kind": self.name, **vars(self)}


@dataclass(frozen=True)
class Embeddings(Output):
    """SentenceTransformer.encode's vectors: the model's prompt and normalising, Matryoshka dimensions, and the
    server's int8 / uint8 / binary / ubinary precisions."""

    name = "embed"
    dense = True
    dimensions: int | None = setting(None, "keep the first N dimensions (Matryoshka), renormalised", metavar="N",
                                     shown="the model's")
    precision: Precision = setting("float32", "int8 and uint8 by the model's calibrated ranges, binary and ubinary "
                                   "packed 8 dimensions a byte (as the server's encoding precisions)")
    prompt_name: str | None = setting(None, "one of the model's prompts (sentence-transformers' prompt_name)",
                                      metavar="NAME", shown="the model's default prompt; with --sparse or "
                                      "--multi-vector, the side's own")
    normalize: bool | None = setting(None, "unit-length vectors", shown="the model's (its Normalize module)")

    def request(self, values):
        return EmbedRequest([v[0] for v in values], self.normalize, self.dimensions, prompt_name=self.prompt_name,
                            precision=self.precision)

    def columns(self, value):
        return {"embedding": fixed_size_lists(np.asarray(value))}


@dataclass(frozen=True)
class SparseWeights(Output):
    """A SPLADE model's (or bge-m3's lexical) weights: token ids and their weights, heaviest first; an inference-free
    model's document side (what a corpus holds) unless told otherwise."""

    name = "sparse"
    top_k: int | None = setting(None, "keep each row's K heaviest weights (sparse)", metavar="K",
                                shown="the model's max_active_dims, or all above 0")
    side: Side = setting("document", "embed as encode_document (the document prompt; an inference-free model's "
                         "documents through the model) or as encode_query (its query prompt; its token weights)")
    prompt_name: str | None = setting(None, "one of the model's prompts", metavar="NAME", shown="the side's own")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_count("top_k", self.top_k)  # refused before any shard (before the model loads), as a request would be

    def request(self, values):
        return SparseEmbedRequest([v[0] for v in values], self.top_k, side=self.side, prompt_name=self.prompt_name)

    def columns(self, value):
        import pyarrow as pa

        return {"indices": pa.array([[i for i, _ in pairs] for pairs in value], pa.list_(pa.int32())),
                "weights": pa.array([[w for _, w in pairs] for pairs in value], pa.list_(pa.float32()))}


@dataclass(frozen=True)
class TokenVectors(Output):
    """A ColBERT model's (or bge-m3's) document token vectors, as its MaxSim scoring reads them."""

    name = "multi_vector"
    prompt_name: str | None = setting(None, "one of the model's prompts", metavar="NAME",
                                      shown="the document side's own")
    pool_factor: float | None = setting(None, "keep about 1/F of each document's vectors, clustered and averaged "
                                        "(PyLate's pool_factor; sentence-transformers' HierarchicalTokenPooling); "
                                        "1 keeps them all", metavar="F", shown="as the model pools")
    dimensions: int | None = setting(None, "keep the first N dimensions (Matryoshka), renormalised", metavar="N",
                                     shown="the model's")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pool_factor is not None:  # refused before any shard, as a request would refuse it
            for_request(None, self.pool_factor, "document")

    def request(self, values):
        return MultiVectorRequest([v[0] for v in values], "document", prompt_name=self.prompt_name,
                                  pool_factor=self.pool_factor, dimensions=self.dimensions)

    def columns(self, value):
        import pyarrow as pa

        width = value[0].shape[1] if value else 0
        lengths = np.cumsum([0, *(len(v) for v in value)], dtype=np.int32)
        flat = np.concatenate(value) if value else np.empty((0, width), np.float32)
        return {"vectors": pa.ListArray.from_arrays(pa.array(lengths), fixed_size_lists(flat))}


@dataclass(frozen=True)
class PairScores(Output):
    """A cross-encoder's score of each query and document (CrossEncoder.predict's), or an embedding model's
    similarity."""

    name = "score"
    fields = 2
    activation: bool = setting(True, "the model's score activation (sigmoid for one label); off: raw logits")
    prompt_name: str | None = setting(None, "one of a cross-encoder's prompts", metavar="NAME",
                                      shown="the model's default prompt")

    def request(self, values):
        return ScoreRequest([v[0] for v in values], [v[1] for v in values], activation=self.activation,
                            prompt_name=self.prompt_name)

    def columns(self, value):
        import pyarrow as pa

        return {"score": pa.array(value, pa.float32())}


@dataclass(frozen=True)
class Labels(Output):
    """A classifier's label of each text and its score for every label, as transformers' text-classification
    pipeline scores them (softmax; sigmoid for a multi-label classifier or a one-label cross-encoder), in the
    model's label order: a corpus filtered by toxicity, language or quality."""

    name = "classify"
    activation: bool = setting(True, "the model's activation (softmax; sigmoid for one label or a multi-label "
                               "classifier); off: raw logits")

    def request(self, values):
        return ClassifyRequest([v[0] for v in values])

    def columns(self, value):
        import pyarrow as pa

        scores = [item.probs if self.activation else item.logits for item in value]
        return {"label": pa.array([item.label for item in value], pa.string()),
                "scores": pa.array(scores, pa.list_(pa.float32()))}


KINDS: dict[str, type[Output]] = {kind.name: kind for kind in (Embeddings, SparseWeights, TokenVectors, PairScores,
                                                               Labels)}


def fixed_size_lists(matrix: np.ndarray):
    """A [rows, width] array as Arrow's fixed-size lists (Parquet's natural vector column), without a copy."""
    import pyarrow as pa

    matrix = np.ascontiguousarray(matrix)
    width = matrix.shape[1] if matrix.ndim == 2 else 0
    return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), width)
