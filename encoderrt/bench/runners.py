"""Runners: the engine in process, the server in a child process (over HTTP, or TEI's gRPC streams), and the
backend alone.

The sentence-transformers references are in references.py.

Engine and HTTP runs are closed loops: `concurrency` clients each send one request at a time,
cycling through the workload until the duration is up (and at least once through it).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import math
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from encoderrt.bench.http_client import Connection, HttpError
from encoderrt.bench.workloads import Request, Workload
from encoderrt.runtime import Engine
from encoderrt.runtime.backends import STREAMS_ONLY, load_backend
from encoderrt.runtime.cpu import cpu_seconds
from encoderrt.runtime.manifest import Manifest
from encoderrt.runtime.tasks import ClassifyRequest, EmbedRequest, MultiVectorRequest, RerankRequest, ScoreRequest
from encoderrt.runtime.throughput import length_sorted_batches, pass_seconds, real_tokens
from encoderrt.runtime.tokenizer import TextTokenizer


class ServerCpu(NamedTuple):
    """User + system CPU time of the server process: all of it, and its event loop's thread alone (HTTP, validation,
    tokenising short requests, encoding replies: the cost a request adds beyond the backend's batches; in a gRPC
    run, the gRPC server's thread, whose loop runs its calls; None where it cannot be read)."""

    process: float
    loop: float | None


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
    server_cpu_s: ServerCpu | None = None
    """The server's CPU time during an HTTP run; None where the bench did not start the server (`--url`) or cannot
    read it (not Linux)."""
    cached_share: float | None = None
    """The share of the server's items in an HTTP run that its result cache answered without running them
    (`--result-cache-mb`; a closed loop repeats its texts, so such a run measures the cache, not the model); None
    where the server's /metrics cannot be read."""
    bench_cpu_s: float | None = None
    """The bench process's own CPU time during the run: in an engine run, the engine's and its callers'; in an HTTP
    or gRPC run, the clients'. The load runs on the cores it measures, so a server's clients take CPU that the
    engine's in-process callers barely do (Report.client_bound)."""

    @property
    def requests(self) -> int:
        return len(self.latencies)  # one a request

    @property
    def server_cpu_ms_per_request(self) -> ServerCpu | None:
        if self.server_cpu_s is None or not self.requests:
            return None
        process, loop = self.server_cpu_s
        return ServerCpu(process * 1000 / self.requests, None if loop is None else loop * 1000 / self.requests)

    @property
    def bench_cpu_ms_per_request(self) -> float | None:
        return None if self.bench_cpu_s is None or not self.requests else self.bench_cpu_s * 1000 / self.requests

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds if self.seconds else 0.0


def items_of(request: Request) -> int:
    if isinstance(request, (EmbedRequest, ClassifyRequest, MultiVectorRequest)):
        return len(request.texts)
    if isinstance(request, RerankRequest):
        return len(request.documents)
    return 1 if isinstance(request.text_2, str) else len(request.text_2)


async def closed_loop(call: Callable[[Request], Awaitable[int]], workload: Workload, concurrency: int,
                      duration: float, result: RunResult) -> RunResult:
    """`call` runs one request and returns its token count.

    A client takes the request that has waited longest since it last ran, never one in flight: the
    engine computes a duplicate once, and with as many requests as clients a plain cycle (the next
    index) re-sent requests still running whenever they finished out of order.
    """
    requests = workload.requests
    if len(requests) < concurrency:
        raise ValueError(f"the {workload.name} workload has {len(requests)} requests for {concurrency} clients: "
                         "requests would be in flight twice and deduplicated")
    idle = collections.deque(range(len(requests)))
    sent = 0
    deadline = time.perf_counter() + duration

    async def client() -> None:
        nonlocal sent
        while sent < len(requests) or time.perf_counter() < deadline:  # at least one whole pass
            index = idle.popleft()
            request = requests[index]
            sent += 1
            start = time.perf_counter()
            try:
                tokens = await call(request)  # not `result.tokens += await ...`: that reads the total before awaiting
            finally:
                idle.append(index)  # also after a failure, so the other clients never find the deque empty
            result.latencies.append(time.perf_counter() - start)
            result.tokens += tokens
            result.items += items_of(request)

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    result.seconds = time.perf_counter() - start
    return result


QUEUE_SECONDS = math.inf
"""The queue-time limit of the engine and the server the bench measures: none. A closed loop keeps at most
`concurrency` requests waiting, so admission's limit, which bounds open-loop overload, would only refuse the
bench's own requests on a slow backend."""


def load_engine(artifact: Path, max_batch_tokens: int | None) -> Engine:
    """The engine the bench measures."""
    return Engine.load(artifact, max_batch_tokens=max_batch_tokens, max_queue_seconds=QUEUE_SECONDS)


def run_engine(engine: Engine, workload: Workload, concurrency: int, duration: float) -> RunResult:
    async def call(request: Request) -> int:
        return (await engine.arun(request)).prompt_tokens

    before, cpu = engine.stats.snapshot(), time.process_time()
    result = asyncio.run(closed_loop(call, workload, concurrency, duration, RunResult(workload.name, "engine", concurrency)))
    result.bench_cpu_s = time.process_time() - cpu
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
    if isinstance(request, MultiVectorRequest):
        return "/pooling", {"input": list(request.texts), "task": "token_embed", "side": request.side,
                            "encoding_format": "base64"}
    return "/classify", {"input": list(request.texts)}


def _usage_tokens(body: dict[str, Any]) -> int:
    usage = body.get("usage", {})
    return int(usage.get("prompt_tokens", usage.get("total_tokens", 0)))


def run_http(url: str, workload: Workload, concurrency: int, duration: float,
             server_cpu: Callable[[], ServerCpu | None] | None = None) -> RunResult:
    """`concurrency` clients, each on its own keep-alive connection (bench/http_client.py: httpx's own CPU would
    be measured with the server's); `server_cpu` reads the server's CPU seconds so far (Server.cpu_seconds)."""

    async def main() -> RunResult:
        idle = [Connection(url) for _ in range(concurrency)]

        async def call(request: Request) -> int:
            path, body = http_body(request)
            connection = idle.pop()
            try:
                reply = await connection.post_json(path, body)
                while reply.status == 429:  # a server that sheds load (`--url`): back off as clients do
                    await asyncio.sleep(float(reply.headers.get("retry-after", 1)))
                    reply = await connection.post_json(path, body)
            finally:
                idle.append(connection)
            if reply.status >= 400:
                raise HttpError(f"{path} answered {reply.status}: {reply.body[:300].decode(errors='replace')}")
            payload = reply.json()
            if path in ("/v1/embeddings", "/pooling"):  # decode like a client would
                for item in payload["data"]:
                    base64.b64decode(item["embedding" if path == "/v1/embeddings" else "data"])
            return _usage_tokens(payload)

        counters = Connection(url)
        before = await _server_items(counters)
        try:
            result = await closed_loop(call, workload, concurrency, duration,
                                       RunResult(workload.name, "http", concurrency))
        finally:
            await asyncio.gather(*(connection.close() for connection in idle))
        after = await _server_items(counters)
        await counters.close()
        if before is not None and after is not None and after[0] > before[0]:
            result.cached_share = (after[1] - before[1]) / (after[0] - before[0])
        return result

    before, cpu = server_cpu() if server_cpu else None, time.process_time()
    result = asyncio.run(main())
    result.bench_cpu_s = time.process_time() - cpu
    after = server_cpu() if server_cpu else None
    if before is not None and after is not None:
        result.server_cpu_s = ServerCpu(*(b - a for a, b in zip(before, after)))
    return result


async def _server_items(connection: Connection) -> tuple[float, float] | None:
    """The items a server's engines took so far, and how many of them its result cache answered (its /metrics,
    every model together); None where /metrics cannot be read (an older server, or one behind a key)."""
    try:
        reply = await connection.get("/metrics")
    except HttpError:
        return None
    if reply.status != 200:
        return None
    totals = {"encoderrt_engine_items": 0.0, "encoderrt_cached_items": 0.0}
    for family in text_string_to_metric_families(reply.body.decode(errors="replace")):
        if family.name in totals:
            totals[family.name] += sum(sample.value for sample in family.samples if sample.name.endswith("_total"))
    return totals["encoderrt_engine_items"], totals["encoderrt_cached_items"]


def grpc_answers(workload: Workload) -> bool:
    """Whether TEI's gRPC API carries the workload's requests (embeddings and reranking)."""
    return all(type(request) in (EmbedRequest, RerankRequest) for request in workload.requests)


def run_grpc(target: str, workload: Workload, concurrency: int, duration: float,
             server_cpu: Callable[[], ServerCpu | None] | None = None) -> RunResult:
    """TEI's gRPC API as a high-rate client uses it: one EmbedStream carrying every text, `concurrency` requests'
    texts in flight on it (a request's latency: until its last text's reply); a rerank request is a Rerank call.
    The stream's replies come in the order of its messages, so each goes to the oldest text waiting."""
    import grpc

    from encoderrt import proto

    embed_request, embed_reply = proto.message("EmbedRequest"), proto.message("EmbedResponse")
    rerank_request, rerank_reply = proto.message("RerankRequest"), proto.message("RerankResponse")

    async def main() -> RunResult:
        async with grpc.aio.insecure_channel(target) as channel:
            stream = channel.stream_stream("/tei.v1.Embed/EmbedStream",
                                           request_serializer=embed_request.SerializeToString,
                                           response_deserializer=embed_reply.FromString)()
            rerank = channel.unary_unary("/tei.v1.Rerank/Rerank", request_serializer=rerank_request.SerializeToString,
                                         response_deserializer=rerank_reply.FromString)
            waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
            writing = asyncio.Lock()

            async def read() -> None:
                while (reply := await stream.read()) is not grpc.aio.EOF:
                    waiting.popleft().set_result(reply)
                while waiting:
                    waiting.popleft().set_exception(ConnectionError(f"the stream ended: {await stream.code()}"))

            async def call(request: Request) -> int:
                if isinstance(request, RerankRequest):
                    reply = await rerank(rerank_request(query=request.query, texts=list(request.documents),
                                                        truncate=True))
                    return reply.metadata.compute_tokens
                if not isinstance(request, EmbedRequest):
                    raise ValueError(f"the gRPC bench runs embed and rerank workloads, not {type(request).__name__}")
                texts = [request.texts] if isinstance(request.texts, str) else request.texts
                replies = []
                async with writing:  # one write at a time on a stream; the futures in the order of the writes
                    for text in texts:
                        replies.append(asyncio.get_running_loop().create_future())
                        waiting.append(replies[-1])
                        await stream.write(embed_request(inputs=text, truncate=True, normalize=True))
                return sum(reply.metadata.compute_tokens for reply in await asyncio.gather(*replies))

            reader = asyncio.ensure_future(read())
            try:
                return await closed_loop(call, workload, concurrency, duration,
                                         RunResult(workload.name, "grpc", concurrency))
            finally:
                await stream.done_writing()
                await reader

    before, cpu = server_cpu() if server_cpu else None, time.process_time()
    result = asyncio.run(main())
    result.bench_cpu_s = time.process_time() - cpu
    after = server_cpu() if server_cpu else None
    if before is not None and after is not None:
        result.server_cpu_s = ServerCpu(after.process - before.process,
                                        None if before.loop is None or after.loop is None else after.loop - before.loop)
    return result


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Server:
    """The server the bench started: its URL, its gRPC address, and its process, whose CPU time each run reads."""

    url: str
    pid: int
    grpc_target: str

    def cpu_seconds(self) -> ServerCpu | None:
        """CPU seconds so far, the process's and its main thread's (where uvicorn runs the event loop), from /proc;
        None where there is none."""
        try:
            return ServerCpu(cpu_seconds(self.pid), cpu_seconds(self.pid, self.pid))
        except OSError:
            return None

    def grpc_cpu_seconds(self) -> ServerCpu | None:
        """`cpu_seconds` with the gRPC server's thread in place of the main thread: the loop that gRPC calls run on,
        whose CPU the server reports in /metrics (`encoderrt_thread_cpu_seconds`); None where it reports none."""
        import httpx

        try:
            process = cpu_seconds(self.pid)
            text = httpx.get(f"{self.url}/metrics", timeout=10).text
        except (OSError, httpx.HTTPError):
            return None
        for family in text_string_to_metric_families(text):
            if family.name == "encoderrt_thread_cpu_seconds":
                grpc = [sample.value for sample in family.samples if sample.labels.get("thread") == "grpc"]
                if grpc:
                    return ServerCpu(process, grpc[0])
        return None


@contextmanager
def served(artifact: Path, max_batch_tokens: int, deep_batch_tokens: int = 0,
           timeout: float = 120.0) -> Iterator[Server]:
    """`encoderrt serve ARTIFACT` on a free loopback port, with the budgets given (deep: 0, the budget); stopped on
    exit, also on failure or Ctrl-C."""
    import httpx

    port, grpc_port = _free_port(), _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "encoderrt.cli", "serve", str(artifact), "--port", str(port),
         "--grpc-port", str(grpc_port),
         "--max-batch-tokens", str(max_batch_tokens), "--deep-batch-tokens", str(deep_batch_tokens),
         "--max-queue-seconds", str(QUEUE_SECONDS)],
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
        yield Server(url, process.pid, f"127.0.0.1:{grpc_port}")
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


class RawBackend:
    """The artifact's backend alone (no tokenising, queue or Futures) on the workload's rows, length-sorted
    under the engine's budget for a deep queue (the whole workload is queued): what the engine's served throughput
    is divided by (engine efficiency)."""

    def __init__(self, artifact: Path, manifest: Manifest, workload: Workload, max_batch_tokens: int):
        tokenizer = TextTokenizer.for_artifact(manifest, artifact)
        if workload.reference_pairs and manifest.task == "multi_vector":  # queries and documents run apart
            firsts, seconds = zip(*workload.reference_pairs)
            rows = tokenizer.encode([*dict.fromkeys(firsts), *seconds])
        elif workload.reference_pairs:
            firsts, seconds = zip(*workload.reference_pairs)
            rows = tokenizer.encode_pairs(firsts, seconds)
        else:
            rows = tokenizer.encode(workload.reference_texts)
        self.backend = load_backend(manifest, artifact, STREAMS_ONLY)
        self.batches = length_sorted_batches(rows, tokenizer.pad, max_batch_tokens,
                                             self.backend.capabilities.width_multiple)
        self.tokens = real_tokens(self.batches)
        self._pass_seconds = pass_seconds(self.backend, self.batches)  # warm-up: the first run of each shape allocates

    def run(self, duration: float) -> float:
        """Tokens per second over about `duration` seconds of whole passes (at least one), queued back to back: a
        pass's last batch leaves the other streams idle, and with a pass per timing that tail, 10-30 batches to a
        pass at `--scale 0.15`, put engine efficiency above 1."""
        passes = max(1, math.ceil(duration / self._pass_seconds))
        elapsed = pass_seconds(self.backend, self.batches * passes)
        self._pass_seconds = elapsed / passes
        return passes * self.tokens / elapsed
