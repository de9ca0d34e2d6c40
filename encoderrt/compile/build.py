"""What every target's builder shares: the source, the options, progress, and one reference per compile.

A builder (compile/cpu.py, openvino.py, tensorrt.py: `build(build, folder) -> Manifest`) writes one
candidate artifact's files into a folder, verifies its parity and returns its manifest; the
pipeline commits it, or, when several candidates were built, the one the measurement chose.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from encoderrt.compile import parity
from encoderrt.compile.errors import InputError, ParityError
from encoderrt.compile.options import CompileOptions
from encoderrt.compile.progress import StepReporter
from encoderrt.compile.source import SourceModel
from encoderrt.runtime.manifest import Manifest, ModelShape, StaticQueries
from encoderrt.runtime.tokenizer import TOKENIZER_FILE
from encoderrt.versions import package_versions

_RECORDED_PACKAGES = ("encoderrt", "torch", "transformers", "sentence-transformers", "onnx", "onnxruntime", "openvino",
                      "nncf", "tokenizers")


@dataclass
class Build:
    source: SourceModel
    options: CompileOptions
    """This candidate's: its target and precision are concrete (never "auto")."""
    reporter: StepReporter
    work: Path
    """Scratch space shared by the candidates of one compile (an export one candidate made, another reuses)."""
    shared: dict[str, Any] = field(default_factory=dict)
    """What the candidates of one compile share: exports' results, and the reference on the probe set."""

    def for_candidate(self, target: str, precision: str) -> "Build":
        """The same compile for another candidate; `shared` (so the reference too) is the same object."""
        return replace(self, options=replace(self.options, target=target, precision=precision))

    def manifest(self, folder: Path, fused_ops: dict[str, int], **fields: Any) -> Manifest:
        """Save the tokenizer into `folder`; the manifest of this candidate (fields override its defaults)."""
        source, config = self.source, self.source.config
        values: dict[str, Any] = dict(
            task=source.task,
            architecture=source.architecture.name,
            model_type=str(config["model_type"]),
            max_length=source.max_length,
            pad_token_id=_save_tokenizer(source, folder),
            inputs=source.graph_inputs,
            outputs=source.graph_outputs,
            precision=self.options.precision,
            target=self.options.target,
            model_file="model.onnx",
            shape=self._shape(),
            pooling=source.pooling,
            normalize=source.normalize,
            similarity=source.similarity,
            truncate_dim=source.truncate_dim,
            max_active_dims=source.max_active_dims,
            activation=source.activation,
            labels=source.labels,
            source={
                "name": self.options.name or source.folder.absolute().name,
                "path": str(source.folder.absolute()),
                "kind": source.kind,
                "base_model": config.get("_name_or_path"),
            },
            fused_ops=fused_ops,
            versions=package_versions(_RECORDED_PACKAGES),
            prompts=dict(source.prompts),
            default_prompt_name=source.default_prompt_name,
            adapters=tuple(adapter.name for adapter in source.adapters),
            chat_template=source.chat_template,
            text_messages=source.text_messages,
            multi_vector=source.multi_vector,
            hybrid=source.hybrid,
            static_queries=_save_static_queries(source, folder),
        )
        values.update(fields)
        return Manifest(**values)

    def _shape(self) -> ModelShape:
        """The model's sizes, with its per-token weights counted once for every candidate."""
        from encoderrt.compile.export import per_token_matmul_weights

        source, config = self.source, self.source.config
        if "matmul_weights" not in self.shared:
            self.shared["matmul_weights"] = per_token_matmul_weights(source)
        return ModelShape(
            hidden_size=source.hidden_size,
            num_layers=source.num_layers,
            num_heads=source.num_heads,
            intermediate_size=int(config.get("intermediate_size", 4 * source.hidden_size)),
            vocab_size=int(config["vocab_size"]),
            output_dim=source.output_dim,
            matmul_weights=self.shared["matmul_weights"],
            attention_width=source.attention_width,
        )

    def verify(self, manifest: Manifest, folder: Path, what: str = "parity against PyTorch") -> tuple[dict[str, Any], list[str]]:
        """Parity of the artifact in `folder` on the probe set: (figures, broken tolerances)."""
        if "probes" not in self.shared:
            with self.reporter.step("reference", "PyTorch on the probe set"):
                self.shared["probes"] = parity.build_probes(self.source, manifest, folder)
        with self.reporter.step("verify", f"{what} ({manifest.precision} on {manifest.target})"):
            return parity.check_parity(manifest, folder, self.shared["probes"])

    def require(self, figures: dict[str, Any], failures: list[str], what: str = "parity check") -> None:
        if failures:
            raise ParityError(f"{what} failed: {'; '.join(failures)}; figures: {_brief(figures)}")


def _brief(figures: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in figures.items() if isinstance(v, (int, float))}


def _save_static_queries(source: SourceModel, folder: Path) -> StaticQueries | None:
    """An inference-free sparse model's query weights, written into the artifact (compile/static_queries.py)."""
    side = source.static_queries
    if side is None:
        return None
    import numpy as np

    from encoderrt.compile.static_queries import WEIGHTS_FILE

    np.save(folder / WEIGHTS_FILE, side.weights, allow_pickle=False)
    return StaticQueries(WEIGHTS_FILE, side.max_length, side.default_side)


def _save_tokenizer(source: SourceModel, folder: Path) -> int:
    """Copy the tokenizer as a fast-tokenizer file set; returns the pad token id."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source.weights_folder, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot load the tokenizer from {source.weights_folder}: {exc}") from None
    if not tokenizer.is_fast:
        raise InputError(f"the tokenizer in {source.weights_folder} has no fast (tokenizers) version")
    if source.prefix_tokens:
        from encoderrt.compile.multi_vector import register_prefix_tokens

        register_prefix_tokens(tokenizer, source.prefix_tokens)
    if source.lowercase:
        _lowercase_first(tokenizer)
    tokenizer.save_pretrained(folder)
    if not (folder / TOKENIZER_FILE).is_file():
        raise InputError(f"the tokenizer in {source.weights_folder} could not be saved as {TOKENIZER_FILE}")
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else source.config.get("pad_token_id") or 0)


def _lowercase_first(tokenizer) -> None:
    """A Lowercase normalizer in front of the tokenizer's own, where it has none, as sentence-transformers adds one
    for a Transformer module saved with do_lower_case."""
    from tokenizers.normalizers import Lowercase, Sequence

    backend = tokenizer.backend_tokenizer
    normalizer = backend.normalizer
    if isinstance(normalizer, Lowercase) or (isinstance(normalizer, Sequence)
                                             and any(isinstance(n, Lowercase) for n in normalizer)):
        return
    backend.normalizer = Sequence([Lowercase(), *(list(normalizer) if isinstance(normalizer, Sequence)
                                                  else [normalizer] if normalizer is not None else [])])
