"""What the server's own Python costs a one-query request, without the model, the sockets or uvicorn: the app is
called in process as uvicorn calls it, with every answer taken from the result cache, against the engine's own
`aembed` of the same query (what a caller in process pays), in alternating rounds of one process (issue 35's front
end: the server's cost over the engine's).

    python benchmarks/front_end.py [--artifact DIR] [--requests 200] [--rounds 40] [--profile 25]
                                   [--check BASELINE.json [--tolerance 0.15]] [--write-baseline BASELINE.json]

Prints microseconds a request for each route, the engine's call and a bare ASGI app's (what calling any app costs
here), and each route's speed against the engine's call (`front_end/ROUTE/vs_engine`: the engine's time over the
route's, as the bench's HTTP-against-engine ratios read; the ratio travels between machines, the times do not).
`--check` holds those ratios to a baseline as `encoderrt bench --check` does (bench/baseline.py: a floor for every
CPU, or this CPU tier's record), and CI runs it: sending the dialects' routes back through FastAPI's whole stack
took them from 2.5-2.9x the engine's call to 3.5-4.2x, which the bench's own HTTP figures under load barely show
(0.85 -> 0.82x the engine at 32 clients, within their noise). `--profile N` adds cProfile's N costliest functions
for the first route. The rounds are short and many because this VM's speed drifts within seconds: 7 rounds of
2,000 requests measured /embed at 0.27-0.42 in three runs within ten minutes, 40 rounds of 200 at 0.37-0.42
in six (2-core AVX2 EPYC). The start-up heap is frozen as `encoderrt serve` freezes it. Under a real load the event
loop costs more than this (the model's threads take the caches and the cores), but what is cut here is cut there.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import statistics
import time
from pathlib import Path
from typing import Any

from encoderrt import Engine
from encoderrt.bench import baseline as baselines
from encoderrt.bench.ceiling import cpu_description, cpu_tier
from encoderrt.compile.cache import artifact_for
from encoderrt.runtime.heap import freeze_startup_heap
from encoderrt.server import ServerSettings, create_app
from encoderrt.server.connections import BODY_IN, CLIENT_GONE, ClientGone
from encoderrt.server.registry import ModelRegistry

QUERY = "how do rivers form"
BODIES: dict[str, dict[str, Any]] = {
    "/v1/embeddings": {"input": QUERY, "model": "model"},
    "/embed": {"inputs": QUERY},
    "/v2/embed": {"texts": [QUERY], "input_type": "search_query", "embedding_types": ["float"]},
}
"""One query per request, in three dialects of an embedding model."""


def scope(path: str, body: bytes) -> dict[str, Any]:
    """A request's scope as `encoderrt serve`'s protocol (server/connections.py) hands it to the app."""
    headers = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"), (b"accept", b"*/*"),
               (b"content-length", str(len(body)).encode())]
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000), "scheme": "http", "method": "POST",
            "root_path": "", "path": path, "raw_path": path.encode(), "query_string": b"", "headers": headers,
            "state": {}, CLIENT_GONE: ClientGone(), BODY_IN: True}


async def call(app: Any, path: str, body: bytes) -> int:
    """One request through `app`; the size of its reply's body."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope(path, body), receive, send)
    if sent[0]["status"] != 200:
        raise SystemExit(f"{path} answered {sent[0]['status']}: {sent[-1].get('body', b'')[:300]!r}")
    return sum(len(m.get("body", b"")) for m in sent[1:])


def bare_app(reply: bytes) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        message = await receive()
        while message.get("more_body"):
            message = await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(reply)).encode())]})
        await send({"type": "http.response.body", "body": reply})

    return app


async def seconds_a_request(app: Any, path: str, body: bytes, requests: int) -> float:
    started = time.perf_counter()
    for _ in range(requests):
        await call(app, path, body)
    return (time.perf_counter() - started) / requests


async def engine_seconds(engine: Engine, requests: int) -> float:
    started = time.perf_counter()
    for _ in range(requests):
        await engine.aembed([QUERY])
    return (time.perf_counter() - started) / requests


async def measure(app: Any, engine: Engine, requests: int, rounds: int, profile: int) -> dict[str, float]:
    """Each route's `vs_engine` ratio, after printing the figures."""
    bodies = {path: json.dumps(payload).encode() for path, payload in BODIES.items()}
    reply = b"x" * await call(app, "/v1/embeddings", bodies["/v1/embeddings"])  # the first call fills the cache
    times: dict[str, list[float]] = {path: [] for path in (*bodies, "engine", "bare")}
    for _ in range(rounds):
        times["engine"].append(await engine_seconds(engine, requests))
        times["bare"].append(await seconds_a_request(bare_app(reply), "/v1/embeddings", b"{}", requests))
        for path, body in bodies.items():
            times[path].append(await seconds_a_request(app, path, body, requests))
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"medians of {rounds} alternating rounds of {requests} one-query requests, every answer from the cache")
    print(f"{'':<16} {'us':>8} {'x engine':>9}")
    for name in ("engine", "bare", *bodies):
        print(f"{name:<16} {median[name] * 1e6:8.1f} {median[name] / median['engine']:9.2f}")
    if profile:
        path = next(iter(bodies))
        profiler = cProfile.Profile()
        profiler.enable()
        await seconds_a_request(app, path, bodies[path], requests)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(profile)
    return {f"front_end{path}/vs_engine": round(median["engine"] / median[path], 4) for path in bodies}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifact", type=Path, help="an embedding model's artifact or folder (default: the bundled "
                        "all-MiniLM-L6-v2)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--profile", type=int, default=0, metavar="N")
    parser.add_argument("--check", type=Path, metavar="BASELINE.json", help="exit 1 if a ratio regressed")
    parser.add_argument("--tolerance", type=float, default=0.15)
    parser.add_argument("--write-baseline", type=Path, metavar="BASELINE.json")
    args = parser.parse_args()
    tier = cpu_tier(cpu_description()["flags"])
    baseline = baselines.read_baseline(args.check, tier) if args.check else None  # a bad file fails before measuring
    artifact, _ = artifact_for(args.artifact)
    with Engine.load(artifact, result_cache_mb=16) as engine:
        if engine.info.task != "embed":
            raise SystemExit(f"{artifact} serves {engine.info.task}; this measures an embedding model's routes")
        models = ModelRegistry()
        models.add("model", engine)
        models.mark_ready()
        freeze_startup_heap()  # as `encoderrt serve` does before its first request
        ratios = asyncio.run(measure(create_app(ServerSettings(), models), engine, args.requests, args.rounds,
                                     args.profile))
    if args.write_baseline:
        baselines.write_baseline(args.write_baseline, ratios, f"benchmarks/front_end.py on {artifact.name}; "
                                 f"{cpu_description()['model']} ({tier})", tier)
    if baseline is None:
        return
    comparisons = baselines.compare(baseline, ratios, args.tolerance)
    print(baselines.format_comparisons(comparisons, args.tolerance))
    if failed := [c.name for c in comparisons if not c.passed]:
        raise SystemExit(f"the front end regressed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
