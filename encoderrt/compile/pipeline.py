"""export -> fuse -> quantise -> verify -> (measure) -> artifact, as one call.

Each target's builder (compile/cpu.py, openvino.py, tensorrt.py) writes and verifies one candidate;
with `--target auto` or `--precision auto` several are built and compile/selection.py keeps the
fastest eligible one. Nothing reaches the output folder until the chosen artifact is committed.
"""

from __future__ import annotations

import errno
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from encoderrt.compile import leftovers, static_embedding
from encoderrt.compile.artifact import ArtifactWriter, check_output_dir
from encoderrt.compile.build import Build
from encoderrt.compile.errors import CompileError, InputError, ParityError
from encoderrt.compile.options import CompileOptions
from encoderrt.compile.progress import StepReporter
from encoderrt.compile.selection import Candidate, choose, plan
from encoderrt.compile.source import SourceModel, inspect_source
from encoderrt.runtime.manifest import Manifest

Builder = Callable[[Build, Path], Manifest]


@dataclass(frozen=True)
class CompileResult:
    path: Path
    manifest: Manifest
    timings: dict[str, float]


def _builders() -> dict[str, Builder]:
    try:  # the builders import these where they use them; a missing one is named before any work
        import onnx  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401

        from encoderrt.compile import cpu, openvino, tensorrt
    except ImportError as exc:
        raise CompileError(f"compiling needs the compile extra ({exc.name} is missing): pip install 'encoderrt[compile]'") from None
    _check_transformers()
    return {"cpu": cpu.build, "cuda": cpu.build, "openvino": openvino.build, "tensorrt": tensorrt.build}


def _check_transformers() -> None:
    """The transformers releases compile works with are the ones the compile extra declares: outside them export
    ends in a traceback deep in tracing (5.5.4: SDPA masks that do not trace; 5.18: rotary fused into an op
    onnxruntime cannot batch), so an installed release outside the range is one line here."""
    from importlib import metadata

    from packaging.requirements import Requirement

    try:
        declared = [Requirement(text) for text in metadata.requires("encoderrt") or ()]
        installed = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return  # not installed as a package (a source tree on the path): nothing declared to check against
    for requirement in declared:
        if requirement.name == "transformers" and not requirement.specifier.contains(installed, prereleases=True):
            raise CompileError(f"transformers {installed} is installed; compile works with transformers"
                               f"{requirement.specifier}: pip install 'transformers{requirement.specifier}'")


def compile_model(options: CompileOptions, reporter: StepReporter | None = None) -> CompileResult:
    reporter = reporter or StepReporter(quiet=options.quiet)
    if static_embedding.is_static(options.model_dir):  # no transformer: nothing to export, fuse or choose between
        return CompileResult(options.output_dir, static_embedding.compile_static(options, reporter), reporter.timings)
    source = inspect_source(options)
    check_output_dir(options.output_dir, options.force)
    candidates = plan(options)
    if options.target == "tensorrt":
        _check_tensorrt(replace(options, precision=candidates[0].precision), source)
    for note in source.notes:
        reporter.note(note)
    builders = _builders()

    leftovers.remove_dead(Path(tempfile.gettempdir()))  # work folders of compiles that were killed
    needed = _work_bytes(source, len(candidates))
    free = shutil.disk_usage(tempfile.gettempdir()).free
    if free < needed:  # a note, not a refusal: the estimate is an upper bound
        reporter.note(f"the work folder ({tempfile.gettempdir()}) has {_in_units(free)} free; this compile may write "
                      f"up to {_in_units(needed)} (set TMPDIR to a larger disk)")
    try:
        return _compile(options, source, candidates, builders, reporter)
    except OSError as error:
        if error.errno != errno.ENOSPC:
            raise
        raise CompileError(f"the disk filled up while compiling ({error}); nothing was written. Compiling needs about "
                           f"{_in_units(needed)} free in the work folder ({tempfile.gettempdir()}; set TMPDIR to move "
                           "it) and the model's size again where --output is") from None
    except (MemoryError, RuntimeError) as error:  # torch's and OpenVINO's allocators raise RuntimeError
        if not isinstance(error, MemoryError) and "allocate" not in str(error):
            raise
        raise CompileError(f"compiling ran out of memory at max length {source.max_length:,} ({_first_line(error)}); "
                           "nothing was written. Verification runs the model on probes as long as that, which "
                           "windowed and long-context models cannot fit at every length their position table "
                           "allows: pass --max-length with the length you will serve") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:200]


def _work_bytes(source: SourceModel, candidates: int) -> int:
    """What a compile writes at most: the export, the optimised graph and each candidate, each the weights' size.
    The transformer's own files (shards too), not a sentence-transformers folder's ONNX or OpenVINO exports beside
    them."""
    folder = source.weights_folder
    weights = [*folder.glob("*.safetensors"), *folder.glob("pytorch_model*.bin")]
    return (2 + candidates) * sum(path.stat().st_size for path in weights if path.is_file())


def _in_units(size: int) -> str:
    return f"{size / 1e9:.1f} GB" if size >= 1e9 else f"{max(size / 1e6, 1):.0f} MB"


def _compile(options: CompileOptions, source: SourceModel, candidates: list[Candidate], builders: dict[str, Builder],
             reporter: StepReporter) -> CompileResult:
    with tempfile.TemporaryDirectory(prefix=leftovers.work_prefix()) as work, ArtifactWriter(options.output_dir, options.force) as writer:
        assert writer.staging is not None
        build = Build(source, options, reporter, Path(work))
        if len(candidates) == 1:
            candidate = candidates[0]
            manifest = builders[candidate.target](build.for_candidate(candidate.target, candidate.precision), writer.staging)
        else:
            manifest = _choose(candidates, build, builders, writer.staging,
                               lossless_only=options.precision == "auto")
        manifest = writer.commit(manifest)
    return CompileResult(path=options.output_dir, manifest=manifest, timings=reporter.timings)


def _choose(candidates: list[Candidate], build: Build, builders: dict[str, Builder], staging: Path,
            lossless_only: bool) -> Manifest:
    """Build every candidate in its own folder, keep the fastest eligible one in `staging` (`lossless_only`: bf16 only
    where it meets the lossless tier)."""
    built: list[tuple[Candidate, Manifest | None, Path, list[str]]] = []
    for candidate in candidates:
        folder = build.work / f"candidate-{candidate.target}-{candidate.precision}"
        folder.mkdir()
        try:
            built.append((candidate, builders[candidate.target](build.for_candidate(candidate.target, candidate.precision), folder),
                          folder, []))
        except ParityError as exc:  # one candidate missing its tolerance leaves the others in the running
            built.append((candidate, None, folder, [str(exc)]))
    index, record = choose(built, build.shared["probes"], lossless_only, build.reporter)
    if index < 0:
        raise ParityError("no candidate passed: " + "; ".join(f"{c}: {r['reason']}" for c, r in
                                                                zip(candidates, record["candidates"])))
    _, manifest, folder, _ = built[index]
    assert manifest is not None
    shutil.copytree(folder, staging, dirs_exist_ok=True)
    return replace(manifest, selection=record)


def _check_tensorrt(options: CompileOptions, source: SourceModel) -> None:
    """Fail before any work when the TensorRT engine cannot be built here, or not for this model."""
    if source.task in ("multi_vector", "hybrid"):
        raise InputError(f"the tensorrt target does not compile {source.task.replace('_', '-')} models yet (its engine "
                         "returns one output); use --target cpu or openvino, or --task embed for the dense output alone")
    if source.autoencoder is not None:
        raise InputError("the tensorrt target does not compile CSR sparse models (a SparseAutoEncoder) yet; use "
                         "--target cpu or openvino")
    if not source.include_prompt:
        raise InputError("the tensorrt target does not compile pooling that leaves the prompt out (include_prompt: "
                         "false) yet; use --target cpu or openvino")
    head_dim = source.hidden_size // source.num_heads
    if options.layout == "packed":
        from encoderrt.kernels import PACKED_HEAD_DIMS

        if head_dim not in PACKED_HEAD_DIMS:
            raise InputError(f"--layout packed supports head sizes {PACKED_HEAD_DIMS}; this model's is {head_dim}")
    from encoderrt.compile.tensorrt import check_builder

    check_builder(options.precision, options.layout)
