"""Late-interaction (ColBERT) folders as sentence-transformers' MultiVectorEncoder saves them: a Transformer, Dense
projections of every token, a MultiVectorMask, maybe a Normalize, maybe a HierarchicalTokenPooling. The graph
returns every token's projected vector (export.TokenVectors); the rules that differ between queries and documents
(lengths, query expansion, the skip-list, token pooling) go into the manifest, where the runtime applies them
(runtime/tasks/multi_vector.py), normalising and pooling too.

PyLate's folders (config_sentence_transformers.json's model_type "ColBERT") list only the Transformer and its Dense
modules and keep the rest at the top level of that file (query_prefix, document_prefix, query_length,
document_length, do_query_expansion, attend_to_expansion_tokens, skiplist_words): they are read as
MultiVectorEncoder reads them (its legacy fix-ups), the mask and a token-level Normalize included, and the prefixes,
which PyLate inserted as tokens, become prompts registered as special tokens in the artifact's tokenizer."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import torch

from encoderrt.compile.errors import InputError
from encoderrt.runtime.manifest import MultiVector, TokenPooling

TOKEN_POOLING = "HierarchicalTokenPooling"


def read_layout(where: Path, entries: list[dict[str, Any]],
                classes: list[str]) -> tuple[tuple[str, ...], str | None, str, str | None]:
    """modules.json's layout of a MultiVectorEncoder folder, as (Dense module paths, the Normalize's or None, the
    MultiVectorMask's, the token pooling's or None): one Transformer, any Dense modules on the token embeddings, then
    the mask and at most one Normalize of the token embeddings in either order (the mask drops vectors; normalising
    scales each alone), and last, where the model pools its vectors, a HierarchicalTokenPooling."""
    dense = next((i for i, kind in enumerate(classes[1:], 1) if kind != "Dense"), len(classes))
    end = len(classes) - (classes[-1] == TOKEN_POOLING)
    if classes[0] != "Transformer" or sorted(classes[dense:end]) not in (["MultiVectorMask"],
                                                                          ["MultiVectorMask", "Normalize"]):
        raise InputError(f"the modules in {where} are {' -> '.join(classes)}; encoderrt compiles a MultiVectorEncoder as "
                         "Transformer -> any Dense modules -> MultiVectorMask, with or without a Normalize beside it, "
                         f"then at most one {TOKEN_POOLING}")
    paths = [str(entry.get("path", "")) for entry in entries]
    normalize = paths[classes.index("Normalize")] if "Normalize" in classes else None
    pooling = paths[-1] if end < len(classes) else None
    return tuple(paths[1:dense]), normalize, paths[classes.index("MultiVectorMask")], pooling


def read_token_pooling(config: dict[str, Any], path: Path) -> TokenPooling:
    """A HierarchicalTokenPooling module's settings (its config.json, in `path`), read as sentence-transformers reads
    them (a save without normalize_embeddings does not normalise) and refused where it would refuse them."""
    sides = config.get("tasks") or ["document"]
    try:
        pooling = TokenPooling(pool_factor=float(config.get("pool_factor", 1.0)), max_tokens=config.get("max_tokens"),
                               distance_threshold=config.get("distance_threshold"),
                               protected_tokens=int(config.get("num_protected_tokens", 1)),
                               normalize=bool(config.get("normalize_embeddings", False)),
                               sides=tuple([sides] if isinstance(sides, str) else sides))
    except (TypeError, ValueError) as exc:
        raise InputError(f"the {TOKEN_POOLING} module in {path} has settings encoderrt cannot read: {exc}") from None
    if problem := pooling.problem():
        raise InputError(f"the {TOKEN_POOLING} module in {path}: {problem}")
    return pooling


PYLATE_MODEL_TYPE = "ColBERT"
_PYLATE_PREFIXES = {"query_prefix": "query", "document_prefix": "document"}


def is_pylate(st_config: dict[str, Any]) -> bool:
    return st_config.get("model_type") == PYLATE_MODEL_TYPE


def pylate_layout(where: Path, entries: list[dict[str, Any]], classes: list[str]) -> tuple[str, ...]:
    """A PyLate folder's Dense module paths: its modules are a Transformer and Dense modules on the tokens."""
    if len(classes) < 2 or classes[0] != "Transformer" or any(kind != "Dense" for kind in classes[1:]):
        raise InputError(f"the modules in {where} are {' -> '.join(classes)}; encoderrt compiles a PyLate ColBERT "
                         "folder as Transformer -> Dense modules")
    return tuple(str(entry.get("path", "")) for entry in entries[1:])


def pylate_configs(st_config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """The Transformer's and the mask's configs, and the prompts, that MultiVectorEncoder makes of a PyLate folder's
    top-level keys: expansion on (to query_length, 32 unless given, not attended unless the folder says so) unless
    do_query_expansion is false; punctuation skipped unless skiplist_words says otherwise; each prefix in front of
    its side's prompt."""
    transformer = {key: st_config[key] for key in ("query_length", "document_length", "query_expansion")
                   if key in st_config and (st_config[key] is not None or key == "query_expansion")}
    if "query_expansion" not in transformer:
        if st_config.get("do_query_expansion") is False:
            transformer["query_expansion"] = None
        else:
            attend = st_config.get("attend_to_expansion_tokens", st_config.get("attend_to_mask_tokens"))
            length = transformer.pop("query_length", None) or 32
            transformer["query_expansion"] = {"strategy": "fixed", "attend": bool(attend), "length": length}
    words = st_config.get("skiplist_words")
    mask = {"skiplist_words": list(string.punctuation) if words is None else words}
    prompts = dict(st_config.get("prompts") or {})
    for key, side in _PYLATE_PREFIXES.items():
        if key in st_config:
            prefix = st_config[key] or ""
            prompts[side] = prefix + (prompts.get(side) or "").removeprefix(prefix)
    return transformer, mask, prompts


def prefix_tokens(st_config: dict[str, Any]) -> tuple[str, ...]:
    """The prefixes a PyLate folder inserted as tokens (its query_prefix and document_prefix)."""
    return tuple(st_config[key] for key in _PYLATE_PREFIXES if st_config.get(key))


def register_prefix_tokens(tokenizer: Any, prefixes: tuple[str, ...]) -> None:
    """Make each prefix the tokenizer knows (as a whole, or its first word) one special, unnormalised token where it
    would otherwise be split (a lowercasing tokenizer never matches an added "[Q] " it normalises), so that the
    prefix written in front of a text tokenises as PyLate inserted it, as MultiVectorEncoder arranges on load."""
    from tokenizers import AddedToken

    known = set(getattr(tokenizer, "added_tokens_encoder", None) or ()) | set(tokenizer.get_vocab())
    register = []
    for prefix in prefixes:
        if not prefix.split():
            continue
        token = next((t for t in (prefix, prefix.split(None, 1)[0]) if t in known), None)
        if token is not None and tokenizer.tokenize(token) != [token]:
            register.append(AddedToken(token, normalized=False, special=True))
    if register:
        tokenizer.add_special_tokens({"additional_special_tokens": register})


def read_rules(transformer_config: dict[str, Any], mask_config: dict[str, Any], st_config: dict[str, Any],
               weights_folder: Path, normalize: bool, token_pooling: TokenPooling | None = None) -> MultiVector:
    """The per-side rules from the Transformer's sentence_bert_config.json, the mask module's config.json and the
    folder's config_sentence_transformers.json, token words resolved by the folder's tokenizer as
    sentence-transformers resolves them; the token pooling module's, where the folder has one."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(weights_folder, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot load the tokenizer from {weights_folder}: {exc}") from None
    expansion = transformer_config.get("query_expansion") or None
    if expansion is not None:
        if expansion.get("strategy") not in ("fixed", "min") or not isinstance(expansion.get("length"), int):
            raise InputError(f"query_expansion {expansion} in {weights_folder} is not a fixed or min strategy with a "
                             "length")
        token = expansion.get("token")
        expansion_id = (tokenizer.convert_tokens_to_ids(token) if token is not None
                        else tokenizer.mask_token_id if tokenizer.mask_token_id is not None else tokenizer.eos_token_id)
        if expansion_id is None:
            raise InputError(f"the tokenizer in {weights_folder} has no mask or end-of-sequence token to expand "
                             "queries with")
    similarity = st_config.get("similarity_fn_name") or "maxsim"
    if is_pylate(st_config) and similarity not in ("maxsim", "meanmaxsim"):
        similarity = "maxsim"  # PyLate's own names ("MaxSim"), which MultiVectorEncoder leaves for its default
    if similarity not in ("maxsim", "meanmaxsim"):
        raise InputError(f"similarity_fn_name '{similarity}' is not supported for a multi-vector model; encoderrt "
                         "scores by maxsim or meanmaxsim")
    if mask_config.get("keep_only_token_ids"):
        raise InputError("a MultiVectorMask with keep_only_token_ids (image-patch documents) is not supported")
    skip_sides = mask_config.get("skiplist_tasks") or ["document"]
    unknown = getattr(tokenizer, "unk_token_id", None)
    skip = []
    for word in mask_config.get("skiplist_words") or []:  # words that are no single token are dropped, as ST does
        token_id = tokenizer.convert_tokens_to_ids(word)
        if token_id is not None and (token_id != unknown or word == tokenizer.unk_token):
            skip.append(int(token_id))
    return MultiVector(
        query_length=transformer_config.get("query_length"),
        document_length=transformer_config.get("document_length"),
        expansion_length=expansion["length"] if expansion else None,
        expansion_strategy=expansion["strategy"] if expansion else "fixed",
        expansion_attend=bool(expansion.get("attend", False)) if expansion else False,
        expansion_token_id=int(expansion_id) if expansion else None,
        skip_ids=tuple(skip),
        skip_sides=tuple([skip_sides] if isinstance(skip_sides, str) else skip_sides),
        similarity=similarity,
        normalize=normalize,
        token_pooling=token_pooling,
    )


def token_dense(path: Path) -> torch.nn.Module:
    """A Dense module that projects every token (sentence-transformers loads it: weights, bias, activation)."""
    from sentence_transformers.base.modules.dense import Dense

    try:  # token embeddings where the save names no input (PyLate's, older sentence-transformers')
        dense = Dense.load(str(path), local_files_only=True, init_defaults={"module_input_name": "token_embeddings"})
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise InputError(f"cannot load the Dense module in {path}: {exc}") from None
    if dense.module_input_name != "token_embeddings" or dense.module_output_name != "token_embeddings":
        raise InputError(f"the Dense module in {path} maps {dense.module_input_name} to {dense.module_output_name}; a "
                         "multi-vector model's Dense modules project the token embeddings")
    return dense.eval()

