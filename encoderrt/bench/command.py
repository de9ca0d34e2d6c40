"""`encoderrt bench`: run the workloads, write the report, check or write a baseline."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from encoderrt.bench import baseline as baselines
from encoderrt.bench import ceiling, plots, runners, workloads
from encoderrt.bench.flops import flops_per_token
from encoderrt.bench.references import Reference
from encoderrt.bench.report import Report
from encoderrt.bench.workloads import Workload
from encoderrt.compile.cache import CachePrecision, FolderCompile, artifact_for
from encoderrt.runtime import Engine
from encoderrt.runtime.engine import EngineInfo
from encoderrt.runtime.manifest import Manifest
from encoderrt.runtime.settings import declared_setting
from encoderrt.versions import package_versions

SERVED_MODES = {"http", "grpc"}
"""Modes that run against `encoderrt serve` (one the bench starts, or --url's for http)."""
_PACKAGES = ("encoderrt", "onnxruntime", "openvino", "tokenizers", "numpy", "torch", "sentence-transformers", "transformers")


@dataclass(frozen=True)
class BenchOptions:
    target: Path | None = None
    """Artifact or model folder; None: the bundled all-MiniLM-L6-v2."""
    workloads: tuple[str, ...] = workloads.WORKLOADS
    modes: tuple[str, ...] = ("engine",)
    concurrency: tuple[int, ...] = (1, 8, 32)
    duration: float = 5.0
    references: tuple[str, ...] = ()
    """sentence-transformers backends to run on the same inputs (references.KINDS); the first ratio is against torch."""
    out: Path | None = None
    check: Path | None = None
    tolerance: float = 0.15
    write_baseline: Path | None = None
    texts_file: Path | None = None
    max_batch_tokens: int | None = None
    scale: float = 1.0
    """Workload size factor (1.0: 512 queries, 256 passages, 12 rerank lists)."""
    repeat: int = 1
    """Alternating rounds of every measurement; figures are medians over them (report.py)."""
    url: str | None = None
    """http mode against a server already serving this model there (Ray Serve's proxy, a load balancer) instead of
    an `encoderrt serve` the bench starts."""
    compile_precision: CachePrecision = "auto"
    """What a model folder compiles to (cache.FolderCompile): as serve and the jobs take it, the artifact they run."""


def run_bench(options: BenchOptions, console: Console | None = None) -> int:
    console = console or Console(stderr=True, highlight=False)
    tier = ceiling.cpu_tier(ceiling.cpu_description()["flags"])
    baseline = baselines.read_baseline(options.check, tier) if options.check else None  # fail early on a bad file
    user_texts = workloads.read_texts(options.texts_file) if options.texts_file else None
    out = options.out or Path("bench-report")
    _check_writable(out, "the report")  # before minutes of measuring, not after them
    if options.write_baseline:
        _check_writable(options.write_baseline.parent, "the baseline")
    artifact, name = artifact_for(options.target, precision=options.compile_precision,
                                  asked_as=declared_setting(FolderCompile, "compile_precision").given_as())
    engine = runners.load_engine(artifact, options.max_batch_tokens)
    try:
        report = _measure(options, engine, artifact, name or engine.info.name, user_texts, console)
    finally:
        engine.close()

    for path in report.write(out):
        console.print(f"wrote {path}")
    if not plots.available():
        console.print(plots.MISSING)
    print(report.markdown())
    status = 0
    if baseline is not None:
        assert options.check is not None
        if tier not in baselines.recorded_tiers(options.check):
            console.print(f"note: {options.check} records nothing for this CPU tier ({tier}); checking its floor for every CPU")
        comparisons = baselines.compare(baseline, report.ratios(), options.tolerance)
        print(baselines.format_comparisons(comparisons, options.tolerance))
        failed = [c for c in comparisons if not c.passed]
        if failed:
            console.print(f"[red]performance regression:[/] {', '.join(c.name for c in failed)}")
            status = 1
        else:
            console.print("[green]no performance regression[/]")
    if options.write_baseline:
        baselines.write_baseline(options.write_baseline, report.ratios(),
                                 f"{report.model['name']} {report.model['precision']} on {report.model['target']}; "
                                 f"{report.cpu['model']} ({tier})", tier)
        console.print(f"wrote baseline {options.write_baseline}")
    return status


def _check_writable(folder: Path, what: str) -> None:
    """`folder` exists (made here if need be) and takes files, or a ValueError naming it."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"cannot write {what} to {folder}: it is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot write {what} to {folder}: {exc.strerror or exc}") from None
    if not os.access(folder, os.W_OK):
        raise ValueError(f"cannot write {what} to {folder}: permission denied")


def _measure(options: BenchOptions, engine: Engine, artifact: Path, name: str, user_texts: list[str] | None,
             console: Console) -> Report:
    info, manifest = engine.info, engine.manifest
    chosen: list[Workload] = []
    for kind in options.workloads:  # not `name`: that is the model's, which the report is titled by
        workload = workloads.build(kind, info.task, user_texts, options.scale, max(options.concurrency))
        if workload is not None:
            chosen.append(workload)
            if kind == "queries" and (batched := workloads.batched_queries(workload, max(options.concurrency))):
                chosen.append(batched)
    references = _references(options, manifest, info) if options.references else []
    cpu = ceiling.cpu_description()
    report = Report(
        model={"name": name, "task": info.task, "precision": info.precision, "target": info.target,
               "execution": info.execution, "max_length": info.max_length, "max_batch_tokens": info.max_batch_tokens,
               "deep_batch_tokens": info.deep_batch_tokens, "artifact": str(artifact),
               "parity": {k: v for k, v in manifest.parity.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}},
        cpu={**cpu, "tier": ceiling.cpu_tier(cpu["flags"])},
        versions=package_versions(_PACKAGES),
        ceilings=[],
        flops_per_token={},
    )

    def ceilings() -> list[ceiling.Ceiling]:
        if not manifest.shape.per_token_weights():  # a static embedding model multiplies no matrices
            return []
        return ceiling.measure(manifest.shape.hidden_size, manifest.shape.intermediate_size, threads=cpu["cores"],
                               flags=cpu["flags"], target=manifest.target)

    report.ceilings = ceilings()
    def runs_per_round(workload: Workload) -> int:
        modes = _modes_for(workload, options.modes)
        runs = len(options.concurrency) * (len(modes) + ("engine" in modes))
        return runs + len(_references_for(workload, references))

    progress = _Progress(console, options.repeat * sum(map(runs_per_round, chosen)))
    with progress, contextlib.ExitStack() as stack:
        server = (stack.enter_context(runners.served(artifact, info.max_batch_tokens, info.deep_batch_tokens))
                  if SERVED_MODES & set(options.modes) and not options.url else None)
        url = options.url or (server.url if server else None)
        server_cpu = server.cpu_seconds if server else None
        for workload in chosen:
            progress.step(f"{workload.name}: warm-up")
            _warm_up(engine, url, server, workload, max(options.concurrency), options.modes)
            raw = (runners.RawBackend(artifact, manifest, workload, info.deep_batch_tokens)  # all of it queued: deep
                   if "engine" in options.modes else None)
            tokens = engine.count_tokens(workload.reference_texts, workload.reference_pairs) if references else 0
            for round_ in range(1, options.repeat + 1):  # everything alternates, so drift hits it all alike
                for concurrency in options.concurrency:
                    for mode in _modes_for(workload, options.modes):
                        label = f"{workload.name}: {mode}, {concurrency} clients, round {round_}"
                        progress.step(label)
                        if mode == "engine":
                            run = runners.run_engine(engine, workload, concurrency, options.duration)
                        elif mode == "grpc":
                            assert server is not None
                            run = runners.run_grpc(server.grpc_target, workload, concurrency, options.duration,
                                                   server.grpc_cpu_seconds)
                        else:
                            assert url is not None
                            run = runners.run_http(url, workload, concurrency, options.duration, server_cpu)
                        report.measurement(workload.name, mode, concurrency).runs.append(run)
                        spent = run.server_cpu_ms_per_request
                        progress.done(label, f"{run.tokens_per_s:.0f} tokens/s"
                                      + (f", server CPU {spent.process:.2f} ms a request" if spent is not None else "")
                                      + (f" ({spent.loop:.2f} ms on its event loop)"
                                         if spent is not None and spent.loop is not None else ""))
                        if raw is not None and mode == "engine":  # right after the engine, so drift hits both alike
                            label = f"{workload.name}: backend alone, after {concurrency} clients, round {round_}"
                            progress.step(label)
                            rate = raw.run(options.duration / 2)
                            report.raw.setdefault(workload.name, {}).setdefault(concurrency, []).append(rate)
                            progress.done(label, f"{rate:.0f} tokens/s")
                # after the engine: torch's idle threads keep spinning for a while
                for reference in _references_for(workload, references):
                    label = f"{workload.name}: sentence-transformers {reference.kind}, round {round_}"
                    progress.step(label)
                    result = reference.run(workload, tokens)
                    report.references.setdefault(workload.name, {}).setdefault(reference.kind, []).append(result)
                    progress.done(label, f"{result.tokens_per_s:.0f} tokens/s")
            mean_row = max(report.measurement(workload.name, options.modes[0], options.concurrency[0]).median.tokens, 1)
            items = max(report.measurement(workload.name, options.modes[0], options.concurrency[0]).median.items, 1)
            report.flops_per_token[workload.name] = flops_per_token(manifest.shape, mean_row / items)
    report.ceilings = ceiling.best(report.ceilings, ceilings())  # measured before and after, the better counts
    report.measurements.sort(key=lambda m: (options.modes.index(m.mode), [w.name for w in chosen].index(m.workload), m.concurrency))
    return report


def _modes_for(workload: Workload, modes: Sequence[str]) -> list[str]:
    """The modes that run this workload: gRPC carries embeddings and reranking only (TEI's API)."""
    return [mode for mode in modes if mode != "grpc" or runners.grpc_answers(workload)]


def _references_for(workload: Workload, references: list[Reference]) -> list[Reference]:
    """The batched queries are the queries' texts: their reference is the queries'."""
    return [] if workload.name == workloads.BATCHED_QUERIES else references


def _warm_up(engine: Engine, url: str | None, server: runners.Server | None, workload: Workload, concurrency: int,
             modes: Sequence[str]) -> None:
    """One whole pass of the workload through each mode, as the backend alone gets over its batches: a runtime
    prepares kernels for each new batch shape on first sight, and a cold first round of OpenVINO int8 MiniLM
    served 0.73x what the same engine served once the shapes were known."""
    runners.run_engine(engine, workload, concurrency, 0)
    if "http" in modes and url is not None:
        runners.run_http(url, workload, concurrency, 0)
    if "grpc" in modes and server is not None and runners.grpc_answers(workload):
        runners.run_grpc(server.grpc_target, workload, concurrency, 0)


def _references(options: BenchOptions, manifest: Manifest, info: EngineInfo) -> list[Reference]:
    source = Path(manifest.source.get("path", ""))
    if not (source / "config.json").is_file() and not (source / "modules.json").is_file():
        raise FileNotFoundError(f"--reference needs the model folder the artifact was compiled from ({source})")
    return [Reference(source, info.task, info.max_length, kind) for kind in options.references]


class _Progress:
    """A progress bar on a terminal; elsewhere (CI logs, pipes) one plain line per measurement."""

    def __init__(self, console: Console, total: int):
        self.console, self.total, self.count = console, total, 0
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                            TimeElapsedColumn(), console=console, transient=True) if console.is_terminal else None

    def __enter__(self) -> "_Progress":
        if self.bar:
            self.bar.__enter__()
            self.task = self.bar.add_task("bench", total=self.total)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.bar:
            self.bar.__exit__(*exc_info)

    def step(self, label: str) -> None:
        if self.bar:
            self.bar.update(self.task, description=label)

    def done(self, label: str, figure: str) -> None:
        self.count += 1
        if self.bar:
            self.bar.advance(self.task)
        else:
            self.console.print(f"[{self.count}/{self.total}] {label}: {figure}", soft_wrap=True)
