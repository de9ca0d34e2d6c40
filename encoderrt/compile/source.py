"""Read a model folder (Hugging Face checkpoint or sentence-transformers folder) into typed facts.

Everything compile decides about a model comes from its folder, never from a hub: the task from
the head and sentence-transformers' files, pooling and normalisation from the module list,
the score activation by sentence-transformers' rule, the length from its configs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from encoderrt.compile.adapters import TaskAdapter, find_adapters
from encoderrt.compile.errors import InputError
from encoderrt.compile.options import CompileOptions
from encoderrt.compile.static_queries import QuerySide, query_weights, read_router
from encoderrt.models import Architecture, UnsupportedArchitecture, find_architecture
from encoderrt.runtime.chat_template import ChatTemplate, MessageFormat
from encoderrt.runtime.manifest import (
    LEXICAL_WEIGHTS,
    MULTI_VECTORS,
    POOLINGS,
    SIMILARITIES,
    TOKEN_EMBEDDINGS,
    Activation,
    Hybrid,
    MultiVector,
    Pooling,
    Similarity,
    Task,
)
from encoderrt.runtime.tokenizer import ADAPTER, POOLING_START, TOKENIZER_FILE

if TYPE_CHECKING:
    from encoderrt.compile.sparse_autoencoder import AutoEncoder

SourceKind = Literal["sentence-transformers", "cross-encoder", "sparse-encoder", "multi-vector-encoder", "transformers"]

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
_SUPPORTED_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")
"""In this order: Dense modules (any number) between Pooling and Normalize."""
_ROLES = {"Transformer": "Transformer", "MLMTransformer": "Transformer", "Pooling": "Pooling", "SpladePooling": "Pooling",
          "Dense": "Dense", "Normalize": "Normalize"}
"""sentence-transformers module classes by the role they play; SparseEncoder folders use the MLM/SPLADE ones (a
causal-LM CrossEncoder's Transformer -> LogitScore is read on its own, _read_modules)."""
# sentence-transformers names activations by their torch class path.
_ACTIVATIONS: dict[str, Activation] = {"Sigmoid": "sigmoid", "Identity": "identity", "Softmax": "softmax", "Tanh": "tanh",
                                       "ReLU": "relu"}
# tokenizers without a limit report model_max_length as a huge sentinel.
_NO_LIMIT = 1_000_000
_HEADED = ("score", "classify", "sparse")
"""Tasks whose graph ends in a head with an activation and labels (sparse: the MLM head, labels unused)."""


@dataclass(frozen=True)
class SourceModel:
    folder: Path
    weights_folder: Path
    """The folder holding config.json and the weights (a sentence-transformers module path)."""
    kind: SourceKind
    config: dict[str, Any]
    architecture: Architecture
    task: Task
    max_length: int
    pooling: Pooling | None
    normalize: bool
    activation: Activation
    labels: tuple[str, ...]
    truncate_dim: int | None = None
    """An embedding (or multi-vector) model's default width, the folder's truncate_dim (Manifest.truncate_dim)."""
    similarity: Similarity = "cosine"
    """An embedding model's score of two texts: the folder's similarity_fn_name (runtime/postprocess.py)."""
    max_active_dims: int | None = None
    """A sparse model's default number of weights kept a text, the folder's max_active_dims (Manifest's)."""
    folder_pooling: Pooling | None = None
    """The pooling the sentence-transformers folder declares; parity uses it as reference when unchanged."""
    dense_folders: tuple[Path, ...] = ()
    """sentence-transformers Dense modules after pooling, in order: inside the graph."""
    output_dim: int = 0
    """Width of what the graph returns: the last Dense module's, the hidden size, or the number of labels."""
    prompts: dict[str, str] = field(default_factory=dict)
    """sentence-transformers' named prompts (e5's "query: "), prepended to a text before tokenising."""
    default_prompt_name: str | None = None
    include_prompt: bool = True
    """False: pooling leaves a prompt's tokens out (the Pooling module's include_prompt), through the graph's
    pooling_start input."""
    adapters: tuple[TaskAdapter, ...] = ()
    """Task adapters beside the weights (compile/adapters.py), in the graph with a per-row `adapter` input."""
    answer_tokens: tuple[int, int | None] | None = None
    """A causal-LM reranker's (true, false) token ids: its score is logit(true) - logit(false) at the last token
    (sentence-transformers' LogitScore; logit(true) alone without a false token)."""
    chat_template: ChatTemplate | None = None
    """The causal-LM reranker's chat template, which its pairs are rendered through, or an embedder's whose texts are
    (`text_messages`)."""
    text_messages: MessageFormat | None = None
    """How a model whose sentence-transformers folder takes its inputs as chat messages (the Transformer's
    `modality_config` names "message") holds each one in its message; None: inputs are tokenised as they are."""
    multi_vector: MultiVector | None = None
    """A multi-vector (ColBERT) model's per-side rules (compile/multi_vector.py), or a hybrid model's."""
    hybrid_heads: tuple[Path, Path] | None = None
    """A hybrid (bge-m3) model's colbert and sparse head files (compile/hybrid.py)."""
    hybrid: Hybrid | None = None
    """A hybrid model's lexical and scoring rules (compile/hybrid.py)."""
    static_queries: QuerySide | None = None
    """An inference-free sparse model's query side: its SparseStaticEmbedding's weights and limit, and the side a
    request that names none takes (compile/static_queries.py)."""
    lowercase: bool = False
    """The Transformer's do_lower_case (sentence_bert_config.json): the artifact's tokenizer lowercases texts first,
    as sentence-transformers puts a Lowercase normalizer in front of the folder's."""
    prefix_tokens: tuple[str, ...] = ()
    """Prompt prefixes the model was trained with as single tokens (PyLate's "[Q] ", "[D] "): registered as special
    tokens in the artifact's tokenizer, so that the prefix written in front of a text tokenises the same way."""
    autoencoder: AutoEncoder | None = None
    """A CSR sparse model's SparseAutoEncoder, the end of its graph after an embedding model's pooling and Dense
    modules (compile/sparse_autoencoder.py); None for a SPLADE one, whose graph ends in its MLM head."""
    notes: tuple[str, ...] = field(default=())
    """Decisions the user should hear about (defaults taken for lack of configuration)."""

    @property
    def head_task(self) -> str:
        """The task whose head the graph's fusion count expects: a CSR model's ends as an embedding model's does."""
        return "embed" if self.autoencoder is not None else self.task

    @property
    def output_name(self) -> str:
        if self.task == "multi_vector":
            return MULTI_VECTORS
        return "embeddings" if self.task in ("embed", "sparse", "hybrid") else "logits"

    @property
    def graph_outputs(self) -> tuple[str, ...]:
        """The padded graphs' outputs: the pooled or scored rows, and for embedding models every token's state too
        (a multi-vector model's only output is every token's vector; a hybrid model's adds every token's lexical
        weight and vector)."""
        if self.task == "hybrid":
            return self.output_name, TOKEN_EMBEDDINGS, LEXICAL_WEIGHTS, MULTI_VECTORS
        return (self.output_name, TOKEN_EMBEDDINGS) if self.task == "embed" else (self.output_name,)

    @property
    def graph_inputs(self) -> tuple[str, ...]:
        """The exported graph's inputs: the family's, pooling_start where pooling leaves the prompt out, and adapter
        where the folder has task adapters."""
        return (self.architecture.input_names + (() if self.include_prompt else (POOLING_START,))
                + ((ADAPTER,) if self.adapters else ()))

    @property
    def num_layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def num_heads(self) -> int:
        return int(self.config["num_attention_heads"])

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def attention_width(self) -> int:
        """Query heads x head size, averaged over the layers where a family widens some (EmbeddingGemma 2's global
        layers, in its `per_layer_config`): what attention's FLOPs per token scale with."""
        head_dim = int(self.config.get("head_dim") or self.hidden_size // self.num_heads)
        per_layer = self.config.get("per_layer_config") or {}
        dims = [int((per_layer.get(str(layer)) or {}).get("head_dim", head_dim)) for layer in range(self.num_layers)]
        return round(self.num_heads * sum(dims) / len(dims))


def read_json(path: Path) -> Any:
    """A JSON file of the model folder; one that cannot be read is an InputError naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None


def read_optional_json(path: Path) -> dict[str, Any]:
    """A JSON object file the folder may lack ({} then)."""
    data = read_json(path) if path.is_file() else {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class _Modules:
    transformer_path: str = ""
    pooling_path: str | None = None
    dense_paths: tuple[str, ...] = ()
    normalize: bool = False
    sparse: bool = False
    """An MLM transformer with SPLADE pooling (a SparseEncoder folder)."""
    logit_score_path: str | None = None
    """A causal LM scored by two of its next-token logits (a CrossEncoder's LogitScore module)."""
    multi_vector_path: str | None = None
    """The MultiVectorMask module of a MultiVectorEncoder folder (Transformer -> Dense modules -> MultiVectorMask)."""
    token_pooling_path: str | None = None
    """A MultiVectorEncoder folder's HierarchicalTokenPooling module, last in it."""
    pylate: bool = False
    """A PyLate ColBERT folder (Transformer -> Dense modules; its other rules at the top level of
    config_sentence_transformers.json: compile/multi_vector.py)."""
    static_query_path: str | None = None
    """An inference-free sparse Router's SparseStaticEmbedding, its query side (compile/static_queries.py)."""
    autoencoder_path: str | None = None
    """A CSR SparseEncoder's SparseAutoEncoder, after an embedding model's modules (compile/sparse_autoencoder.py)."""
    default_side: str = "document"
    """The side a Router folder's model takes when a request names none (its default route)."""

    @property
    def multi_vector(self) -> bool:
        return self.multi_vector_path is not None or self.pylate

    @property
    def sparse_encoder(self) -> bool:
        return self.sparse or self.autoencoder_path is not None


def _read_modules(folder: Path, st_config: dict[str, Any]) -> _Modules | None:
    path = folder / "modules.json"
    if not path.is_file():
        return None
    entries = read_json(path)
    if not isinstance(entries, list):
        raise InputError(f"{path} is not a list of modules")
    classes = [str(entry.get("type", "")).rsplit(".", 1)[-1] for entry in entries]
    if classes == ["Router"]:
        router = read_router(folder, entries[0].get("path", ""))
        return _Modules(router.transformer_path, router.pooling_path, sparse=True,
                        static_query_path=router.static_path, default_side=router.default_side)
    if "LogitScore" in classes:
        if classes != ["Transformer", "LogitScore"]:
            raise InputError(f"the modules in {path} are {' -> '.join(classes)}; encoderrt compiles a causal-LM "
                             "CrossEncoder as Transformer -> LogitScore")
        return _Modules(entries[0].get("path", ""), logit_score_path=entries[1].get("path", ""))
    from encoderrt.compile.multi_vector import is_pylate, pylate_layout

    if is_pylate(st_config):  # its mask and Normalize were inline: MultiVectorEncoder appends them on load
        return _Modules(entries[0].get("path", ""), dense_paths=pylate_layout(path, entries, classes), normalize=True,
                        pylate=True)
    if "MultiVectorMask" in classes:
        from encoderrt.compile.multi_vector import read_layout

        dense_paths, normalize, mask, pooling = read_layout(path, entries, classes)
        scaled = (read_optional_json(folder / normalize / "config.json").get("module_input_name")
                  if normalize is not None else None)
        if normalize is not None and scaled != "token_embeddings":
            raise InputError(f"the Normalize module in {folder / normalize} normalises {scaled or 'sentence_embedding'}; "
                             "a multi-vector model's normalises the token embeddings")
        return _Modules(entries[0].get("path", ""), dense_paths=dense_paths, normalize=normalize is not None,
                        multi_vector_path=mask, token_pooling_path=pooling)
    from encoderrt.compile.sparse_autoencoder import AUTOENCODER

    if classes[-1:] == [AUTOENCODER]:  # CSR: an embedding model's modules, then the autoencoder
        embedding = _embedding_layout(path, entries[:-1], classes[:-1])
        if embedding.sparse:
            raise InputError(f"the modules in {path} are {' -> '.join(classes)}; encoderrt compiles a CSR "
                             f"SparseEncoder as an embedding model's modules (Transformer -> Pooling -> ...) -> "
                             f"{AUTOENCODER}")
        return replace(embedding, autoencoder_path=str(entries[-1].get("path", "")))
    return _embedding_layout(path, entries, classes)


def _embedding_layout(path: Path, entries: list[dict[str, Any]], classes: list[str]) -> _Modules:
    """An embedding model's modules (a SentenceTransformer's, or a SPLADE SparseEncoder's) in modules.json at `path`."""
    for kind in classes:
        if kind not in _ROLES:
            raise InputError(f"sentence-transformers module '{kind}' in {path} is not supported; "
                             f"encoderrt compiles {', '.join(_ROLES)}")
    kinds = [_ROLES[kind] for kind in classes]
    order = [_SUPPORTED_MODULES.index(kind) for kind in kinds]
    if order != sorted(order) or kinds.count("Transformer") != 1 or kinds.count("Pooling") > 1:
        raise InputError(f"the modules in {path} are {' -> '.join(kinds)}; encoderrt compiles one Transformer, "
                         "then at most one Pooling, then any Dense modules, then Normalize")
    paths = {kind: [entry.get("path", "") for entry, k in zip(entries, kinds) if k == kind] for kind in _SUPPORTED_MODULES}
    sparse = "SpladePooling" in classes
    if sparse and (paths["Dense"] or paths["Normalize"]):
        raise InputError(f"the modules in {path} are {' -> '.join(classes)}; encoderrt compiles a SparseEncoder as "
                         "an MLM Transformer -> SpladePooling")
    return _Modules(paths["Transformer"][0], (paths["Pooling"] or [None])[0], tuple(paths["Dense"]), bool(paths["Normalize"]),
                    sparse)


def _pooling_from_config(path: Path) -> Pooling:
    from encoderrt.compile.pooling import LEGACY_FLAGS

    config = read_json(path / "config.json")
    mode = config.get("pooling_mode")
    if mode is None:
        mode = [name for flag, name in LEGACY_FLAGS.items() if config.get(flag) is True]
    if isinstance(mode, list):
        mode = mode[0] if len(mode) == 1 else "+".join(mode) or "none"
    if mode not in POOLINGS:
        raise InputError(f"pooling mode '{mode}' in {path} is not supported; encoderrt supports one of "
                         f"{', '.join(POOLINGS)}")
    return mode


def _check_truncation_side(folder: Path) -> None:
    """A tokenizer that cuts long texts from the left (tokenizer_config.json's truncation_side) is refused by name:
    sentence-transformers cuts them as it says, and encoderrt by default from the right, so parity would fail on
    every long probe with nothing said about why."""
    side = read_optional_json(folder / "tokenizer_config.json").get("truncation_side", "right")
    if side != "right":
        raise InputError(f"the tokenizer in {folder} cuts long inputs from the {side} (truncation_side in "
                         "tokenizer_config.json), which encoderrt does not take as a model's default yet; requests "
                         "can ask for it (truncation_side / truncation_direction). Set it to \"right\" to compile "
                         "the model as one that keeps a text's start")


def _check_weights(folder: Path) -> None:
    present = [name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not present:
        raise InputError(f"no weights in {folder}: expected one of {', '.join(WEIGHT_FILES)}")
    if present[0] == "model.safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(folder / "model.safetensors", framework="np") as handle:
                handle.keys()
        except (SafetensorError, OSError) as exc:
            raise InputError(f"corrupt weights in {folder / 'model.safetensors'}: {exc}") from None


def _activation(folder: Path, config: dict[str, Any], num_labels: int, task: Task) -> Activation:
    """A classifier's by transformers' text-classification rule (its config's problem_type: sigmoid for each label
    of a multi-label one, none for regression, else softmax); a cross-encoder's by sentence-transformers' rule."""
    if task == "classify":
        return {"multi_label_classification": "sigmoid", "regression": "identity"}.get(config.get("problem_type"),
                                                                                       "softmax")
    st_config = read_optional_json(folder / "config_sentence_transformers.json")
    declared = (
        st_config.get("activation_fn")
        or (config.get("sentence_transformers") or {}).get("activation_fn")
        or config.get("sbert_ce_default_activation_function")
    )
    if declared:
        name = str(declared).rsplit(".", 1)[-1]
        if name not in _ACTIVATIONS:
            raise InputError(f"score activation '{declared}' is not supported; encoderrt supports {', '.join(_ACTIVATIONS)}")
        return _ACTIVATIONS[name]
    return "sigmoid" if num_labels == 1 else "identity"


def _max_length(options: CompileOptions, weights_folder: Path, architecture: Architecture, config: dict[str, Any],
                transformer_settings: dict[str, Any]) -> int:
    limit = architecture.max_positions(config)
    if options.max_length is not None:
        if not 2 <= options.max_length <= limit:
            raise InputError(f"--max-length {options.max_length} is outside 2..{limit}, the model's position table")
        return options.max_length
    declared = transformer_settings.get("max_seq_length")
    if declared is None:
        declared = _tokenizer_limit(weights_folder)
    if isinstance(declared, int) and 2 <= declared < _NO_LIMIT:
        return min(declared, limit)
    return limit


def _tokenizer_limit(folder: Path) -> int | None:
    """The model_max_length the tokenizer in `folder` declares; None where it declares none, or the no-limit
    sentinel."""
    declared = read_optional_json(folder / "tokenizer_config.json").get("model_max_length")
    given = isinstance(declared, int) and not isinstance(declared, bool) and 1 <= declared < _NO_LIMIT
    return declared if given else None


def _query_side(folder: Path, modules: _Modules | None, weights_folder: Path,
                config: dict[str, Any]) -> QuerySide | None:
    """An inference-free model's query side (its Router's SparseStaticEmbedding), read and checked once, before any
    export; None for every other model."""
    if modules is None or modules.static_query_path is None:
        return None
    static = folder / modules.static_query_path
    return QuerySide(query_weights(static, weights_folder, int(config["vocab_size"])), _tokenizer_limit(static),
                     modules.default_side)


def _check_transformers_knows(model_type: str, config_path: Path) -> None:
    """The export and the parity reference run transformers' own classes: a family newer than the installed release
    (UltraBERT before 5.20) is refused by name, not with a traceback from the loader."""
    import transformers
    from transformers.models.auto import configuration_auto

    if model_type not in configuration_auto.CONFIG_MAPPING:
        raise InputError(f"{config_path}: model_type '{model_type}' is newer than the installed transformers "
                         f"{transformers.__version__}, which has no class for it; upgrade transformers "
                         "(pip install -U transformers)")


def inspect_source(options: CompileOptions) -> SourceModel:
    folder = Path(options.model_dir)
    if not folder.exists():
        raise InputError(f"model folder not found: {folder}")
    if not folder.is_dir():
        raise InputError(f"model path is not a folder: {folder}")
    notes: list[str] = []
    st_config = read_optional_json(folder / "config_sentence_transformers.json")
    modules = _read_modules(folder, st_config)
    if modules is None:
        kind: SourceKind = "transformers"
    elif modules.sparse_encoder:
        kind = "sparse-encoder"
    elif modules.multi_vector:
        kind = "multi-vector-encoder"
    elif st_config.get("model_type") == "CrossEncoder":
        kind = "cross-encoder"
    else:
        kind = "sentence-transformers"
    weights_folder = folder / modules.transformer_path if modules else folder
    transformer_settings = read_optional_json(weights_folder / "sentence_bert_config.json")
    config_path = weights_folder / "config.json"
    if not config_path.is_file():
        raise InputError(f"no config.json in {weights_folder}: not a Hugging Face checkpoint folder")
    config = read_json(config_path)
    if not isinstance(config, dict):
        raise InputError(f"{config_path} does not hold a JSON object")
    try:
        architecture = find_architecture(str(config.get("model_type", "<none>")))
    except UnsupportedArchitecture as exc:
        raise InputError(str(exc)) from None
    problem = architecture.unsupported(config) if architecture.unsupported else None
    if problem:
        raise InputError(f"{config_path}: {problem}")
    _check_transformers_knows(str(config["model_type"]), config_path)
    config = architecture.canonical_config(config)
    _check_weights(weights_folder)
    _check_truncation_side(weights_folder)

    head = [a for a in config.get("architectures") or [] if a.endswith("ForSequenceClassification")]
    causal_lm = architecture.causal and any(a.endswith("ForCausalLM") for a in config.get("architectures") or [])
    id2label = config.get("id2label") or {}
    num_labels = len(id2label) or int(config.get("num_labels", 2))
    if causal_lm and not head and (kind == "cross-encoder" or options.task == "score"):
        head, id2label, num_labels = ["LogitScore"], {0: "score"}, 1  # a reranker read from two next-token logits
    from encoderrt.compile.hybrid import find_heads

    heads = find_heads(weights_folder) if kind in ("sentence-transformers", "transformers") else None
    task: Task
    if options.task == "auto" and heads is not None and not head:
        task = "hybrid"
    elif options.task == "auto" and kind == "sparse-encoder":
        task = "sparse"
    elif options.task == "auto" and kind == "multi-vector-encoder":
        task = "multi_vector"
    elif options.task == "auto":
        if head or kind == "cross-encoder":
            task = "score" if num_labels == 1 else "classify"
        else:
            task = "embed"
    else:
        task = options.task
        if task in ("score", "classify") and not head:
            described = ", ".join(config.get("architectures") or ["a bare encoder"])
            raise InputError(f"--task {task} needs a *ForSequenceClassification checkpoint; {folder} is {described}")
        if task == "score" and num_labels != 1:
            raise InputError(f"--task score needs a one-label cross-encoder; this model has {num_labels} labels (use --task classify)")

    pooling: Pooling | None = None
    folder_pooling: Pooling | None = None
    normalize = False
    dense_folders: tuple[Path, ...] = ()
    multi_vector = hybrid = autoencoder = None
    prefixes: tuple[str, ...] = ()
    if task in ("embed", "hybrid"):
        if modules and modules.pooling_path:
            folder_pooling = _pooling_from_config(folder / modules.pooling_path)
        if options.pooling != "auto":
            pooling = options.pooling
        elif folder_pooling:
            pooling = folder_pooling
        elif task == "hybrid":
            pooling, normalize = "cls", True
            notes.append("no pooling configuration in the folder: using bge-m3's CLS pooling, normalised (override "
                         "with --pooling and --no-normalize)")
        else:
            pooling = "mean"
            notes.append("no pooling configuration in the folder: using mean pooling, as sentence-transformers does "
                         "(override with --pooling" + ("; a decoder's embedding models pool its last token: --pooling "
                                                       "lasttoken)" if architecture.causal else ")"))
        normalize = modules.normalize if modules else normalize
        if options.normalize is not None:
            normalize = options.normalize
        dense_folders = tuple(folder / path for path in modules.dense_paths) if modules else ()
        if task == "hybrid":
            from encoderrt.compile.hybrid import read_rules as hybrid_rules

            multi_vector, hybrid = hybrid_rules(weights_folder)
    elif task == "multi_vector":
        if options.pooling != "auto" or options.normalize is not None:
            raise InputError("--pooling and --normalize apply to dense embedding models; this is a multi-vector model")
        from encoderrt.compile.multi_vector import prefix_tokens, pylate_configs, read_rules, read_token_pooling

        assert modules is not None and modules.multi_vector
        dense_folders = tuple(folder / path for path in modules.dense_paths)
        normalize = modules.normalize
        if modules.pylate:
            transformer_config, mask_config, pylate_prompts = pylate_configs(st_config)
            st_config, prefixes = {**st_config, "prompts": pylate_prompts}, prefix_tokens(st_config)
        else:
            assert modules.multi_vector_path is not None
            transformer_config = transformer_settings
            mask_config = read_optional_json(folder / modules.multi_vector_path / "config.json")
        pooling_folder = folder / modules.token_pooling_path if modules.token_pooling_path is not None else None
        token_pooling = (read_token_pooling(read_optional_json(pooling_folder / "config.json"), pooling_folder)
                         if pooling_folder is not None else None)
        multi_vector = read_rules(transformer_config, mask_config, st_config, weights_folder, modules.normalize,
                                  token_pooling)
    elif task == "sparse":
        if options.pooling != "auto" or options.normalize is not None:
            raise InputError("--pooling and --normalize apply to dense embedding models; this is a sparse model")
        if modules is not None and modules.autoencoder_path is not None:
            from encoderrt.compile.sparse_autoencoder import AUTOENCODER, read_autoencoder

            if modules.pooling_path is None:
                raise InputError(f"the CSR SparseEncoder in {folder} has no Pooling module before its {AUTOENCODER}, "
                                 "which reads the pooled embedding")
            where = folder / modules.autoencoder_path
            autoencoder = read_autoencoder(where, read_optional_json(where / "config.json"), modules.normalize)
            pooling = folder_pooling = _pooling_from_config(folder / modules.pooling_path)
            dense_folders = tuple(folder / path for path in modules.dense_paths)
        else:
            pooling_path = folder / (modules.pooling_path or "")
            pooling = splade_pooling(pooling_path, read_optional_json(pooling_path / "config.json"))
    else:
        if options.pooling != "auto":
            raise InputError(f"--pooling applies to embedding models; this model's task is {task}")
        if options.normalize is not None:
            raise InputError(f"--normalize/--no-normalize apply to embedding models; this model's task is {task}")

    # sentence-transformers' defaults: SparseEncoder's dot, SentenceTransformer's cosine
    similarity = (read_similarity(st_config, notes, "dot" if task == "sparse" else "cosine")
                  if task in ("embed", "sparse") else "cosine")
    truncate_dim = st_config.get("truncate_dim") if task in ("embed", "multi_vector") else None
    max_active_dims = st_config.get("max_active_dims") if task == "sparse" else None
    if max_active_dims is None and autoencoder is not None:
        max_active_dims = autoencoder.k  # as SparseEncoder takes the autoencoder's k where the folder sets none
    if max_active_dims is not None and (isinstance(max_active_dims, bool) or not isinstance(max_active_dims, int)
                                        or max_active_dims < 1):
        raise InputError(f"config_sentence_transformers.json's max_active_dims {max_active_dims!r} is not a positive "
                         "integer")
    prompts, default_prompt_name = (read_prompts(st_config, config_path)
                                    if task in ("embed", "score", "sparse", "multi_vector", "hybrid") else ({}, None))
    answer_tokens = chat_template = None
    if head == ["LogitScore"]:
        answer_tokens = _answer_tokens(folder / modules.logit_score_path if modules and modules.logit_score_path else None,
                                       weights_folder)
        chat_template = _chat_template(weights_folder, "the causal-LM reranker", "its pairs are")
    text_messages = _text_messages(transformer_settings, weights_folder, task, head)
    if text_messages:
        chat_template = _chat_template(weights_folder, f"the {task} model", "its inputs are")
    include_prompt = not (task in ("embed", "hybrid") and modules and modules.pooling_path
                          and read_optional_json(folder / modules.pooling_path / "config.json").get("include_prompt")
                          is False)
    labels = tuple(str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(num_labels))
    source = SourceModel(
        folder=folder,
        weights_folder=weights_folder,
        kind=kind,
        config=config,
        architecture=architecture,
        task=task,
        max_length=_max_length(options, weights_folder, architecture, config, transformer_settings),
        pooling=pooling,
        normalize=normalize,
        activation=_activation(folder, config, num_labels, task) if task in _HEADED else "identity",
        labels=labels if task in _HEADED else (),
        similarity=similarity,
        truncate_dim=truncate_dim,
        max_active_dims=max_active_dims,
        folder_pooling=folder_pooling,
        dense_folders=dense_folders,
        prompts=prompts,
        default_prompt_name=default_prompt_name,
        include_prompt=include_prompt,
        output_dim=((_dense_output(dense_folders[-1]) if dense_folders
                     else int(config[architecture.state_width]))
                    if task in ("embed", "multi_vector", "hybrid")
                    else autoencoder.width if autoencoder is not None
                    else int(config["vocab_size"]) if task == "sparse" else num_labels),
        adapters=find_adapters(weights_folder) if task == "embed" else (),
        answer_tokens=answer_tokens,
        chat_template=chat_template,
        text_messages=text_messages,
        multi_vector=multi_vector,
        hybrid_heads=heads if task == "hybrid" else None,
        hybrid=hybrid,
        prefix_tokens=prefixes,
        lowercase=bool(transformer_settings.get("do_lower_case")),
        static_queries=_query_side(folder, modules, weights_folder, config),
        autoencoder=autoencoder,
        notes=tuple(notes),
    )
    check_truncate_dim(truncate_dim, source.output_dim)
    return source


def check_truncate_dim(truncate_dim: Any, width: int) -> None:
    """The folder's truncate_dim, where it has one, is a width of the model's embeddings."""
    if truncate_dim is not None and (isinstance(truncate_dim, bool) or not isinstance(truncate_dim, int)
                                     or not 1 <= truncate_dim <= width):
        raise InputError(f"config_sentence_transformers.json's truncate_dim {truncate_dim!r} is not a width from 1 to "
                         f"{width}, the model's embedding size")


def _answer_tokens(logit_score: Path | None, weights_folder: Path) -> tuple[int, int | None]:
    """The LogitScore module's (true, false) token ids, or, for a bare causal LM, its tokenizer's "yes" and "no",
    as sentence-transformers' CrossEncoder takes them."""
    if logit_score is not None:
        config = read_json(logit_score / "config.json")
        true, false = config.get("true_token_id"), config.get("false_token_id")
        if not isinstance(true, int) or not (false is None or isinstance(false, int)):
            raise InputError(f"{logit_score / 'config.json'} gives no integer true_token_id (and false_token_id or null)")
        if config.get("module_input_name", "causal_logits") != "causal_logits":
            raise InputError(f"the LogitScore module in {logit_score} reads {config['module_input_name']}; encoderrt "
                             "compiles one that reads the causal LM's logits")
        return true, false
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(weights_folder / TOKENIZER_FILE))
    true, false = tokenizer.token_to_id("yes"), tokenizer.token_to_id("no")
    if true is None or false is None:
        raise InputError(f"the tokenizer in {weights_folder} has no 'yes' and 'no' tokens, which a causal-LM reranker "
                         "without a LogitScore module is scored by")
    return true, false


def _text_messages(settings: dict[str, Any], weights_folder: Path, task: str, head: list[str]) -> MessageFormat | None:
    """The message format where the folder's Transformer takes its inputs as chat messages, as sentence-transformers 6
    saves it when the tokenizer has a chat template: `encode` then renders each text through that template (a user
    message, a prompt as a system message) instead of tokenising it as it is, and `CrossEncoder.predict` each pair (a
    query and a document message)."""
    modalities = settings.get("modality_config")
    if not isinstance(modalities, dict) or "message" not in modalities or head == ["LogitScore"]:
        return None  # a causal-LM reranker's pairs are messages by its own rule
    where = weights_folder / "sentence_bert_config.json"
    if task not in ("embed", "score"):
        raise InputError(f"{where}: its modality_config reads inputs as chat messages, which encoderrt renders for "
                         f"embedding models and cross-encoders, not for this model's task, {task}")
    message = modalities["message"] if isinstance(modalities["message"], dict) else {}
    form = message.get("format", "auto")
    if form not in ("flat", "structured"):
        raise InputError(f"{where}: modality_config's message format {form!r} is not one encoderrt renders "
                         "(\"flat\" or \"structured\", as sentence-transformers saves it)")
    return form


def _chat_template(weights_folder: Path, model: str, rendered: str) -> ChatTemplate:
    """The chat template transformers finds for the folder's tokenizer, and the special tokens it renders with;
    `model` and what of it is `rendered` through the template name them where there is none."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(weights_folder, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot load the tokenizer from {weights_folder}: {exc}") from None
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("default")
    if not isinstance(template, str) or not template.strip():
        raise InputError(f"{model} in {weights_folder} has no chat template (chat_template.jinja or "
                         f"tokenizer_config.json's chat_template), which {rendered} rendered through")
    variables = {name: str(value) for name, value in tokenizer.special_tokens_map.items() if isinstance(value, str)}
    return ChatTemplate(template, variables)


def read_similarity(st_config: dict[str, Any], notes: list[str], default: Similarity = "cosine") -> Similarity:
    """The folder's similarity_fn_name; none, or a name sentence-transformers does not take (a multi-vector save's
    "maxsim"), leaves the default it leaves: a SentenceTransformer's cosine, a SparseEncoder's dot."""
    declared = st_config.get("similarity_fn_name")
    if declared is None or declared in SIMILARITIES:
        return declared or default
    notes.append(f"similarity_fn_name '{declared}' is not one a model scores by ({', '.join(SIMILARITIES)}): scores "
                 f"use {default}, as sentence-transformers does")
    return default


def read_prompts(st_config: dict[str, Any], where: Path) -> tuple[dict[str, str], str | None]:
    """The folder's named prompts and its default prompt's name, checked."""
    prompts = st_config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise InputError(f"config_sentence_transformers.json beside {where} has prompts that are not name: text pairs")
    default = st_config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise InputError(f"default_prompt_name '{default}' is not one of the folder's prompts ({', '.join(prompts) or 'none'})")
    return {str(k): v for k, v in prompts.items()}, default


def _dense_output(path: Path) -> int:
    out_features = read_json(path / "config.json").get("out_features")
    if not isinstance(out_features, int) or out_features < 1:
        raise InputError(f"{path / 'config.json'} gives no out_features for its Dense module")
    return out_features


def splade_pooling(path: Path, config: dict[str, Any]) -> str:
    """The manifest's pooling for a SpladePooling module's config.json at `path` (a sentence-transformers
    SparseEncoder folder: an MLM head, then SpladePooling, max or sum, over log(1 + relu(logits)))."""
    strategy = config.get("pooling_strategy", "max")
    activation = config.get("activation_function", "relu")
    if strategy not in ("max", "sum"):
        raise InputError(f"SpladePooling strategy '{strategy}' in {path} is not supported; encoderrt supports max and sum")
    if activation not in ("relu", "log1p_relu"):
        raise InputError(f"SpladePooling activation '{activation}' in {path} is not supported; encoderrt supports relu "
                         "and log1p_relu")
    return f"splade_{strategy}" + ("_log1p_relu" if activation == "log1p_relu" else "")
