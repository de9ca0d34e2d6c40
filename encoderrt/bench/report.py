"""The bench report: JSON for machines, Markdown for people, PNG plots; and the ratios CI checks."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from encoderrt.bench.ceiling import Ceiling
from encoderrt.bench.runners import ReferenceResult, RunResult


def percentile_ms(latencies: list[float], q: float) -> float:
    return float(np.percentile(latencies, q) * 1000) if latencies else 0.0


@dataclass
class Report:
    model: dict[str, Any]
    cpu: dict[str, Any]
    versions: dict[str, str]
    ceilings: list[Ceiling]
    flops_per_token: dict[str, float]
    """Per workload, at its mean row length."""
    runs: list[RunResult] = field(default_factory=list)
    references: dict[str, ReferenceResult] = field(default_factory=dict)

    def ceiling_for(self, precision: str) -> Ceiling | None:
        return next((c for c in self.ceilings if c.precision == precision), None)

    def row(self, run: RunResult) -> dict[str, Any]:
        reference = self.references.get(run.workload)
        engine = next((r for r in self.runs if r.workload == run.workload and r.mode == "engine"
                       and r.concurrency == run.concurrency), None)
        ceiling = self.ceiling_for(self.model["precision"])
        achieved = run.tokens_per_s * self.flops_per_token.get(run.workload, 0.0) / 1e9
        return {
            "workload": run.workload,
            "mode": run.mode,
            "concurrency": run.concurrency,
            "items": run.items,
            "tokens": run.tokens,
            "seconds": round(run.seconds, 4),
            "tokens_per_s": run.tokens_per_s,
            "items_per_s": run.items_per_s,
            "p50_ms": percentile_ms(run.latencies, 50),
            "p95_ms": percentile_ms(run.latencies, 95),
            "p99_ms": percentile_ms(run.latencies, 99),
            "padding_efficiency": run.padding_efficiency,
            "ratio_to_reference": run.tokens_per_s / reference.tokens_per_s if reference else None,
            "ratio_to_engine": run.tokens_per_s / engine.tokens_per_s if engine and run.mode == "http" else None,
            "achieved_gflops": achieved,
            "ceiling_fraction": achieved / ceiling.gflops if ceiling else None,
        }

    def ratios(self) -> dict[str, float]:
        """The machine-independent figures a baseline holds: speed against the reference and HTTP against engine."""
        ratios = {}
        for run in self.runs:
            row = self.row(run)
            key = f"{run.workload}/{run.mode}/c{run.concurrency}"
            if row["ratio_to_reference"] is not None:
                ratios[f"{key}/vs_reference"] = round(row["ratio_to_reference"], 4)
            if row["ratio_to_engine"] is not None:
                ratios[f"{key}/vs_engine"] = round(row["ratio_to_engine"], 4)
        return ratios

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "cpu": self.cpu,
            "versions": self.versions,
            "ceilings": [asdict(c) for c in self.ceilings],
            "flops_per_token": self.flops_per_token,
            "references": {k: {**asdict(v), "tokens_per_s": v.tokens_per_s, "items_per_s": v.items_per_s}
                           for k, v in self.references.items()},
            "results": [self.row(run) for run in self.runs],
            "ratios": self.ratios(),
        }

    def markdown(self) -> str:
        def fmt(value: Any, digits: int = 2) -> str:
            return "–" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)

        m = self.model
        lines = [
            f"# encoderrt bench: {m['name']} ({m['task']}, {m['precision']} on {m['target']})",
            "",
            f"CPU: {self.cpu['model']}, {self.cpu['cores']} cores, {', '.join(self.cpu['flags'])}. "
            + "GEMM ceilings: " + ", ".join(f"{c.precision} {c.gflops:.0f} GFLOP/s ({c.kernel})" for c in self.ceilings) + ".",
            f"Parity (from the manifest): {', '.join(f'{k} {fmt(v, 6)}' for k, v in m['parity'].items())}.",
            "",
            "| workload | mode | concurrency | tokens/s | items/s | p50 ms | p95 ms | p99 ms | padding eff. | × reference | × engine | of ceiling |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for run in self.runs:
            r = self.row(run)
            lines.append(
                f"| {r['workload']} | {r['mode']} | {r['concurrency']} | {r['tokens_per_s']:.0f} | {r['items_per_s']:.1f} | "
                f"{r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['p99_ms']:.1f} | {fmt(r['padding_efficiency'], 3)} | "
                f"{fmt(r['ratio_to_reference'])} | {fmt(r['ratio_to_engine'])} | "
                f"{fmt(None if r['ceiling_fraction'] is None else r['ceiling_fraction'] * 100, 0)}{'%' if r['ceiling_fraction'] else ''} |")
        if self.references:
            lines += ["", "Reference (same inputs): " + "; ".join(
                f"{k}: {v.name}, {v.tokens_per_s:.0f} tokens/s, {v.items_per_s:.1f} items/s" for k, v in self.references.items())]
        return "\n".join(lines) + "\n"

    def write(self, folder: Path) -> list[Path]:
        folder.mkdir(parents=True, exist_ok=True)
        written = [folder / "report.json", folder / "report.md"]
        written[0].write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
        written[1].write_text(self.markdown(), encoding="utf-8")
        written += self._plots(folder)
        return written

    def _plots(self, folder: Path) -> list[Path]:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        written = []
        figure, axis = plt.subplots(figsize=(7, 4))
        for (workload, mode) in sorted({(r.workload, r.mode) for r in self.runs}):
            runs = sorted((r for r in self.runs if r.workload == workload and r.mode == mode), key=lambda r: r.concurrency)
            axis.plot([r.concurrency for r in runs], [r.tokens_per_s for r in runs], marker="o", label=f"{workload} ({mode})")
        for workload, reference in self.references.items():
            axis.axhline(reference.tokens_per_s, linestyle="--", linewidth=1, color="grey")
            axis.annotate(f"reference {workload}", (axis.get_xlim()[0], reference.tokens_per_s), fontsize=7, color="grey")
        axis.set(xlabel="concurrent clients", ylabel="tokens / s", title=f"{self.model['name']}: throughput")
        axis.set_xscale("log", base=2)
        axis.legend(fontsize=8)
        figure.tight_layout()
        written.append(folder / "throughput.png")
        figure.savefig(written[-1], dpi=110)
        plt.close(figure)

        figure, axis = plt.subplots(figsize=(7, 4))
        for run in self.runs:
            if run.latencies:
                values = np.sort(np.asarray(run.latencies) * 1000)
                axis.plot(values, np.linspace(0, 1, len(values)), label=f"{run.workload} {run.mode} c={run.concurrency}")
        axis.set(xlabel="latency (ms)", ylabel="fraction of requests", title="latency distribution")
        axis.set_xscale("log")
        axis.legend(fontsize=7)
        figure.tight_layout()
        written.append(folder / "latency.png")
        figure.savefig(written[-1], dpi=110)
        plt.close(figure)
        return written
