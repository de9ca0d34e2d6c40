"""Static embedding models: model2vec's potion, sentence-transformers' static-retrieval-mrl and static-similarity-mrl.

A sentence-transformers folder whose first module is a StaticEmbedding has no transformer: a text's vector is the
mean of its tokens' rows of one table (an EmbeddingBag), then the folder's Normalize. There is nothing to export,
fuse or quantise, so compile writes the table (model2vec's token mapping and weights folded in, as
sentence-transformers loads it) and the tokenizer, without special tokens as StaticEmbedding tokenises, and checks
the artifact on the probes against SentenceTransformer.encode, as for any model. The runtime's static backend
(runtime/backends/static.py) averages each batch's rows; every route and dialect serves it as an embedding model.

Unlike sentence-transformers, which reads a text whole, the artifact cuts texts at max_length (8,192 tokens unless
--max-length says otherwise), as every encoderrt model does, and the reference is cut there too; an engine that
chunks long inputs merges chunks by token count, which for a mean is exactly the whole text's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from encoderrt.compile import parity
from encoderrt.compile.artifact import ArtifactWriter, check_output_dir
from encoderrt.compile.errors import InputError, ParityError
from encoderrt.compile.options import CompileOptions
from encoderrt.compile.progress import StepReporter
from encoderrt.compile.source import check_truncate_dim, read_json, read_optional_json, read_prompts, read_similarity
from encoderrt.runtime.manifest import Manifest, ModelShape
from encoderrt.runtime.tokenizer import TOKENIZER_FILE
from encoderrt.versions import package_versions

TABLE_FILE = "embeddings.npy"
DEFAULT_MAX_LENGTH = 8192
OUTPUT = "sentence_embedding"


def is_static(folder: Path) -> bool:
    """Whether `folder` is a sentence-transformers folder whose first module is a StaticEmbedding."""
    try:
        entries = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(entries, list) and bool(entries) and isinstance(entries[0], dict)
            and str(entries[0].get("type", "")).rsplit(".", 1)[-1] == "StaticEmbedding")


def compile_static(options: CompileOptions, reporter: StepReporter) -> Manifest:
    """Write the artifact of a static embedding folder (target "static", fp32), checked against SentenceTransformer;
    its manifest."""
    folder = options.model_dir
    st_config, module_path, normalize = _read_folder(folder, options)
    check_output_dir(options.output_dir, options.force)
    with reporter.step("export", "the embedding table and tokenizer of a static embedding folder"):
        table, tokenizer = _load(folder, module_path)
    notes: list[str] = []
    manifest = _manifest(options, st_config, table, tokenizer, options.max_length or DEFAULT_MAX_LENGTH, normalize,
                         notes)
    for note in notes:
        reporter.note(note)
    with ArtifactWriter(options.output_dir, options.force) as writer:
        assert writer.staging is not None
        np.save(writer.staging / TABLE_FILE, table, allow_pickle=False)
        tokenizer.save(str(writer.staging / TOKENIZER_FILE))
        with reporter.step("verify", "parity against sentence-transformers (fp32, numpy)"):
            figures, failures = _parity(folder, manifest, writer.staging)
        if failures:
            raise ParityError(f"parity check failed: {'; '.join(failures)}")
        return writer.commit(replace(manifest, parity=figures))


def _read_folder(folder: Path, options: CompileOptions) -> tuple[dict[str, Any], Path, bool]:
    """The folder's sentence-transformers config, its StaticEmbedding's folder, and whether it normalises; what
    compile cannot honour is refused."""
    entries = read_json(folder / "modules.json")
    classes = [str(entry.get("type", "")).rsplit(".", 1)[-1] for entry in entries]
    if classes not in (["StaticEmbedding"], ["StaticEmbedding", "Normalize"]):
        raise InputError(f"the modules in {folder / 'modules.json'} are {' -> '.join(classes)}; encoderrt compiles a "
                         "static embedding model as StaticEmbedding, then at most Normalize")
    asked = [flag for flag, given in (("--task", options.task not in ("auto", "embed")),
                                      ("--precision", options.precision not in ("auto", "fastest", "fp32")),
                                      ("--target", options.target not in ("auto", "cpu")),
                                      ("--pooling", options.pooling not in ("auto", "mean")),
                                      ("--normalize", options.normalize is not None)) if given]
    if asked:
        raise InputError(f"{', '.join(asked)}: a static embedding model has one way to run (the mean of its tokens' "
                         "fp32 vectors, as the folder says, on the CPU), so these do not apply")
    if options.max_length is not None and options.max_length < 2:
        raise InputError(f"--max-length {options.max_length} is below 2")
    st_config = read_optional_json(folder / "config_sentence_transformers.json")
    return st_config, folder / str(entries[0].get("path") or ""), "Normalize" in classes


def _load(folder: Path, path: Path):
    """The table (model2vec's mapping and per-token weights folded in) and the tokenizer, as StaticEmbedding loads
    them; the tokenizer without padding, truncation or special tokens, as StaticEmbedding tokenises."""
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers.processors import TemplateProcessing

    try:
        module = StaticEmbedding.load(str(path), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception for a broken tokenizer.json
        raise InputError(f"cannot load the StaticEmbedding in {folder}: {exc}") from None
    table = module.embedding.weight.detach().float().numpy()
    tokenizer = module.tokenizer
    tokenizer.no_padding()
    tokenizer.no_truncation()
    tokenizer.post_processor = TemplateProcessing(single="$A", pair="$A $B:1", special_tokens=[])
    if tokenizer.get_vocab_size() > len(table):
        raise InputError(f"the tokenizer in {folder} has {tokenizer.get_vocab_size()} tokens and the table "
                         f"{len(table)} rows: some tokens would have no vector")
    return np.ascontiguousarray(table, np.float32), tokenizer


def _manifest(options: CompileOptions, st_config: dict[str, Any], table: np.ndarray, tokenizer, max_length: int,
              normalize: bool, notes: list[str]) -> Manifest:
    prompts, default_prompt = read_prompts(st_config, options.model_dir)
    similarity = read_similarity(st_config, notes)
    vocab, width = table.shape
    truncate_dim = st_config.get("truncate_dim")
    check_truncate_dim(truncate_dim, width)
    pad = next((i for name in ("[PAD]", "<pad>") if (i := tokenizer.token_to_id(name)) is not None), 0)
    return Manifest(
        task="embed", architecture="static", model_type="static_embedding", max_length=max_length, pad_token_id=pad,
        inputs=("input_ids", "attention_mask"), outputs=(OUTPUT,), precision="fp32", target="static",
        model_file=TABLE_FILE, shape=ModelShape(width, 0, 0, 0, vocab, width, matmul_weights=0),
        pooling="mean", normalize=normalize, truncate_dim=truncate_dim, similarity=similarity,
        source={"name": options.name or options.model_dir.absolute().name, "path": str(options.model_dir.absolute()),
                "kind": "sentence-transformers"},
        versions=package_versions(("encoderrt", "sentence-transformers", "tokenizers", "numpy")),
        prompts=prompts, default_prompt_name=default_prompt,
    )


def _parity(folder: Path, manifest: Manifest, staging: Path) -> tuple[dict[str, Any], list[str]]:
    """The artifact's vectors on the probes (each of the folder's prompts too) against SentenceTransformer.encode's,
    the reference's tokenizer cut at the artifact's limit."""
    import warnings

    from sentence_transformers import SentenceTransformer

    tokenizer = parity.artifact_tokenizer(manifest, staging)
    texts = parity.probe_texts(tokenizer)
    model = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
    model[0].tokenizer.enable_truncation(manifest.max_length)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        references = [model.encode(texts, prompt="", convert_to_numpy=True)]
        prompted = [prompt + text for prompt in manifest.prompts.values() for text in texts[:6]]
        references += [model.encode(texts[:6], prompt_name=name, convert_to_numpy=True) for name in manifest.prompts]
    probes = parity.Probes(texts + prompted, ([], []), np.concatenate(references),
                           "sentence-transformers SentenceTransformer.encode")
    return parity.check_parity(manifest, staging, probes)
