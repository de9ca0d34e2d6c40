"""Runners: the engine in process, the HTTP server in a child process, and the PyTorch reference.

Engine and HTTP runs are closed loops: `concurrency` clients each send one request at a time,
cycling through the workload until the duration is up (and at least once through it).
"""

from __future__ import annotations

import asyncio
import base64
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from encoderrt.bench.workloads import Request, Workload
from encoderrt.runtime import Engine
from encoderrt.runtime.requests import ClassifyRequest, EmbedRequest, RerankRequest, ScoreRequest


@dataclass
class RunResult:
    workload: str
    mode: str
    concurrency: int
    items: int = 0
    tokens: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    padding_efficiency: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds if self.seconds else 0.0


def items_of(request: Request) -> int:
    if isinstance(request, (EmbedRequest, ClassifyRequest)):
        return len(request.texts)
    if isinstance(request, RerankRequest):
        return len(request.documents)
    return 1 if isinstance(request.text_2, str) else len(request.text_2)


async def closed_loop(call: Callable[[Request], Awaitable[int]], workload: Workload, concurrency: int,
                      duration: float, result: RunResult) -> RunResult:
    """`call` runs one request and returns its token count."""
    requests = workload.requests
    if len(requests) < concurrency:
        raise ValueError(f"the {workload.name} workload has {len(requests)} requests for {concurrency} clients: "
                         "requests would be in flight twice and deduplicated")
    position = 0
    deadline = time.perf_counter() + duration

    def next_request() -> Request | None:
        nonlocal position
        if position >= len(requests) and time.perf_counter() >= deadline:
            return None
        request = requests[position % len(requests)]
        position += 1
        return request

    async def client() -> None:
        while (request := next_request()) is not None:
            start = time.perf_counter()
            tokens = await call(request)  # not `result.tokens += await ...`: that reads the total before awaiting
            result.latencies.append(time.perf_counter() - start)
            result.tokens += tokens
            result.items += items_of(request)

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    result.seconds = time.perf_counter() - start
    return result


def run_engine(engine: Engine, workload: Workload, concurrency: int, duration: float) -> RunResult:
    async def call(request: Request) -> int:
        return (await engine.arun(request)).prompt_tokens

    before = engine.stats.snapshot()
    result = asyncio.run(closed_loop(call, workload, concurrency, duration, RunResult(workload.name, "engine", concurrency)))
    after = engine.stats.snapshot()
    padded = after["padded_tokens"] - before["padded_tokens"]
    result.padding_efficiency = (after["real_tokens"] - before["real_tokens"]) / padded if padded else None
    return result


def http_body(request: Request) -> tuple[str, dict[str, Any]]:
    """The route and body a client of each API sends for an engine request."""
    if isinstance(request, EmbedRequest):
        return "/v1/embeddings", {"input": list(request.texts), "encoding_format": "base64"}
    if isinstance(request, ScoreRequest):
        return "/score", {"text_1": request.text_1, "text_2": request.text_2}
    if isinstance(request, RerankRequest):
        return "/rerank", {"query": request.query, "documents": list(request.documents), "return_documents": False}
    return "/classify", {"input": list(request.texts)}


def _usage_tokens(body: dict[str, Any]) -> int:
    usage = body.get("usage", {})
    return int(usage.get("prompt_tokens", usage.get("total_tokens", 0)))


def run_http(url: str, workload: Workload, concurrency: int, duration: float) -> RunResult:
    import httpx

    async def main() -> RunResult:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=300) as http:
            async def call(request: Request) -> int:
                path, body = http_body(request)
                response = await http.post(path, json=body)
                response.raise_for_status()
                payload = response.json()
                if path == "/v1/embeddings":  # decode like a client would
                    for item in payload["data"]:
                        base64.b64decode(item["embedding"])
                return _usage_tokens(payload)

            return await closed_loop(call, workload, concurrency, duration, RunResult(workload.name, "http", concurrency))

    return asyncio.run(main())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def served(artifact: Path, max_batch_tokens: int, timeout: float = 120.0) -> Iterator[str]:
    """`encoderrt serve ARTIFACT` on a free loopback port; stopped on exit, also on failure or Ctrl-C."""
    import httpx

    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "encoderrt.cli", "serve", str(artifact), "--port", str(port),
         "--max-batch-tokens", str(max_batch_tokens)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"encoderrt serve exited with {process.returncode}: {process.stderr.read()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("encoderrt serve did not become healthy in time")
            time.sleep(0.1)
        yield url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


@dataclass(frozen=True)
class ReferenceResult:
    workload: str
    name: str
    items: int
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds


class Reference:
    """sentence-transformers fp32, batch 32, on the same inputs; best of `repeats` passes."""

    def __init__(self, source: Path, task: str, max_length: int):
        import warnings

        warnings.filterwarnings("ignore", module="sentence_transformers")
        if task == "embed":
            from sentence_transformers import SentenceTransformer

            self.model = SentenceTransformer(str(source), device="cpu", local_files_only=True)
            self.model.max_seq_length = max_length
            self.name = "SentenceTransformer.encode fp32, batch 32"
        elif task == "score":
            from sentence_transformers import CrossEncoder

            self.model = CrossEncoder(str(source), device="cpu", max_length=max_length, local_files_only=True)
            self.name = "CrossEncoder.predict fp32, batch 32"
        else:
            raise ValueError(f"no sentence-transformers reference for {task} models")
        self.task = task

    def run(self, workload: Workload, tokens: int, repeats: int = 2) -> ReferenceResult:
        if self.task == "embed":
            work, items = (lambda: self.model.encode(workload.reference_texts, batch_size=32, show_progress_bar=False),
                           len(workload.reference_texts))
        else:
            work, items = (lambda: self.model.predict(workload.reference_pairs, batch_size=32, show_progress_bar=False),
                           len(workload.reference_pairs))
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            work()
            best = min(best, time.perf_counter() - start)
        return ReferenceResult(workload.name, self.name, items, tokens, best)
