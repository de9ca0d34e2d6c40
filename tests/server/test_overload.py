"""Overload: 4x more work than the engine drains is refused with 429 and Retry-After before latency grows, the vectors
that are served are right, and latency is normal again within the queue limit once the load ends.

The backend is slowed to a known throughput (seconds per token), so the figures hold on any machine."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np

from controlled_backend import ControlledBackend
from encoderrt import Engine
from encoderrt.bench import workloads
from encoderrt.server import ServerSettings, create_app
from server_helpers import ready_registry, running_server

TOKENS_PER_SECOND = 4000
QUEUE_SECONDS = 0.5
CLIENTS = 32
TEXTS_PER_REQUEST = 8
LOAD_SECONDS = 4.0


def test_overload_is_refused_early_and_recovery_takes_the_queue_limit(controlled, tiny_artifacts, monkeypatch):
    requests = [workloads.queries(TEXTS_PER_REQUEST, seed=1000 + i) for i in range(600)]
    with Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=512) as unloaded:  # one request at a time
        reference = {i: unloaded.embed(texts, truncate=True) for i, texts in enumerate(requests)}
        request_tokens = unloaded.count_tokens(requests[0])
    unbounded_wait = CLIENTS * request_tokens / TOKENS_PER_SECOND
    assert unbounded_wait > 4 * QUEUE_SECONDS, request_tokens  # the clients keep 4x the queue limit's work waiting
    monkeypatch.setattr(ControlledBackend, "seconds_per_token", 1 / TOKENS_PER_SECOND)
    engine = Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=512, max_queue_seconds=QUEUE_SECONDS)
    served, refused, wrong = [], [], []
    next_request = iter(range(len(requests)))
    lock = threading.Lock()
    with running_server(create_app(ServerSettings(), ready_registry(st=engine))) as url:
        stop_at = time.monotonic() + LOAD_SECONDS

        def client() -> None:
            with httpx.Client(base_url=url, timeout=30) as http:
                while time.monotonic() < stop_at:
                    with lock:
                        index = next(next_request) % len(requests)
                    start = time.monotonic()
                    reply = http.post("/embed", json={"inputs": requests[index], "truncate": True})
                    if reply.status_code == 429:
                        refused.append(int(reply.headers["retry-after"]))
                        time.sleep(refused[-1])  # as the OpenAI SDK does
                        continue
                    assert reply.status_code == 200, reply.text
                    served.append(time.monotonic() - start)
                    if not np.allclose(reply.json(), reference[index], atol=1e-5):
                        wrong.append(index)

        with ThreadPoolExecutor(CLIENTS) as pool:
            clients = [pool.submit(client) for _ in range(CLIENTS)]
            time.sleep(max(0.0, stop_at - time.monotonic()))
            # the load ends (the clients' last requests still queued): a lone request is soon answered at normal latency
            while True:  # a probe polls (a client would wait its Retry-After)
                start = time.monotonic()
                probe = httpx.post(f"{url}/embed", json={"inputs": ["after the storm"]}, timeout=30)
                if probe.status_code == 200 and time.monotonic() - start < 0.2:
                    break
                assert probe.status_code in (200, 429), probe.text
                time.sleep(0.05)
            recovered = time.monotonic() - stop_at
            for future in clients:
                future.result()

    engine.close()
    assert refused and min(refused) >= 1, "no 429 under 4x overload"
    assert served and not wrong, f"{len(wrong)} of {len(served)} served requests had wrong vectors"
    latency = sorted(served)
    median, p95 = latency[len(latency) // 2], latency[int(len(latency) * 0.95)]
    # without admission a request waits behind every client's work (~2.1 s); with it, the limit and its own batch
    assert median < min(QUEUE_SECONDS + 0.6, unbounded_wait / 2), (median, p95)
    assert recovered < QUEUE_SECONDS + 1.0, recovered
    print(f"served {len(served)}, refused {len(refused)}, median {median:.2f} s, p95 {p95:.2f} s, "
          f"recovered in {recovered:.2f} s")
