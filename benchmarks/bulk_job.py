"""The bulk job against the backend alone and against `encoderrt serve` with 32 HTTP clients, on the same corpus,
in alternating rounds of one process (ratios, not times, travel between machines).

    python benchmarks/bulk_job.py [--artifact DIR] [--rows 20000] [--rounds 3]

Prints tokens/s of each and the two ratios issue 34 sets goals for (job / backend alone >= 0.95, job / best HTTP
>= 1.1). `--memory` instead runs the job alone at 10k and --rows short rows and prints the peak RSS of each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from encoderrt import Engine
from encoderrt.bench.runners import RawBackend, run_http, served
from encoderrt.bench.workloads import Workload, passages, queries
from encoderrt.compile.cache import artifact_for
from encoderrt.jobs import embed_corpus
from encoderrt.jobs.job import JobSettings, load_engine
from encoderrt.runtime.manifest import read_manifest
from encoderrt.runtime.tasks import EmbedRequest


def write_corpus(path: Path, texts: list[str]) -> None:
    with path.open("w", encoding="utf-8") as file:
        for number, text in enumerate(texts):
            file.write(json.dumps({"id": f"doc-{number}", "text": text}) + "\n")


def throughput(args: argparse.Namespace) -> None:
    """The job calibrates its budget for throughput, `encoderrt serve` for latency: the backend alone and the server
    are measured at both budgets, and the job is held against the better of each."""
    artifact = Path(args.artifact) if args.artifact else artifact_for(None)[0]
    texts = passages(args.rows)
    work = Path(tempfile.mkdtemp())
    corpus = work / "corpus.jsonl"
    write_corpus(corpus, texts)
    engine, _ = load_engine(artifact, JobSettings())
    with Engine.load(artifact) as serving:  # (budget, budget while the queue is deep)
        budgets = {"job's": (engine.info.max_batch_tokens, engine.info.deep_batch_tokens),
                   "serve's": (serving.info.max_batch_tokens, serving.info.deep_batch_tokens)}
    print(f"artifact {artifact} ({engine.info.target} {engine.info.precision}), {args.rows} passages, budgets: "
          + ", ".join(f"{name} {budget} tokens ({deep} deep)" for name, (budget, deep) in budgets.items()), flush=True)
    if budgets["serve's"] == budgets["job's"]:
        del budgets["serve's"]
    raws = {name: RawBackend(artifact, read_manifest(artifact), Workload("corpus", [], texts, []), deep)
            for name, (_, deep) in budgets.items()}
    chunks = [EmbedRequest(texts[i: i + 16]) for i in range(0, len(texts), 16)]
    rates: dict[str, list[float]] = {f"backend alone at {n} budget": [] for n in budgets} | {"job": []} | {
        f"http x32 at {n} budget": [] for n in budgets}
    with ExitStack() as stack:
        servers = {name: stack.enter_context(served(artifact, *pair)) for name, pair in budgets.items()}
        for server in servers.values():
            run_http(server.url, Workload("passages", chunks[:64], [], []), 32, 2.0)  # warm-up
        for round_ in range(args.rounds):
            for name, raw in raws.items():
                rates[f"backend alone at {name} budget"].append(raw.run(args.seconds))
            summary = embed_corpus(corpus, work / f"out-{round_}", engine=engine, id_field="id")
            rates["job"].append(summary.tokens_per_second)
            for name, server in servers.items():
                rates[f"http x32 at {name} budget"].append(
                    run_http(server.url, Workload("passages", chunks, [], []), 32, args.seconds).tokens_per_s)
            print(f"round {round_}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rates.items()), flush=True)
    engine.close()
    median = {k: statistics.median(v) for k, v in rates.items()}
    print("median tokens/s: " + ", ".join(f"{k} {v:,.0f}" for k, v in median.items()))
    alone = max(v for k, v in median.items() if k.startswith("backend alone"))
    http = max(max(v) for k, v in rates.items() if k.startswith("http"))
    print(f"job / backend alone (the faster budget): {median['job'] / alone:.3f}  (goal >= 0.95)")
    print(f"job / best HTTP x32 round: {median['job'] / http:.3f}  (goal >= 1.1)")


def memory(args: argparse.Namespace) -> None:
    """Peak RSS of the job, in a fresh process for each size, on short rows."""
    work = Path(tempfile.mkdtemp())
    for rows in (10_000, args.rows):
        corpus = work / f"short-{rows}.jsonl"
        write_corpus(corpus, queries(rows))
        code = ("import resource, sys, encoderrt; "
                f"s = encoderrt.embed_corpus({str(corpus)!r}, {str(work / f'out-{rows}')!r}, "
                f"{args.artifact!r}); "
                "print(s.rows, round(s.seconds, 1), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)")
        started = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
        print(f"{int(out[0]):,} rows in {float(out[1])} s (wall {time.perf_counter() - started:.0f} s): "
              f"peak RSS {out[2]} MB", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifact", help="an artifact folder (default: the bundled model's, compiled once)")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="each backend-alone and HTTP measurement")
    parser.add_argument("--memory", action="store_true")
    arguments = parser.parse_args()
    memory(arguments) if arguments.memory else throughput(arguments)
