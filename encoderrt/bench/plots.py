"""The report's plots: throughput against clients, and latency distributions.

They take plain series (the report builds them), so this module knows nothing of the report. The clients axis is
labelled with the levels that ran (1, 8, 32), and the legends sit outside the axes so that they never hide a curve.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

MISSING = "no plots: matplotlib is not installed (pip install 'encoderrt[bench]')"


def available() -> bool:
    """matplotlib is the `bench` extra's, so that a serving install (a container) does not carry it."""
    return importlib.util.find_spec("matplotlib") is not None


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _legend_outside(axis) -> None:
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False)


def plot_throughput(title: str, curves: Mapping[str, Sequence[tuple[int, float]]], references: Mapping[str, float],
                    path: Path) -> None:
    """`curves`: label -> (clients, tokens/s) points; `references`: label -> tokens/s, drawn as dashed lines."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(8.5, 4))
    levels = sorted({clients for points in curves.values() for clients, _ in points})
    for label, points in curves.items():
        ordered = sorted(points)
        axis.plot([c for c, _ in ordered], [rate for _, rate in ordered], marker="o", label=label)
    for index, (label, rate) in enumerate(references.items()):
        axis.axhline(rate, linestyle="--", linewidth=1, color=("grey", "silver")[index % 2], label=label)
    axis.set(xlabel="concurrent clients", ylabel="tokens / s", title=f"{title}: throughput")
    axis.set_xscale("log", base=2)
    axis.set_xticks(levels, [str(level) for level in levels])
    axis.minorticks_off()
    _legend_outside(axis)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_latency(latencies: Mapping[str, Sequence[float]], path: Path) -> None:
    """`latencies`: label -> one round's request latencies in seconds, drawn as distributions."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(8.5, 4))
    for label, seconds in latencies.items():
        if len(seconds):
            values = np.sort(np.asarray(seconds) * 1000)
            axis.plot(values, np.linspace(0, 1, len(values)), label=label)
    axis.set(xlabel="latency (ms)", ylabel="fraction of requests", title="latency distribution (median round)")
    axis.set_xscale("log")
    _legend_outside(axis)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
