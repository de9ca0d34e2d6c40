"""The artifact's manifest: the one contract between compile (writer) and runtime (reader).

Only this module parses manifest.json. The schema is versioned; a reader refuses versions it
does not know instead of guessing, and checks every file's sha256 so that a truncated copy or
a hand-edited graph is caught at load rather than as wrong numbers later.

Fields are added over time, each with a default that means "as before". A manifest lists under `requires` the
fields it sets that change what the artifact computes, so a reader that does not know one of them refuses the
artifact by name instead of ignoring it and serving other numbers; fields that only record how the artifact was
made are left out of that list, and an older reader skips them.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from encoderrt.runtime.chat_template import ChatTemplate, MessageFormat

SCHEMA_VERSION = 2
READABLE_VERSIONS: tuple[int, ...] = (1, 2)
"""Version 1 manifests have no `requires`: readers of version 1 ignored the fields they did not know (an artifact of a
model that reads texts as chat messages, loaded by one of them, would have tokenised plain text), so the list came
with a new version, which those readers refuse. Every version 1 manifest is one this reader knows all fields of."""
MANIFEST_NAME = "manifest.json"

Task = Literal["embed", "score", "classify", "sparse", "multi_vector", "hybrid"]
Pooling = Literal["cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken", "splade_max", "splade_sum",
                  "splade_max_log1p_relu", "splade_sum_log1p_relu"]
Activation = Literal["sigmoid", "softmax", "identity", "tanh", "relu"]
Similarity = Literal["cosine", "dot", "euclidean", "manhattan"]
Precision = Literal["fp32", "int8", "fp16", "bf16"]
Layout = Literal["padded", "packed"]

TASKS: tuple[str, ...] = ("embed", "score", "classify", "sparse", "multi_vector", "hybrid")
POOLINGS: tuple[str, ...] = ("cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
SIMILARITIES: tuple[str, ...] = ("cosine", "dot", "euclidean", "manhattan")
"""sentence-transformers' similarity_fn_name values for a SentenceTransformer (euclidean and manhattan: the negative
distance, so that a higher score is closer)."""
TOKEN_EMBEDDINGS = "token_embeddings"
"""The second output of an embedding graph: every token's final hidden state [rows, width, hidden], before pooling
(sentence-transformers' output_value="token_embeddings", TEI's /embed_all)."""
MULTI_VECTORS = "multi_vectors"
"""Every token's projected vector [rows, width, dim]: a multi-vector model's only output (ColBERT's), a hybrid
model's third (bge-m3's colbert_linear)."""
LEXICAL_WEIGHTS = "lexical_weights"
"""A hybrid model's every token's lexical weight [rows, width] (bge-m3's relu(sparse_linear(h)))."""
PER_TOKEN_OUTPUTS: tuple[str, ...] = (TOKEN_EMBEDDINGS, MULTI_VECTORS, LEXICAL_WEIGHTS)
"""Graph outputs with a value per token ([rows, width, ...]): a row's are cut to its own tokens."""
SPARSE_POOLINGS: tuple[str, ...] = ("splade_max", "splade_sum", "splade_max_log1p_relu", "splade_sum_log1p_relu")
"""SpladePooling's strategy, and its activation where it is not the standard log(1 + relu) (OpenSearch's second log1p)."""
"""SPLADE over the MLM logits: log(1 + relu(logit)), then the max or the sum over the tokens."""
ACTIVATIONS: tuple[str, ...] = ("sigmoid", "softmax", "identity", "tanh", "relu")
LAYOUTS: tuple[str, ...] = ("padded", "packed")


_RECORD = {"record": True}
"""Field metadata: the field records how the artifact was made (or measured), and the runtime serves the same
numbers without it, so a manifest does not list it under `requires`."""


class ManifestError(ValueError):
    """The artifact folder is missing, unreadable, of an unknown schema, or altered."""


@dataclass(frozen=True)
class ModelShape:
    """Sizes the runtime and the benchmarks need (FLOPs per token, output width)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_size: int
    output_dim: int
    """Embedding width for embed, number of labels for score/classify."""
    matmul_weights: int | None = None
    """Weights of the matrix multiplies every token runs through, counted on the family's own modules (a GLU
    feed-forward's three matrices, grouped-query and wide-head attention as they are); None in manifests written
    before it was recorded, which count BERT's 4h^2 + 2hi a layer."""
    attention_width: int | None = None
    """Query heads x head width, what QK^T and AV cost per token and key; None: the hidden size."""

    def per_token_weights(self) -> int:
        """matmul_weights, or for a manifest without them BERT's Q, K, V, output and two FFN matrices a layer."""
        if self.matmul_weights is not None:
            return self.matmul_weights
        h, i = self.hidden_size, self.intermediate_size
        return self.num_layers * (4 * h * h + 2 * h * i)

    def query_width(self) -> int:
        """attention_width, or for a manifest without it the hidden size."""
        return self.attention_width if self.attention_width is not None else self.hidden_size


@dataclass(frozen=True)
class TokenPooling:
    """Hierarchical pooling of a side's token vectors (sentence-transformers' HierarchicalTokenPooling, PyLate's
    pool_factor): after the first `protected_tokens`, the vectors are clustered by Ward linkage on their cosine
    distances and each cluster is replaced by its mean (runtime/token_pooling.py), so that an index holds a half or
    a third of them. One of `pool_factor` (other than 1), `max_tokens` and `distance_threshold` says how far."""

    pool_factor: float = 1.0
    """Keep about 1 / pool_factor of the vectors after the protected ones; 1: none merged."""
    max_tokens: int | None = None
    """At most this many vectors, the protected ones counted; shorter texts are left as they are."""
    distance_threshold: float | None = None
    """Cut each text's Ward tree at this height: how many are kept follows the text."""
    protected_tokens: int = 1
    """Leading vectors never merged (the CLS)."""
    normalize: bool = True
    """Every vector out to unit length, merged or not."""
    sides: tuple[str, ...] = ("document",)
    """The sides it pools (sentence-transformers' tasks)."""

    def problem(self) -> str | None:
        """What makes these settings meaningless, as sentence-transformers refuses them, or None."""
        if not math.isfinite(self.pool_factor) or self.pool_factor < 1:
            return f"pool_factor must be a finite number of at least 1, got {self.pool_factor}"
        if self.protected_tokens < 0:
            return f"the protected tokens must be 0 or more, got {self.protected_tokens}"
        if self.distance_threshold is not None and (not math.isfinite(self.distance_threshold)
                                                    or self.distance_threshold < 0):
            return f"distance_threshold must be a finite number of at least 0, got {self.distance_threshold}"
        if sum((self.pool_factor != 1, self.max_tokens is not None, self.distance_threshold is not None)) > 1:
            return "pool_factor, max_tokens and distance_threshold each say how far to pool: give one"
        if self.max_tokens is not None and self.max_tokens <= self.protected_tokens:
            return (f"max_tokens {self.max_tokens} leaves no room beside the {self.protected_tokens} protected "
                    "tokens")
        if not set(self.sides) <= set(SIDES):
            return f"the sides {list(self.sides)} are not among {list(SIDES)}"
        return None


@dataclass(frozen=True)
class MultiVector:
    """A late-interaction (ColBERT) model's rules per side, as sentence-transformers' MultiVectorEncoder applies them:
    queries and documents are cut at their own lengths; queries are padded with an expansion token up to a fixed
    width (attended to or not by the encoder, scored either way); the skip-list's tokens (punctuation) are dropped
    from the sides it names."""

    query_length: int | None = None
    """Tokens a query is cut at (special and prompt tokens counted); None: the model's limit."""
    document_length: int | None = None
    expansion_length: int | None = None
    """Queries shorter than this are padded up to it with `expansion_token_id`; None: no expansion."""
    expansion_strategy: Literal["fixed", "min"] = "fixed"
    """fixed: every query is exactly `expansion_length` tokens (longer ones are cut); min: it is only the floor."""
    expansion_attend: bool = False
    """Whether the encoder attends to the expansion positions (their vectors are scored either way)."""
    expansion_token_id: int | None = None
    skip_ids: tuple[int, ...] = ()
    skip_sides: tuple[str, ...] = ("document",)
    similarity: Literal["maxsim", "meanmaxsim"] = "maxsim"
    """How a query scores a document: the sum over the query's vectors of each one's best dot product with the
    document's (MaxSim), or that sum over the number of query vectors (MeanMaxSim)."""
    normalize: bool = False
    """Each vector to unit length (a Normalize module on the token embeddings; bge-m3's)."""
    skip_first: bool = False
    """The first token (the CLS) has no vector, on either side (bge-m3 scores h[1:])."""
    token_pooling: TokenPooling | None = None
    """The vectors of the sides it names pooled (a HierarchicalTokenPooling module after the mask and the Normalize);
    None: every scored token keeps its vector."""

    def length(self, side: str) -> int | None:
        """A side's own cut, before the model's limit."""
        if side == "query":
            return self.expansion_length if self.expansion_length and self.expansion_strategy == "fixed" else self.query_length
        return self.document_length


HYBRID_OUTPUTS: tuple[str, ...] = ("dense", "sparse", "colbert")
"""A hybrid model's three representations, by bge-m3's names (FlagEmbedding's compute_score keys)."""


@dataclass(frozen=True)
class Hybrid:
    """A hybrid (bge-m3) model's rules beyond its dense embedding (pooled, normalised as the folder says) and its
    multi-vector rules (`Manifest.multi_vector`): which tokens have no lexical weight, and how its three scores
    combine."""

    lexical_skip_ids: tuple[int, ...] = ()
    """Tokens never weighted: the CLS, end, padding and unknown tokens (FlagEmbedding's unused_tokens)."""
    weights: dict[str, float] = field(default_factory=lambda: {"dense": 0.4, "sparse": 0.2, "colbert": 0.4})
    """The hybrid score's weights of the dense, sparse and colbert scores: the weighted sum over the sum of the
    weights, as FlagEmbedding's compute_score combines them; bge-m3's model card weights by default."""


Side = Literal["query", "document"]
SIDES: tuple[str, ...] = ("query", "document")
"""The two sides of a model that embeds queries and documents apart (a multi-vector model, an inference-free sparse
one), as sentence-transformers' encode_query and encode_document name them."""


@dataclass(frozen=True)
class StaticQueries:
    """An inference-free sparse model's query side (sentence-transformers' Router with a SparseStaticEmbedding for
    queries): a query's vector holds, for each distinct token of its text (no special tokens, cut at `max_length`),
    that token's fixed weight; no graph runs. Documents go through the sparse graph."""

    weights_file: str
    """float32 [vocab] in the artifact: the weight per token id."""
    max_length: int | None
    """Where a query is cut (its tokenizer's limit); None: never."""
    default_side: Side = "document"
    """The side a request that names none takes (the Router's default route)."""


@dataclass(frozen=True)
class Manifest:
    task: Task
    architecture: str
    model_type: str
    max_length: int
    pad_token_id: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    precision: Precision
    target: str
    """Which backend serves this artifact: "cpu" (onnxruntime), "openvino", "cuda", "tensorrt", "onnx-reference"."""
    model_file: str
    shape: ModelShape
    pooling: Pooling | None = None
    normalize: bool = False
    truncate_dim: int | None = None
    """An embedding model's default width (the folder's truncate_dim): its embeddings are cut to it, as
    sentence-transformers' encode cuts them, unless a request asks for other dimensions; a multi-vector model's the
    same for each of its vectors (renormalised, as MultiVectorEncoder cuts them)."""
    max_active_dims: int | None = None
    """A sparse model's default number of weights kept a text, the heaviest (the folder's max_active_dims, as
    SparseEncoder.encode keeps them), unless a request asks for its own top_k."""
    similarity: Similarity = "cosine"
    """How an embedding model scores a pair of texts (score and rerank): sentence-transformers' similarity_fn_name
    from the folder, on the embeddings as encode returns them (normalised only where the model normalises)."""
    activation: Activation = "identity"
    """Score/classify activation applied by the runtime; the graph always returns raw logits."""
    labels: tuple[str, ...] = ()
    source: dict[str, Any] = field(default_factory=dict, metadata=_RECORD)
    fused_ops: dict[str, int] = field(default_factory=dict, metadata=_RECORD)
    parity: dict[str, Any] = field(default_factory=dict, metadata=_RECORD)
    versions: dict[str, str] = field(default_factory=dict, metadata=_RECORD)
    files: dict[str, str] = field(default_factory=dict)
    """sha256 of every file in the artifact other than the manifest itself."""
    layout: Layout = "padded"
    """How the graph takes a batch. `inputs` are always the tokenizer's padded feeds; a packed graph takes
    the real tokens only, with cu_seqlens (runtime/packing.py), and its attention is a GPU plugin."""
    engine: dict[str, Any] = field(default_factory=dict)
    """Target-specific record: for "tensorrt", the engine file and what it was built for (engine_record.py)."""
    selection: dict[str, Any] = field(default_factory=dict, metadata=_RECORD)
    """With --target/--precision auto: every candidate's speed and parity here, and the rule that chose."""
    prompts: dict[str, str] = field(default_factory=dict)
    """Named prompts from the sentence-transformers folder, prepended to texts (runtime/prompts.py)."""
    default_prompt_name: str | None = None
    adapters: tuple[str, ...] = ()
    """Task adapters compiled into the graph (jina-embeddings-v3's LoRA per task), by the name a request gives as
    its prompt_name; the graph's `adapter` input takes 1 + the index here per row, 0 for none."""
    chat_template: ChatTemplate | None = None
    """A causal-LM reranker's chat template, which its pairs are rendered through, or an embedder's where
    `text_messages` says (runtime/chat_template.py)."""
    text_messages: MessageFormat | None = None
    """A model saved by sentence-transformers 6 or later whose Transformer takes its inputs as chat messages: each text
    is rendered through `chat_template` as a user message, each pair as a query and a document message (a prompt as a
    system message before them), the content held as this format says; None: inputs are tokenised as they are."""
    multi_vector: MultiVector | None = None
    """A multi-vector model's per-side rules (task multi_vector), or a hybrid model's for its colbert vectors."""
    hybrid: Hybrid | None = None
    """A hybrid model's lexical and scoring rules (task hybrid)."""
    static_queries: StaticQueries | None = None
    """An inference-free sparse model's query side (task sparse)."""
    schema_version: int = SCHEMA_VERSION

    def requires(self) -> tuple[str, ...]:
        """The fields this manifest sets away from their defaults, other than records: what a reader must know to
        serve the artifact as it was compiled (fields without a default every reader of this version knows)."""
        return tuple(f.name for f in fields(self) if not f.metadata.get("record") and _set(self, f))

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "requires": list(self.requires())}, indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Manifest":
        version = data.get("schema_version")
        if version not in READABLE_VERSIONS:
            raise ManifestError(
                f"manifest schema_version {version!r} is not supported by this encoderrt "
                f"(it reads versions {', '.join(map(str, READABLE_VERSIONS))}); upgrade encoderrt to the one that "
                "compiled it, or recompile the model with this one"
            )
        known = {f.name for f in fields(cls)}
        requires = data.get("requires", [])
        if not isinstance(requires, list) or not all(isinstance(name, str) for name in requires):
            raise ManifestError(f"manifest requires {requires!r} is not a list of field names")
        unknown = [name for name in requires if name not in known]
        if unknown:
            raise ManifestError(
                f"the artifact needs manifest fields this encoderrt does not know ({', '.join(unknown)}): it was "
                "compiled by a newer encoderrt, and served without them it would compute other numbers; upgrade "
                "encoderrt, or recompile the model with this one"
            )
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise ManifestError(f"manifest is missing fields: {', '.join(missing)}")
        values = {k: v for k, v in data.items() if k in known}
        try:
            values["shape"] = _nested(ModelShape, values["shape"], "shape")
            values["inputs"] = tuple(values["inputs"])
            values["outputs"] = tuple(values["outputs"])
            values["labels"] = tuple(values.get("labels", ()))
            values["adapters"] = tuple(values.get("adapters", ()))
            if values.get("chat_template") is not None:
                template = values["chat_template"]
                values["chat_template"] = ChatTemplate(str(template["source"]), dict(template.get("variables") or {}))
            if values.get("multi_vector") is not None:
                rules = dict(values["multi_vector"])
                rules["skip_ids"] = tuple(rules.get("skip_ids", ()))
                rules["skip_sides"] = tuple(rules.get("skip_sides", ("document",)))
                if rules.get("token_pooling") is not None:
                    pooling = dict(rules["token_pooling"])
                    pooling["sides"] = tuple(pooling.get("sides", ("document",)))
                    rules["token_pooling"] = _nested(TokenPooling, pooling, "multi_vector.token_pooling")
                values["multi_vector"] = _nested(MultiVector, rules, "multi_vector")
            if values.get("static_queries") is not None:
                values["static_queries"] = _nested(StaticQueries, values["static_queries"], "static_queries")
            if values.get("hybrid") is not None:
                rules = dict(values["hybrid"])
                rules["lexical_skip_ids"] = tuple(rules.get("lexical_skip_ids", ()))
                values["hybrid"] = _nested(Hybrid, rules, "hybrid")
            manifest = cls(**values)
        except (TypeError, KeyError) as exc:
            raise ManifestError(f"manifest is malformed: {exc}") from None
        manifest._validate()
        return manifest

    def _validate(self) -> None:
        if self.task not in TASKS:
            raise ManifestError(f"manifest task {self.task!r} is not one of {TASKS}")
        if self.task in ("embed", "hybrid") and self.pooling not in POOLINGS:
            raise ManifestError(f"manifest pooling {self.pooling!r} is not one of {POOLINGS}")
        if self.task == "sparse" and self.pooling not in SPARSE_POOLINGS + POOLINGS:  # SPLADE's, or CSR's embedding's
            raise ManifestError(f"manifest pooling {self.pooling!r} is not one of {SPARSE_POOLINGS + POOLINGS}")
        if self.task in ("multi_vector", "hybrid") and self.multi_vector is None:
            raise ManifestError(f"a {self.task} manifest needs its multi_vector rules")
        pooling = self.multi_vector.token_pooling if self.multi_vector else None
        if pooling is not None and (problem := pooling.problem()):
            raise ManifestError(f"manifest token_pooling: {problem}")
        if self.static_queries is not None and (self.task != "sparse"
                                                or self.static_queries.default_side not in SIDES):
            raise ManifestError(f"manifest static_queries {self.static_queries} need a sparse model and a side of "
                                f"{SIDES}")
        if self.task == "hybrid" and self.hybrid is None:
            raise ManifestError("a hybrid manifest needs its hybrid rules")
        if self.truncate_dim is not None and not 1 <= self.truncate_dim <= self.shape.output_dim:
            raise ManifestError(f"manifest truncate_dim {self.truncate_dim} is outside 1..{self.shape.output_dim}")
        if self.max_active_dims is not None and (self.task != "sparse" or self.max_active_dims < 1):
            raise ManifestError(f"manifest max_active_dims {self.max_active_dims} needs a sparse model and a count "
                                "of 1 or more")
        if self.similarity not in SIMILARITIES:
            raise ManifestError(f"manifest similarity {self.similarity!r} is not one of {SIMILARITIES}")
        if self.activation not in ACTIVATIONS:
            raise ManifestError(f"manifest activation {self.activation!r} is not one of {ACTIVATIONS}")
        if self.layout not in LAYOUTS:
            raise ManifestError(f"manifest layout {self.layout!r} is not one of {LAYOUTS}")
        if self.max_length < 2:
            raise ManifestError(f"manifest max_length {self.max_length} is too small")


def _nested(kind: type, values: Any, where: str) -> Any:
    """A rule set inside the manifest, built from its JSON object. A key this encoderrt does not know is a newer
    encoderrt's rule, refused by name: the field around it is one the artifact requires, and served without the
    rule it would give other numbers."""
    if not isinstance(values, dict):
        raise ManifestError(f"manifest {where} is not an object")
    unknown = sorted(set(values) - {spec.name for spec in fields(kind)})
    if unknown:
        raise ManifestError(f"manifest {where} holds {', '.join(unknown)}, which this encoderrt does not know: the "
                            "artifact was compiled by a newer encoderrt; upgrade encoderrt, or recompile the model "
                            "with this one")
    return kind(**values)


def _set(manifest: Manifest, spec: Any) -> bool:
    """Whether a field with a default holds something other than it."""
    if spec.default is not MISSING:
        return getattr(manifest, spec.name) != spec.default
    return spec.default_factory is not MISSING and getattr(manifest, spec.name) != spec.default_factory()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(artifact_dir: str | Path, verify_files: bool = True) -> Manifest:
    """Read and check an artifact's manifest; every problem is a ManifestError naming it."""
    folder = Path(artifact_dir)
    path = folder / MANIFEST_NAME
    if not folder.is_dir():
        raise ManifestError(f"artifact folder not found: {folder}")
    if not path.is_file():
        hint = ""
        if (folder / "config.json").is_file() or (folder / "modules.json").is_file():  # a model folder, uncompiled
            hint = (f"; it is a model folder: compile it (compile-model {folder} --output ARTIFACT_DIR), or give it to "
                    "`encoderrt serve`, `embed` or `bench`, which compile a folder once into their cache")
        raise ManifestError(f"{folder} is not an encoderrt artifact: it has no {MANIFEST_NAME}{hint}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path} does not hold a JSON object")
    manifest = Manifest.from_dict(data)
    _check_names(folder, manifest)
    if verify_files:
        _check_files(folder, manifest)
    return manifest


def _check_names(folder: Path, manifest: Manifest) -> None:
    """Every name the runtime opens stays inside the artifact, and the model (and engine) file is a hashed one."""
    root = folder.resolve()
    opened = [manifest.model_file, *([str(manifest.engine["file"])] if manifest.engine.get("file") else [])]
    for name in (*manifest.files, *opened):
        parts = PurePosixPath(name).parts
        if not parts or PurePosixPath(name).is_absolute() or ".." in parts or not (folder / name).resolve().is_relative_to(root):
            raise ManifestError(f"artifact file name {name!r} leaves the artifact folder: refusing it")
    for name in opened:
        if name not in manifest.files:
            raise ManifestError(f"the manifest does not hash its model file {name}: refusing it")


def _check_files(folder: Path, manifest: Manifest) -> None:
    """The folder holds exactly the hashed files, each matching, so nothing the runtime reads escapes the check."""
    for name, expected in manifest.files.items():
        file = folder / name
        if not file.is_file():
            raise ManifestError(f"artifact file {name} is missing from {folder}")
        if sha256_file(file) != expected:
            raise ManifestError(f"artifact file {name} does not match its sha256 in the manifest")
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.is_file() and name != MANIFEST_NAME and name not in manifest.files:
            raise ManifestError(f"artifact file {name} is not hashed by the manifest: refusing the artifact")
