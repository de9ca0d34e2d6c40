"""The report's plots: throughput against clients, and latency distributions.

The clients axis is labelled with the levels that ran (1, 8, 32), and the legends sit outside the
axes so that they never hide a curve.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from encoderrt.bench.report import Report


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _legend_outside(axis) -> None:
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False)


def plot_throughput(report: "Report", path: Path) -> None:
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(8.5, 4))
    levels = sorted({m.concurrency for m in report.measurements})
    for workload, mode in sorted({(m.workload, m.mode) for m in report.measurements}):
        points = sorted((m for m in report.measurements if (m.workload, m.mode) == (workload, mode)), key=lambda m: m.concurrency)
        axis.plot([m.concurrency for m in points], [m.median.tokens_per_s for m in points], marker="o", label=f"{workload} ({mode})")
    for workload, kinds in report.references.items():
        for kind, passes in kinds.items():
            rate = statistics.median(p.tokens_per_s for p in passes)
            axis.axhline(rate, linestyle="--", linewidth=1, color="grey" if kind == "torch" else "silver",
                         label=f"{workload}: sentence-transformers {kind}")
    axis.set(xlabel="concurrent clients", ylabel="tokens / s", title=f"{report.model['name']}: throughput")
    axis.set_xscale("log", base=2)
    axis.set_xticks(levels, [str(level) for level in levels])
    axis.minorticks_off()
    _legend_outside(axis)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_latency(report: "Report", path: Path) -> None:
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(8.5, 4))
    for m in report.measurements:
        run = m.median
        if run.latencies:
            values = np.sort(np.asarray(run.latencies) * 1000)
            axis.plot(values, np.linspace(0, 1, len(values)), label=f"{m.workload} {m.mode}, {m.concurrency} clients")
    axis.set(xlabel="latency (ms)", ylabel="fraction of requests", title="latency distribution (median round)")
    axis.set_xscale("log")
    _legend_outside(axis)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
