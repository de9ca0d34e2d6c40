"""`encoderrt bench`: run the workloads, write the report, check or write a baseline."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from encoderrt.bench import baseline as baselines
from encoderrt.bench import ceiling, runners, workloads
from encoderrt.bench.flops import flops_per_token
from encoderrt.bench.report import Report
from encoderrt.compile.cache import artifact_for
from encoderrt.runtime import Engine
from encoderrt.versions import package_versions

_PACKAGES = ("encoderrt", "onnxruntime", "tokenizers", "numpy", "torch", "sentence-transformers", "transformers")


@dataclass(frozen=True)
class BenchOptions:
    target: Path | None = None
    """Artifact or model folder; None: the bundled all-MiniLM-L6-v2."""
    workloads: tuple[str, ...] = workloads.WORKLOADS
    modes: tuple[str, ...] = ("engine",)
    concurrency: tuple[int, ...] = (1, 8, 32)
    duration: float = 10.0
    reference: bool = False
    out: Path | None = None
    check: Path | None = None
    tolerance: float = 0.15
    write_baseline: Path | None = None
    texts_file: Path | None = None
    max_batch_tokens: int | None = None
    scale: float = 1.0
    """Workload size factor (1.0: 512 queries, 256 passages, 12 rerank lists)."""
    repeat: int = 1
    """Runs of each measurement; the best one counts (noise on a shared machine only ever slows a run down)."""


def run_bench(options: BenchOptions, console: Console | None = None) -> int:
    console = console or Console(stderr=True, highlight=False)
    baseline = baselines.read_baseline(options.check) if options.check else None  # fail early on a bad file
    user_texts = workloads.read_texts(options.texts_file) if options.texts_file else None
    artifact, name = artifact_for(options.target)
    engine = Engine.load(artifact, max_batch_tokens=options.max_batch_tokens)
    try:
        report = _measure(options, engine, artifact, name or engine.info.name, user_texts, console)
    finally:
        engine.close()

    out = options.out or Path("bench-report")
    for path in report.write(out):
        console.print(f"wrote {path}")
    print(report.markdown())
    status = 0
    if baseline is not None:
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
                                 f"{report.model['name']} {report.model['precision']}; {report.cpu['model']}")
        console.print(f"wrote baseline {options.write_baseline}")
    return status


def _measure(options: BenchOptions, engine: Engine, artifact: Path, name: str, user_texts: list[str] | None,
             console: Console) -> Report:
    info, manifest = engine.info, engine.manifest
    chosen = [w for w in (workloads.build(n, info.task, user_texts, options.scale, max(options.concurrency))
                          for n in options.workloads) if w]
    reference = None
    if options.reference:
        source = Path(manifest.source.get("path", ""))
        if not (source / "config.json").is_file() and not (source / "modules.json").is_file():
            raise FileNotFoundError(f"--reference needs the model folder the artifact was compiled from ({source})")
        reference = runners.Reference(source, info.task, info.max_length)
    cpu = ceiling.cpu_description()
    report = Report(
        model={"name": name, "task": info.task, "precision": info.precision, "target": info.target,
               "max_length": info.max_length, "max_batch_tokens": info.max_batch_tokens, "artifact": str(artifact),
               "parity": {k: v for k, v in manifest.parity.items() if isinstance(v, (int, float))}},
        cpu=cpu,
        versions=package_versions(_PACKAGES),
        ceilings=ceiling.measure(manifest.shape.hidden_size, manifest.shape.intermediate_size, threads=cpu["cores"],
                                 flags=cpu["flags"]),
        flops_per_token={},
    )
    steps = len(chosen) * (len(options.concurrency) * len(options.modes) * options.repeat + (1 if reference else 0))
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeElapsedColumn(), console=console, transient=True)
    with progress, contextlib.ExitStack() as stack:
        url = stack.enter_context(runners.served(artifact, info.max_batch_tokens)) if "http" in options.modes else None
        task = progress.add_task("bench", total=steps)
        for workload in chosen:
            progress.update(task, description=f"{workload.name}: warm-up")
            engine.run(workload.requests[0])
            for concurrency in options.concurrency:
                best: dict[str, runners.RunResult] = {}
                for round_ in range(options.repeat):  # engine and HTTP alternate, so drift hits both alike
                    for mode in options.modes:
                        progress.update(task, description=f"{workload.name}: {mode}, {concurrency} clients, round {round_ + 1}")
                        if mode == "engine":
                            run = runners.run_engine(engine, workload, concurrency, options.duration)
                        else:
                            assert url is not None
                            run = runners.run_http(url, workload, concurrency, options.duration)
                        if mode not in best or run.tokens_per_s > best[mode].tokens_per_s:
                            best[mode] = run
                        progress.advance(task)
                for mode in options.modes:
                    report.runs.append(best[mode])
                    report.flops_per_token.setdefault(
                        workload.name, flops_per_token(manifest.shape, best[mode].tokens / max(best[mode].items, 1)))
            if reference:  # after the engine: torch's idle threads keep spinning for a while after a run
                progress.update(task, description=f"{workload.name}: reference")
                tokens = engine.count_tokens(workload.reference_texts, workload.reference_pairs)
                report.references[workload.name] = reference.run(workload, tokens, repeats=max(2, options.repeat))
                progress.advance(task)
    report.runs.sort(key=lambda r: (options.modes.index(r.mode), [w.name for w in chosen].index(r.workload), r.concurrency))
    return report
