"""`--target auto` and `--precision auto` (or `fastest`): which candidates to build, and which one to keep.

Every candidate is built and verified like an explicit one; then each runs the same batches (the probe set,
length-sorted under a 1,024-token budget) on this machine, in alternating rounds so that noise hits them alike (or
one at a time, where together they would not fit in memory: MEMORY_SHARE), and the fastest eligible one becomes the
artifact; where others ran as fast (THROUGHPUT_TIE), the one that answers a lone query much sooner (LONE_GAIN).
Eligible: it passed its own parity check and, where the precision was left to auto, it is fp32 or meets the lossless
tier (parity.LOSSLESS), so bf16 is taken only where it is that good and the CPU computes it natively
(`--precision fastest` holds bf16 to its own tolerance only: the portable way to bf16's speed where a CPU has it,
and fp32 where it does not); and for a long-context model (LONG_ROWS), it is not onnxruntime where OpenVINO built.
int8 is lossy and never chosen unless asked for.
"""

from __future__ import annotations

import gc
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from encoderrt.compile import cpu, openvino, tensorrt
from encoderrt.compile.errors import InputError
from encoderrt.compile.options import TENSORRT_BATCH_TOKENS, CompileOptions
from encoderrt.compile.parity import Probes, artifact_tokenizer, short_of_lossless
from encoderrt.compile.progress import StepReporter
from encoderrt.runtime.backends import STREAMS_ONLY, load_backend
from encoderrt.runtime.backends.base import BackendOptions, Batch, Padder
from encoderrt.runtime.manifest import Manifest
from encoderrt.runtime.throughput import length_sorted_batches, lone_seconds, pass_seconds, real_tokens
from encoderrt.runtime.tokenizer import TextTokenizer, Tokens

PRECISIONS = {**cpu.PRECISIONS, "openvino": openvino.PRECISIONS, "tensorrt": tensorrt.PRECISIONS}
"""What each target can build, as its builder declares it."""
MEASURED_TARGETS = ("cpu", "openvino")
"""What `--target auto` chooses between: the CPU targets, measured here."""
LONG_ROWS = 4096
"""From this model length on, `--target auto` keeps onnxruntime only where OpenVINO is not there: onnxruntime's CPU
attention holds a layer's [heads, S, S] scores for each row whenever the graph has a mask (4 GiB for one
8,192-token row of 16 heads: 5.4 GB resident against transformers' 1.1 GB), while OpenVINO's streams them (1.4x
transformers' peak on a rotary family, 1.1x on XLM-R)."""
ROUNDS = 3
BUDGET = 1024
COPIES = 4
"""The probe rows are repeated so that every stream of a backend has batches to run."""
THROUGHPUT_TIE = 0.05
"""Eligible candidates within this share of the fastest one's throughput ran as fast as it. On a 2-core AVX2 EPYC,
six runs of this measurement put all-MiniLM-L6-v2's fp32 on OpenVINO at 0.965-1.028 of its fp32 on onnxruntime
(a compile kept OpenVINO at 5,976 against 5,963 tokens/s), so the choice fell to noise, while onnxruntime answers a
lone query of 4-13 tokens in 2.6 ms against OpenVINO's 4.8 (medians of 7 alternating rounds)."""
LONE_GAIN = 1.2
"""Of the candidates that ran as fast, one that answers a lone query (LONE_QUERIES, each alone on every core, as an
idle server runs it) at least this much sooner than the fastest is kept instead: that run is most of one client's
latency (3.8 of 4.4 ms on onnxruntime here). A smaller gain is left alone, and a wrong call costs at most
THROUGHPUT_TIE of throughput."""
LONE_QUERIES = 8
"""The shortest probe rows (or pairs), timed as lone queries."""
LONE_FOOTPRINT = 1.5
"""A candidate loaded as a server loads it takes this many times its `footprint`: a third copy of its weights, the
one that runs a lone batch on every core."""
MEMORY_SHARE = 0.5
"""The candidates are measured together (alternating rounds) while their footprints take at most this share of the
free memory; beyond it, one at a time (Qwen3-Embedding-0.6B's configuration: 10.0 GB together, 7.7 GB one at a
time)."""


@dataclass(frozen=True)
class Candidate:
    target: str
    precision: str

    def __str__(self) -> str:
        return f"{self.precision} on {self.target}"


def openvino_installed() -> bool:
    return importlib.util.find_spec("openvino") is not None


def plan(options: CompileOptions) -> list[Candidate]:
    """The candidates to build; an impossible request is an InputError before any work."""
    from encoderrt.runtime.backends.openvino import native_bf16

    target, precision = options.target, options.precision
    if options.layout == "packed" and target != "tensorrt":
        raise InputError(f"--layout packed needs --target tensorrt (its attention is a TensorRT plugin), not {target}")
    if options.max_batch_tokens != TENSORRT_BATCH_TOKENS and target != "tensorrt":  # nothing else would read it
        raise InputError(f"--max-batch-tokens applies to --target tensorrt (its optimisation profiles), not {target}; "
                         "a CPU artifact's batch budget is calibrated when it loads (serve --max-batch-tokens)")
    if options.max_batch_tokens < 1:
        raise InputError(f"--max-batch-tokens must be positive, got {options.max_batch_tokens}")
    if target == "openvino" and not openvino_installed():
        raise InputError("--target openvino needs OpenVINO: pip install openvino")
    targets = [t for t in MEASURED_TARGETS if t != "openvino" or openvino_installed()] if target == "auto" else [target]
    if precision in ("auto", "fastest"):
        if target in ("tensorrt", "cuda"):  # nothing measured: the engine's precision is the user's call
            return [Candidate(target, "bf16" if options.layout == "packed" else "fp32")]
        bf16 = native_bf16()
        return [Candidate(t, p) for t in targets for p in ("fp32", "bf16") if p == "fp32" or (t == "openvino" and bf16)]
    able = [t for t in targets if precision in PRECISIONS[t]]
    if not able:
        runs = "; ".join(f"{t} runs {', '.join(PRECISIONS[t])}" for t in targets)
        where = " or ".join(t for t, allowed in PRECISIONS.items() if precision in allowed)
        missing = "; pip install openvino for it" if precision == "bf16" and not openvino_installed() else ""
        raise InputError(f"--precision {precision} is not available for --target {target} ({runs}); "
                         f"--precision {precision} needs --target {where}{missing}")
    return [Candidate(t, precision) for t in able]


def long_rows_reason(manifest: Manifest) -> str | None:
    """Why an onnxruntime artifact of a long-context model gives way to OpenVINO's (LONG_ROWS), or None."""
    if manifest.max_length < LONG_ROWS:
        return None
    scores = manifest.shape.num_heads * manifest.max_length ** 2 * 4 / 2**30
    return (f"onnxruntime's attention holds {scores:.1f} GiB of scores for one {manifest.max_length}-token row; "
            "OpenVINO's streams them")


def measurement_rows(manifest: Manifest, tokenizer: TextTokenizer, probes: Probes) -> list[Tokens]:
    """The probes as the candidates run them: their pairs for a cross-encoder, their texts otherwise."""
    return tokenizer.encode_pairs(*probes.pairs) if manifest.task == "score" else probes.text_rows(tokenizer)


Built = list[tuple[Candidate, Manifest | None, Path, list[str]]]
"""(candidate, its manifest or None where it failed, its folder, its parity failures)."""


def choose(built: Built, probes: Probes, lossless_only: bool,
           reporter: StepReporter) -> tuple[int, dict[str, Any]]:
    """Measure the candidates that built; returns the index of the one to keep and the record for the manifest.
    `lossless_only`: a candidate other than fp32 is eligible only where it meets the lossless tier (`--precision
    auto`)."""
    ok = [i for i, (_, manifest, _, _) in enumerate(built) if manifest is not None]
    first = built[ok[0]] if ok else None
    rows: list[Tokens] = []
    batches: list[Batch] = []
    if first:
        tokenizer = artifact_tokenizer(first[1], first[2])  # the candidates share their tokenizer
        rows = measurement_rows(first[1], tokenizer, probes)
        batches = length_sorted_batches(rows * COPIES, tokenizer.pad, BUDGET)
    together = sum(footprint(built[i][2]) for i in ok) <= free_memory() * MEMORY_SHARE
    how = f"best of {ROUNDS} alternating rounds" if together else (
        f"best of {ROUNDS} rounds, one candidate at a time: together they would not fit in memory")
    with reporter.step("measure", f"{len(ok)} candidates, {len(batches)} batches, {how}"):
        best, executions = (_alternating if together else _one_at_a_time)(built, ok, batches)
    tokens = real_tokens(batches)
    records, held_back = [], []
    for i, (candidate, manifest, _, failures) in enumerate(built):
        record: dict[str, Any] = {"target": candidate.target, "precision": candidate.precision}
        if manifest is None:
            records.append({**record, "eligible": False, "reason": "; ".join(failures)})
            continue
        figures = {k: v for k, v in manifest.parity.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        lossless = bool(manifest.parity.get("lossless"))
        reason = None
        if candidate.precision != "fp32" and lossless_only and not lossless:
            held_back.append(i)
            reason = ("short of the lossless tier that --precision auto asks for: "
                      f"{'; '.join(short_of_lossless(manifest.task, manifest.parity))}")
        if reason is None and candidate.target == "cpu" and any(c.target == "openvino" for c, m, _, _ in built if m):
            reason = long_rows_reason(manifest)
        records.append({**record, "execution": executions[i], "tokens_per_s": round(tokens / best[i], 1),
                        "parity": figures, "lossless": lossless, "eligible": reason is None, "reason": reason})
    eligible = [i for i in ok if records[i]["eligible"]]
    fastest = max(eligible, key=lambda i: records[i]["tokens_per_s"]) if eligible else -1
    tied = [i for i in eligible
            if records[i]["tokens_per_s"] >= (1 - THROUGHPUT_TIE) * records[fastest]["tokens_per_s"]]
    chosen = fastest
    if len(tied) > 1:
        shortest = sorted(rows, key=lambda row: len(row.ids))[:LONE_QUERIES]
        with reporter.step("measure", f"a lone query on the {len(tied)} candidates that ran as fast"):
            for i, seconds in _lone_query_seconds(built, tied, shortest, tokenizer.pad).items():
                records[i]["lone_query_ms"] = round(seconds * 1e3, 3)
        sooner = min(tied, key=lambda i: records[i]["lone_query_ms"])
        if records[fastest]["lone_query_ms"] >= LONE_GAIN * records[sooner]["lone_query_ms"]:
            chosen = sooner
    for i, record in enumerate(records):
        reporter.note(f"{'chosen' if i == chosen else 'candidate'} {built[i][0]}: {speed(record)}"
                      + (f" ({record['reason']})" if record["reason"] else ""))
    if chosen != fastest:
        gain = records[fastest]["lone_query_ms"] / records[chosen]["lone_query_ms"]
        reporter.note(f"{built[chosen][0]} ran within {THROUGHPUT_TIE:.0%} of {built[fastest][0]}'s throughput and "
                      f"answers a lone query {gain:.1f}x as fast; --target {built[fastest][0].target} --precision "
                      f"{built[fastest][0].precision} builds the other")
    if chosen >= 0 and (faster := _faster_held_back([records[i] for i in held_back], records[chosen])):
        reporter.note(faster)
    rule = (f"fastest here of the candidates that passed parity, or of those within {THROUGHPUT_TIE:.0%} of it the "
            f"one that answers a lone query {LONE_GAIN:g}x as fast") + (
        "; bf16 only where it meets the lossless tier" if lossless_only else "; each at its own precision's tolerance")
    return chosen, {"rule": rule, "measured_tokens": tokens, "batches": len(batches), "measured": how,
                    "candidates": records, "chosen": records[chosen] if chosen >= 0 else None}


def speed(record: dict[str, Any]) -> str:
    """A candidate's measured speed in words, from its record in the manifest."""
    if "tokens_per_s" not in record:
        return "not built"
    lone = f", a lone query {record['lone_query_ms']:.1f} ms" if "lone_query_ms" in record else ""
    return f"{record['tokens_per_s']:.0f} tokens/s{lone}"


def _faster_held_back(held_back: list[dict[str, Any]], chosen: dict[str, Any]) -> str | None:
    """How to take the fastest of the candidates that only the lossless tier kept out, where it beat the chosen one:
    that choice is the user's to make, with the figures in front of them."""
    faster = [r for r in held_back if r["tokens_per_s"] > chosen["tokens_per_s"]]
    if not faster:
        return None
    best = max(faster, key=lambda r: r["tokens_per_s"])
    return (f"{best['precision']} on {best['target']} ran {best['tokens_per_s'] / chosen['tokens_per_s']:.1f}x as "
            f"fast as the chosen {chosen['precision']} on {chosen['target']} and meets its own {best['precision']} "
            f"tolerance; --precision fastest (serve, embed and bench: --compile-precision fastest) takes it where a "
            f"CPU computes {best['precision']} natively (fp32 elsewhere), --target {best['target']} --precision "
            f"{best['precision']} builds it")


def _alternating(built: Built, ok: list[int], batches: list[Batch]) -> tuple[dict[int, float], dict[int, str]]:
    """Every candidate loaded at once and run in turn, so that the machine's drift hits them alike."""
    backends = {i: load_backend(built[i][1], built[i][2], STREAMS_ONLY) for i in ok}
    best = {i: float("inf") for i in ok}
    for _ in range(ROUNDS):
        for i in ok:
            best[i] = min(best[i], pass_seconds(backends[i], batches))
    return best, {i: backend.execution for i, backend in backends.items()}


def _one_at_a_time(built: Built, ok: list[int], batches: list[Batch]) -> tuple[dict[int, float], dict[int, str]]:
    """Each candidate loaded, measured and let go before the next: one candidate's memory at a time."""
    best, executions = {}, {}
    for i in ok:
        backend = load_backend(built[i][1], built[i][2], STREAMS_ONLY)
        best[i] = min(pass_seconds(backend, batches) for _ in range(ROUNDS))
        executions[i] = backend.execution
        del backend
        gc.collect()
    return best, executions


def _lone_query_seconds(built: Built, tied: list[int], rows: list[Tokens], pad: Padder) -> dict[int, float]:
    """Each candidate loaded as a server loads it (with the every-core copy of its weights that runs a lone batch)
    and timed on `rows` as lone queries: all at once in alternating rounds where that fits in memory (LONE_FOOTPRINT),
    else one at a time, each let go before the next (what serving one of them takes)."""
    if sum(LONE_FOOTPRINT * footprint(built[i][2]) for i in tied) <= free_memory() * MEMORY_SHARE:
        backends = [load_backend(built[i][1], built[i][2], BackendOptions()) for i in tied]
        return dict(zip(tied, lone_seconds(backends, rows, pad)))
    seconds = {}
    for i in tied:
        backend = load_backend(built[i][1], built[i][2], BackendOptions())
        seconds[i] = lone_seconds([backend], rows, pad)[0]
        del backend
        gc.collect()
    return seconds


def footprint(folder: Path) -> int:
    """What a candidate takes in memory while measured, about: twice its files (the weights as read, and as its
    runtime prepares them: 1.7-2.1x on a base-sized EuroBERT's three candidates)."""
    return 2 * sum(path.stat().st_size for path in folder.iterdir() if path.is_file())


def free_memory() -> int:
    """Bytes this process can still take: the system's available memory, or less under a cgroup's limit."""
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        meminfo = Path("/proc/meminfo").read_text()
        free = int(next(line.split()[1] for line in meminfo.splitlines() if line.startswith("MemAvailable:"))) * 1024
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            free = min(free, int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, StopIteration, ValueError):
        pass
    return free
