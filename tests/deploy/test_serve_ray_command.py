"""`encoderrt serve --ray` end to end: a local Ray cluster of its own, HAProxy in front of the replica, the same
answers as the engine, and Ctrl-C leaves nothing listening (its own module, so no other test's cluster is up)."""

import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np

from encoderrt import Engine
from server_helpers import free_port


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _as_a_background_job() -> None:
    """What `cmd &` in a script does to its child: SIGINT ignored, inherited across exec. Python then installs no
    Ctrl-C handler of its own, and `serve --ray` once kept running after SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_serve_ray_serves_the_engines_answers_and_stops_on_ctrl_c(minilm_fp32):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "encoderrt.cli", "serve", "--ray", str(minilm_fp32.path),
                                "--port", str(port), "--served-model-name", "minilm"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=_as_a_background_job)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, process.stdout.read()[-4000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "serve --ray never became healthy"
            time.sleep(0.5)
        texts = ["ray serves this", "and this too"]
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/embeddings", json={"model": "minilm", "input": texts}, timeout=60)
        assert reply.status_code == 200, reply.text
        with Engine.load(minilm_fp32.path) as engine:
            expected = engine.embed(texts)
        served = np.array([item["embedding"] for item in reply.json()["data"]], dtype=np.float32)
        assert (served * expected).sum(1).min() >= 0.99999
    finally:
        process.send_signal(signal.SIGINT)
        try:
            # idle, Serve stops in about 9 s; Ray's default 30 s stay of a stopping replica would be past this
            code = process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            raise AssertionError("serve --ray was still stopping 30 s after Ctrl-C") from None
    assert code in (0, 130), process.stdout.read()[-4000:]
    deadline = time.monotonic() + 30
    while _listening(port):  # Serve's shutdown stops HAProxy too
        assert time.monotonic() < deadline, f"port {port} still listening after serve --ray stopped"
        time.sleep(0.5)
