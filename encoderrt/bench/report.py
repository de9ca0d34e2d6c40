"""The bench report: JSON for machines, Markdown for people, PNG plots; and the ratios CI checks.

Every measurement is repeated in rounds that alternate engine, HTTP, the backend alone and the
references, so drift on a shared machine hits them alike. A figure is the median over rounds:
tokens/s of the median run, and each ratio the median of the per-round ratios (a ratio within one
round compares runs seconds apart, which is what travels between machines).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from encoderrt.bench import plots
from encoderrt.bench.ceiling import Ceiling
from encoderrt.bench.references import ReferenceResult
from encoderrt.bench.runners import RunResult
from encoderrt.bench.workloads import BATCHED_QUERIES


def percentile_ms(latencies: list[float], q: float) -> float:
    return float(np.percentile(latencies, q) * 1000) if latencies else 0.0


def _median_ratio(numerators: list[float], denominators: list[float]) -> float | None:
    pairs = [(n, d) for n, d in zip(numerators, denominators) if d]
    return statistics.median(n / d for n, d in pairs) if pairs else None


@dataclass
class Measurement:
    """One (workload, mode, concurrency): a run per round."""

    workload: str
    mode: str
    concurrency: int
    runs: list[RunResult] = field(default_factory=list)

    @property
    def median(self) -> RunResult:
        return sorted(self.runs, key=lambda r: r.tokens_per_s)[(len(self.runs) - 1) // 2]

    @property
    def rates(self) -> list[float]:
        return [r.tokens_per_s for r in self.runs]

    def server_cpu_ms_per_request(self, part: str) -> float | None:
        """The median over rounds of the server's CPU per request, the process's or its event loop's (`part`: in a
        gRPC run, the gRPC server's thread), in runs of a server the bench started."""
        figures = [getattr(r.server_cpu_ms_per_request, part) for r in self.runs if r.server_cpu_s is not None]
        figures = [figure for figure in figures if figure is not None]  # a loop's figure where the server gave it
        return statistics.median(figures) if figures else None

    def bench_cpu_ms_per_request(self) -> float | None:
        """The median over rounds of the bench process's CPU per request (RunResult.bench_cpu_s)."""
        figures = [r.bench_cpu_ms_per_request for r in self.runs if r.bench_cpu_ms_per_request is not None]
        return statistics.median(figures) if figures else None

    def cores_busy(self) -> float | None:
        """The median over rounds of the bench process's CPU seconds per second: cores kept busy."""
        figures = [r.bench_cpu_s / r.seconds for r in self.runs if r.bench_cpu_s is not None and r.seconds]
        return statistics.median(figures) if figures else None


@dataclass
class Report:
    model: dict[str, Any]
    cpu: dict[str, Any]
    versions: dict[str, str]
    ceilings: list[Ceiling]
    flops_per_token: dict[str, float]
    """Per workload, at its mean row length."""
    measurements: list[Measurement] = field(default_factory=list)
    references: dict[str, dict[str, list[ReferenceResult]]] = field(default_factory=dict)
    """workload -> reference kind -> one pass per round; "torch" (sentence-transformers fp32) is the reference."""
    raw: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    """workload -> clients -> the backend alone, tokens/s, measured right after each engine run (one per round)."""

    def measurement(self, workload: str, mode: str, concurrency: int) -> Measurement:
        found = next((m for m in self.measurements if (m.workload, m.mode, m.concurrency) == (workload, mode, concurrency)), None)
        if found is None:
            found = Measurement(workload, mode, concurrency)
            self.measurements.append(found)
        return found

    def ceiling_for(self, precision: str) -> Ceiling | None:
        return next((c for c in self.ceilings if c.precision == precision), None)

    def row(self, m: Measurement) -> dict[str, Any]:
        run = m.median
        # the batched queries are the queries' texts: the queries' reference passes are theirs too
        references = self.references.get("queries" if m.workload == BATCHED_QUERIES else m.workload, {})
        engine = self._engine_for(m)
        ceiling = self.ceiling_for(self.model["precision"])
        achieved = run.tokens_per_s * self.flops_per_token.get(m.workload, 0.0) / 1e9
        vs = {kind: _median_ratio(m.rates, [r.tokens_per_s for r in passes]) for kind, passes in references.items()}
        return {
            "workload": m.workload, "mode": m.mode, "concurrency": m.concurrency, "rounds": len(m.runs),
            "items": run.items, "tokens": run.tokens, "seconds": round(run.seconds, 4),
            "tokens_per_s": run.tokens_per_s, "items_per_s": run.items_per_s,
            "p50_ms": percentile_ms(run.latencies, 50), "p95_ms": percentile_ms(run.latencies, 95),
            "p99_ms": percentile_ms(run.latencies, 99), "padding_efficiency": run.padding_efficiency,
            "requests": run.requests, "server_cpu_ms_per_request": m.server_cpu_ms_per_request("process"),
            "server_loop_cpu_ms_per_request": m.server_cpu_ms_per_request("loop"),
            "bench_cpu_ms_per_request": m.bench_cpu_ms_per_request(), "client_bound": self.client_bound(m),
            "ratio_to_reference": vs.get("torch"),
            "ratios_to_references": vs,
            "ratio_to_engine": _median_ratio(m.rates, engine.rates) if engine and m.mode != "engine" else None,
            "ratio_to_http": self._ratio_to_http(m),
            "ratio_to_batched": self._ratio_to_batched(m),
            "engine_efficiency": _median_ratio(m.rates, self.raw.get(m.workload, {}).get(m.concurrency, []))
            if m.mode == "engine" else None,
            "cached_share": run.cached_share,
            "achieved_gflops": achieved,
            "ceiling_fraction": achieved / ceiling.gflops if ceiling else None,
        }

    def _ratio_to_batched(self, m: Measurement) -> float | None:
        """One-text queries against the same texts in batched requests, same mode and clients (tokens/s)."""
        if m.workload != "queries":
            return None
        batched = next((b for b in self.measurements
                        if (b.workload, b.mode, b.concurrency) == (BATCHED_QUERIES, m.mode, m.concurrency)), None)
        return _median_ratio(m.rates, batched.rates) if batched else None

    def client_bound(self, m: Measurement) -> float | None:
        """What an HTTP or gRPC run can reach against the engine when its clients share the engine's cores and the
        engine run kept them all busy: the engine's CPU a request (its callers' included, a few percent) over that
        plus the clients' CPU a request. A server adds its own cost on top, so its ratio to the engine stays below
        this; a client on another machine takes nothing from the server's cores."""
        engine = self._engine_for(m)
        if m.mode == "engine" or engine is None:
            return None
        clients, own = m.bench_cpu_ms_per_request(), engine.bench_cpu_ms_per_request()
        return own / (own + clients) if own and clients is not None else None

    def _engine_for(self, m: Measurement) -> Measurement | None:
        """The engine's measurement at m's workload and clients (m itself for an engine run)."""
        return next((e for e in self.measurements
                     if (e.workload, e.mode, e.concurrency) == (m.workload, "engine", m.concurrency)), None)

    def _ratio_to_http(self, m: Measurement) -> float | None:
        """A gRPC run against HTTP's at the same workload and clients (requests in flight), tokens/s."""
        if m.mode != "grpc":
            return None
        http = next((h for h in self.measurements
                     if (h.workload, h.mode, h.concurrency) == (m.workload, "http", m.concurrency)), None)
        return _median_ratio(m.rates, http.rates) if http else None

    def backend_alone(self, workload: str) -> float | None:
        rates = [rate for per_round in self.raw.get(workload, {}).values() for rate in per_round]
        return statistics.median(rates) if rates else None

    def backend_ceiling_fraction(self, workload: str) -> float | None:
        ceiling, rate = self.ceiling_for(self.model["precision"]), self.backend_alone(workload)
        if not ceiling or not rate:
            return None
        return rate * self.flops_per_token.get(workload, 0.0) / 1e9 / ceiling.gflops

    def ratios(self) -> dict[str, float]:
        """The machine-independent figures a baseline holds: speed against the references, HTTP against engine,
        the engine against its backend alone."""
        ratios = {}
        for m in self.measurements:
            row, key = self.row(m), f"{m.workload}/{m.mode}/c{m.concurrency}"
            for kind, value in row["ratios_to_references"].items():
                if value is not None:
                    ratios[f"{key}/vs_reference" if kind == "torch" else f"{key}/vs_{kind}"] = round(value, 4)
            for name, value in (("vs_engine", row["ratio_to_engine"]), ("vs_backend", row["engine_efficiency"]),
                                ("vs_batched", row["ratio_to_batched"]), ("vs_http", row["ratio_to_http"])):
                if value is not None:
                    ratios[f"{key}/{name}"] = round(value, 4)
        return ratios

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model, "cpu": self.cpu, "versions": self.versions,
            "ceilings": [asdict(c) for c in self.ceilings],
            "flops_per_token": self.flops_per_token,
            "references": {w: {k: [{**asdict(p), "tokens_per_s": p.tokens_per_s} for p in passes] for k, passes in kinds.items()}
                           for w, kinds in self.references.items()},
            "backend_alone": {w: {"tokens_per_s": {str(c): rates for c, rates in by_clients.items()},
                                  "median_tokens_per_s": self.backend_alone(w), "ceiling_fraction": self.backend_ceiling_fraction(w)}
                              for w, by_clients in self.raw.items()},
            "results": [self.row(m) for m in self.measurements],
            "ratios": self.ratios(),
        }

    def markdown(self) -> str:
        def fmt(value: Any, digits: int = 2) -> str:
            return "–" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)

        m, kinds = self.model, sorted({k for ks in self.references.values() for k in ks}, key=lambda k: (k != "torch", k))
        lines = [
            f"# encoderrt bench: {m['name']} ({m['task']}, {m['precision']} on {m['target']})",
            "",
            f"CPU: {self.cpu['model']}, {self.cpu['cores']} cores, {', '.join(self.cpu['flags'])}. Runs: {m.get('execution', '')}. "
            + ("GEMM ceilings: " + ", ".join(f"{c.precision} {c.gflops:.0f} GFLOP/s ({c.kernel})"
                                             for c in self.ceilings) + "."
               if self.ceilings else "No GEMM ceiling: the model multiplies no matrices."),
            f"Parity (from the manifest): {', '.join(f'{k} {fmt(v, 6)}' for k, v in m['parity'].items())}.",
            "Figures are medians over alternating rounds.",
            "",
            "| workload | mode | clients | tokens/s | items/s | p50 ms | p95 ms | p99 ms | padding eff. | "
            + " | ".join(f"× {k}" for k in kinds) + (" | " if kinds else "")
            + "× engine | engine eff. | of ceiling | server CPU ms/request | of it, event loop |",
            "|---|---|---|---|---|---|---|---|---|" + "---|" * (len(kinds) + 5),
        ]
        rows = [(measurement, self.row(measurement)) for measurement in self.measurements]
        for _, r in rows:
            ceiling = fmt(None if r["ceiling_fraction"] is None else r["ceiling_fraction"] * 100, 0)
            ceiling += "%" if r["ceiling_fraction"] else ""
            lines.append(
                f"| {r['workload']} | {r['mode']} | {r['concurrency']} | {r['tokens_per_s']:.0f} | {r['items_per_s']:.1f} | "
                f"{r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['p99_ms']:.1f} | {fmt(r['padding_efficiency'], 3)} | "
                + "".join(f"{fmt(r['ratios_to_references'].get(k))} | " for k in kinds)
                + f"{fmt(r['ratio_to_engine'])} | {fmt(r['engine_efficiency'])} | {ceiling} | "
                  f"{fmt(r['server_cpu_ms_per_request'])} | {fmt(r['server_loop_cpu_ms_per_request'])} |")
        batched = [(r["mode"], r["concurrency"], r["ratio_to_batched"]) for _, r in rows
                   if r["ratio_to_batched"] is not None]
        if batched:
            lines += ["", "One-text queries against the same texts in batched requests (tokens/s): " + ", ".join(
                f"{mode} at {clients} client{'s' * (clients != 1)} {ratio:.2f}×" for mode, clients, ratio in batched)]
        over_http = [(r["workload"], r["concurrency"], r["ratio_to_http"]) for _, r in rows
                     if r["ratio_to_http"] is not None]
        if over_http:
            lines += ["", "gRPC streams against HTTP requests, as many in flight (tokens/s): " + ", ".join(
                f"{workload} at {clients} {ratio:.2f}×" for workload, clients, ratio in over_http)]
        cached = [r for _, r in rows if r["cached_share"]]
        if cached:
            lines += ["", "The server answered some of these items from its result cache (--result-cache-mb), without "
                      "running them: the bench repeats its texts, so those figures measure the cache, not the model: "
                      + ", ".join(f"{r['workload']} {r['mode']} at {r['concurrency']} {r['cached_share'] * 100:.0f}%"
                                  for r in cached) + "."]
        bounds = [(run, r) for run, r in rows if r["client_bound"] is not None]
        if bounds:
            lines += ["", "The load's clients run on the cores they measure: what they take, against the engine's CPU "
                      "in process (its callers' included), bounds a server's ratio to the engine on these cores even "
                      "if the server cost nothing itself (a bound where the engine run kept every core busy).", "",
                      "| workload | mode | clients | clients' CPU ms/request | engine's CPU ms/request | cores busy in "
                      "the engine run | at most × engine |", "|---|---|---|---|---|---|---|"]
            for run, r in bounds:
                engine = self._engine_for(run)
                assert engine is not None  # a bound is computed against it
                lines.append(f"| {r['workload']} | {r['mode']} | {r['concurrency']} | "
                             f"{r['bench_cpu_ms_per_request']:.3f} | {engine.bench_cpu_ms_per_request():.3f} | "
                             f"{engine.cores_busy():.2f} of "
                             f"{self.cpu['cores']} | {r['client_bound']:.2f} |")
        for workload in self.raw:
            share = self.backend_ceiling_fraction(workload)
            lines += ["", f"Backend alone, {workload}: {self.backend_alone(workload):.0f} tokens/s"
                      + (f", {share * 100:.0f}% of the {m['precision']} ceiling" if share else "")]
        for workload, passes in self.references.items():
            lines += ["", f"References, {workload} (same inputs): " + "; ".join(
                f"{p[0].name}: {statistics.median(x.tokens_per_s for x in p):.0f} tokens/s" for p in passes.values())]
        return "\n".join(lines) + "\n"

    def write(self, folder: Path) -> list[Path]:
        folder.mkdir(parents=True, exist_ok=True)
        written = [folder / "report.json", folder / "report.md", folder / "throughput.png", folder / "latency.png"]
        written[0].write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
        written[1].write_text(self.markdown(), encoding="utf-8")
        if not plots.available():
            return written[:2]
        curves: dict[str, list[tuple[int, float]]] = {}
        for m in self.measurements:
            curves.setdefault(f"{m.workload} ({m.mode})", []).append((m.concurrency, m.median.tokens_per_s))
        references = {f"{workload}: sentence-transformers {kind}": statistics.median(p.tokens_per_s for p in passes)
                      for workload, kinds in self.references.items() for kind, passes in kinds.items()}
        plots.plot_throughput(self.model["name"], dict(sorted(curves.items())), references, written[2])
        plots.plot_latency({f"{m.workload} {m.mode}, {m.concurrency} clients": m.median.latencies for m in self.measurements},
                     written[3])
        return written
