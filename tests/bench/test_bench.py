"""encoderrt bench: FLOPs arithmetic, baseline logic, workloads, and a short real run end to end."""

import json
import os
import subprocess
import sys
import time

import pytest

from encoderrt import Engine
from encoderrt.bench import baseline, runners, workloads
from encoderrt.bench.flops import flops_per_token
from encoderrt.cli import main
from encoderrt.runtime.manifest import ModelShape


def test_flops_per_token_against_a_hand_count():
    minilm = ModelShape(hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536, vocab_size=30522, output_dim=384)
    # per layer: Q, K, V, O = 4 x 384 x 384 = 589,824; FFN up + down = 2 x 384 x 1536 = 1,179,648
    assert minilm.per_token_weights() == 6 * (589_824 + 1_179_648) == 10_616_832
    # 2 FLOPs per weight, plus QK^T and AV: 6 layers x 4 x 128 tokens x 384
    assert flops_per_token(minilm, 128) == 2 * 10_616_832 + 6 * 4 * 128 * 384 == 22_413_312


def test_baseline_catches_a_regression_and_lets_noise_pass():
    base = {"passages/engine/c8/vs_reference": 1.40, "passages/http/c8/vs_engine": 0.95}
    noisy = {"passages/engine/c8/vs_reference": 1.31, "passages/http/c8/vs_engine": 0.99}
    assert all(c.passed for c in baseline.compare(base, noisy, tolerance=0.15))
    slower = {"passages/engine/c8/vs_reference": 1.10, "passages/http/c8/vs_engine": 0.99}
    results = {c.name: c.passed for c in baseline.compare(base, slower, tolerance=0.15)}
    assert results == {"passages/engine/c8/vs_reference": False, "passages/http/c8/vs_engine": True}
    faster = {k: v * 3 for k, v in base.items()}
    assert all(c.passed for c in baseline.compare(base, faster, tolerance=0.0))
    missing = baseline.compare(base, {"passages/engine/c8/vs_reference": 1.4}, tolerance=0.15)
    assert [c.passed for c in missing] == [True, False]  # sorted by name; the http figure is missing
    assert "missing" in baseline.format_comparisons(missing, 0.15) and "REGRESSION" in baseline.format_comparisons(missing, 0.15)


def test_baseline_file_round_trip_and_bad_files(tmp_path):
    path = tmp_path / "b.json"
    baseline.write_baseline(path, {"x/engine/c1/vs_reference": 1.5}, "note")
    assert baseline.read_baseline(path) == {"x/engine/c1/vs_reference": 1.5}
    # a CPU tier's own record overrides the floor for CPUs of that tier only, and keeps the other tiers'
    baseline.write_baseline(path, {"x/engine/c1/vs_reference": 6.0, "x/engine/c1/vs_backend": 0.9}, "amx run", "amx")
    baseline.write_baseline(path, {"x/engine/c1/vs_reference": 2.5}, "avx512_bf16 run", "avx512_bf16")
    assert baseline.read_baseline(path, "amx") == {"x/engine/c1/vs_reference": 6.0, "x/engine/c1/vs_backend": 0.9}
    assert baseline.read_baseline(path, "avx512_bf16") == {"x/engine/c1/vs_reference": 2.5}
    assert baseline.read_baseline(path, "avx2") == {"x/engine/c1/vs_reference": 1.5}
    assert baseline.recorded_tiers(path) == ["amx", "avx512_bf16"]
    path.write_text('{"ratios": {"a": "fast"}}')
    with pytest.raises(ValueError, match="no 'ratios' object of numbers"):
        baseline.read_baseline(path)


def test_workloads_are_deterministic_and_realistic():
    assert workloads.queries(20) == workloads.queries(20)
    assert all(3 <= len(q.split()) <= 12 for q in workloads.queries(200))
    lengths = [len(p.split()) for p in workloads.passages(500)]
    assert 50 <= sum(lengths) / len(lengths) <= 70 and max(lengths) > 150  # about 60 words, with a long tail
    cases = workloads.rerank_cases(5)
    assert all(32 <= len(c.documents) <= 100 for c in cases)


def test_user_texts(tmp_path):
    lines = tmp_path / "texts.txt"
    lines.write_text("first text\n\nsecond text\n")
    assert workloads.read_texts(lines) == ["first text", "second text"]
    jsonl = tmp_path / "texts.jsonl"
    jsonl.write_text('{"text": "a"}\n{"text": "b"}\n')
    assert workloads.read_texts(jsonl) == ["a", "b"]
    jsonl.write_text('{"text": "a"}\n{"body": "b"}\n')
    with pytest.raises(ValueError, match="texts.jsonl:2"):
        workloads.read_texts(jsonl)
    jsonl.write_bytes(b'\xef\xbb\xbf{"text": "a"}\r\n')  # a BOM, as Windows tools write UTF-8
    assert workloads.read_texts(jsonl) == ["a"]
    lines.write_bytes(b"caf\xe9\n")  # Latin-1
    with pytest.raises(ValueError, match=r"texts.txt is not UTF-8 text \(invalid continuation byte at byte 3\)"):
        workloads.read_texts(lines)


def test_short_real_bench_writes_a_readable_report(tiny_artifacts, tmp_path, capsys):
    """In this process first (cli.main: PyTorch and sentence-transformers are imported already), then the
    console script with --check."""

    out = tmp_path / "report"
    arguments = ["bench", str(tiny_artifacts["st-cls"]), "--workload", "passages", "--duration", "0.3", "--scale",
                 "0.1", "--max-batch-tokens", "256", "--out", str(out)]
    code = main(arguments + ["--reference", "--mode", "both", "--concurrency", "1,4",
                             "--write-baseline", str(tmp_path / "baseline.json")])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert "[1/" in err and "passages: engine, 4 clients, round 1:" in err  # a line per measurement
    report = json.loads((out / "report.json").read_text())
    assert {r["mode"] for r in report["results"]} == {"engine", "http"}
    assert [r["concurrency"] for r in report["results"]] == [1, 4, 1, 4]
    for row in report["results"]:
        assert row["tokens_per_s"] > 0 and row["items"] > 0 and row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"]
        assert row["ratio_to_reference"] > 0 and 0 < row["ceiling_fraction"]
        assert 0 < row["requests"] < row["items"]  # passages: several texts a request
        # the server's CPU a request, from its process's CPU time: at most the cores' time a request took (plus the
        # clock tick /proc counts in), its event loop's a part of it
        cpu, loop = row["server_cpu_ms_per_request"], row["server_loop_cpu_ms_per_request"]
        if row["mode"] == "engine":
            assert cpu is None and loop is None
        else:
            most = (row["seconds"] * report["cpu"]["cores"] + 0.02) * 1000 / row["requests"]
            assert 0 < loop <= cpu <= most, row
        assert row["ratio_to_reference"] == row["ratios_to_references"]["torch"]
        assert row["cached_share"] == (None if row["mode"] == "engine" else 0.0)  # its own server keeps no answers
    assert report["results"][0]["padding_efficiency"] > 0.5
    engine_rows = [r for r in report["results"] if r["mode"] == "engine"]
    raw = report["backend_alone"]["passages"]["tokens_per_s"]
    for row in engine_rows:  # engine efficiency: the served throughput over the backend alone, right after it
        assert row["engine_efficiency"] > 0 and len(raw[str(row["concurrency"])]) == 1
        assert abs(row["engine_efficiency"] - row["tokens_per_s"] / raw[str(row["concurrency"])][0]) < 1e-6
    assert {c["precision"] for c in report["ceilings"]} >= {"fp32", "int8"}
    assert report["cpu"]["cores"] >= 1 and "onnxruntime" in report["versions"]
    assert "| passages | http | 4 |" in (out / "report.md").read_text()
    for plot in ("throughput.png", "latency.png"):
        assert (out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = json.loads((tmp_path / "baseline.json").read_text())["ratios"]
    assert set(written) == set(report["ratios"]) and "passages/http/c4/vs_engine" in written

    impossible = tmp_path / "impossible.json"  # one figure that needs no reference, far too fast
    baseline.write_baseline(impossible, {"passages/engine/c1/vs_backend": written["passages/engine/c1/vs_backend"] * 100},
                            "far too fast")
    check = subprocess.run([sys.executable, "-m", "encoderrt.cli", *arguments, "--mode", "engine", "--concurrency", "1",
                            "--check", str(impossible)], capture_output=True, text=True, timeout=300)
    assert check.returncode == 1 and "REGRESSION" in check.stdout and "performance regression" in check.stderr


def test_a_servers_cpu_time_is_its_process_and_main_thread_time():
    """Server.cpu_seconds reads /proc: this process's own, against time.process_time and time.thread_time over a
    busy loop in the main thread while another thread is busy too."""
    import threading

    from encoderrt.bench.runners import Server

    assert threading.current_thread() is threading.main_thread()
    me, stop = Server("http://unused", os.getpid(), "unused:0"), threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(10_000))

    other = threading.Thread(target=spin)
    before, process_before, thread_before = me.cpu_seconds(), time.process_time(), time.thread_time()
    other.start()
    while time.thread_time() - thread_before < 0.3:
        sum(range(10_000))
    stop.set()
    other.join()
    after = me.cpu_seconds()
    process_spent, thread_spent = time.process_time() - process_before, time.thread_time() - thread_before
    # /proc counts in clock ticks (10 ms)
    assert abs((after.process - before.process) - process_spent) <= 0.03, (before, after, process_spent)
    assert abs((after.loop - before.loop) - thread_spent) <= 0.03, (before, after, thread_spent)
    assert Server("http://unused", 2**22 + 1, "unused:0").cpu_seconds() is None  # above pid_max: no such process


def test_one_text_queries_are_measured_against_the_same_texts_batched(tiny_artifacts, tmp_path, capsys):
    """And over TEI's gRPC streams against HTTP (--mode all)."""
    out = tmp_path / "report"
    code = main(["bench", str(tiny_artifacts["st-cls"]), "--workload", "queries", "--mode", "all", "--concurrency",
                 "1,4", "--duration", "0.2", "--scale", "0.1", "--max-batch-tokens", "256", "--out", str(out)])
    assert code == 0, capsys.readouterr().err[-3000:]
    report = json.loads((out / "report.json").read_text())
    with Engine.load(tiny_artifacts["st-cls"]) as engine:  # the report is titled by the model, not a workload
        name = engine.info.name
    assert report["model"]["name"] == name and f"bench: {name} (" in (out / "report.md").read_text()
    rows = {(r["workload"], r["mode"], r["concurrency"]): r for r in report["results"]}
    modes = ("engine", "http", "grpc")
    assert set(rows) == {(w, m, c) for w in ("queries", "queries-batched") for m in modes for c in (1, 4)}
    for (workload, mode, clients), row in rows.items():
        if mode != "grpc":
            assert row["ratio_to_http"] is None
            continue
        http = rows[(workload, "http", clients)]
        assert row["ratio_to_http"] == pytest.approx(row["tokens_per_s"] / http["tokens_per_s"])
        assert report["ratios"][f"{workload}/grpc/c{clients}/vs_http"] == round(row["ratio_to_http"], 4)
        # every text's tokens as the server counted them: a pass over the same texts, the same tokens a text
        assert row["tokens"] / row["items"] == pytest.approx(http["tokens"] / http["items"], rel=0.25)
        # the gRPC server's thread, as the server reports it: part of the process's (/proc counts 10 ms ticks)
        tick_ms = 10 / row["requests"]
        assert row["server_cpu_ms_per_request"] > 0
        assert 0 <= row["server_loop_cpu_ms_per_request"] <= row["server_cpu_ms_per_request"] + tick_ms
    assert "gRPC streams against HTTP requests" in (out / "report.md").read_text()
    for (workload, mode, clients), row in rows.items():
        if workload == "queries-batched":
            assert row["ratio_to_batched"] is None and row["items"] == 16 * row["requests"]
            continue
        assert row["items"] == row["requests"]  # one text a request
        batched = rows[("queries-batched", mode, clients)]
        assert row["ratio_to_batched"] == pytest.approx(row["tokens_per_s"] / batched["tokens_per_s"])  # one round
        assert report["ratios"][f"queries/{mode}/c{clients}/vs_batched"] == round(row["ratio_to_batched"], 4)
    assert "One-text queries against the same texts in batched requests" in (out / "report.md").read_text()
    for (workload, mode, clients), row in rows.items():  # the bench's own CPU: at most its cores' time, and in use
        most = (row["seconds"] * report["cpu"]["cores"] + 0.02) * 1000 / row["requests"]
        assert 0 < row["bench_cpu_ms_per_request"] <= most, row
        engine = rows[(workload, "engine", clients)]["bench_cpu_ms_per_request"]
        bound = None if mode == "engine" else engine / (engine + row["bench_cpu_ms_per_request"])  # one round
        assert row["client_bound"] == pytest.approx(bound)
    assert "The load's clients run on the cores they measure" in (out / "report.md").read_text()


def test_bench_refuses_bad_arguments(tmp_path, capsys):
    missing = subprocess.run([sys.executable, "-m", "encoderrt.cli", "bench", str(tmp_path / "nope")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "not found" in missing.stderr
    bad = subprocess.run([sys.executable, "-m", "encoderrt.cli", "bench", "--concurrency", "0,8"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "concurrency levels must be positive" in bad.stderr
    assert main(["bench", "--url", "http://127.0.0.1:9", "--mode", "grpc"]) == 2  # --url serves HTTP, not gRPC
    # the server at --url keeps its own budget: the flag would be ignored
    assert main(["bench", "--url", "http://127.0.0.1:9", "--mode", "http", "--max-batch-tokens", "512"]) == 2
    assert "--max-batch-tokens applies to the engine the bench runs itself" in capsys.readouterr().err


@pytest.mark.parametrize("arguments, says", [(["--duration", "-1"], "--duration must be at least 0 seconds"),
                                             (["--scale", "0"], "--scale must be above 0, got 0"),
                                             (["--scale", "-2"], "--scale must be above 0, got -2")])
def test_bench_refuses_a_negative_duration_or_scale_before_measuring(arguments, says, capsys, tmp_path):
    assert main(["bench", "--out", str(tmp_path / "report"), *arguments]) == 2
    assert says in capsys.readouterr().err and not (tmp_path / "report").exists()


@pytest.mark.parametrize("arguments, says", [
    (["--texts", "{tmp}/missing.txt"], "texts file not found: {tmp}/missing.txt"),
    (["--out", "{tmp}/a-file/report"], "cannot write the report to {tmp}/a-file/report: Not a directory"),
    (["--write-baseline", "{tmp}/a-file/b.json"],
     "cannot write the baseline to {tmp}/a-file: it is a file, not a folder"),
])
def test_bench_refuses_where_it_cannot_read_or_write_before_measuring(arguments, says, capsys, tmp_path, monkeypatch):
    """A report or baseline that cannot be written failed only after the whole run, its figures lost."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setattr(runners, "load_engine", lambda *a, **k: pytest.fail("the bench measured before refusing"))
    arguments = [a.format(tmp=tmp_path) for a in arguments]
    assert main(["bench", *arguments]) == 2
    assert says.format(tmp=tmp_path) in capsys.readouterr().err


def test_workloads_never_put_one_request_in_flight_twice():
    for name in workloads.WORKLOADS:
        workload = workloads.build(name, "embed", min_requests=40)
        assert len(workload.requests) >= 40
        texts = [t for r in workload.requests for t in getattr(r, "texts", getattr(r, "documents", ()))]
        assert len(set(texts)) > 0.9 * len(texts)


def test_more_clients_split_a_pass_instead_of_growing_it():
    """Every run takes at least a pass, so a pass that grew with the clients made a default bench 5.6 minutes."""
    for name in workloads.WORKLOADS:
        default = workloads.build(name, "embed", min_requests=8)
        many = workloads.build(name, "embed", min_requests=32)
        assert len(many.requests) >= 32 and all(getattr(r, "texts", getattr(r, "documents", None)) for r in many.requests)
        assert len(many.reference_texts) <= 1.2 * len(default.reference_texts)
    assert [len(r.texts) for r in workloads.build("passages", "embed", min_requests=8).requests] == [16] * 16
    rerank = workloads.build("rerank", "embed", min_requests=8)
    assert len(rerank.requests) == 12 and all(32 <= len(r.documents) <= 100 for r in rerank.requests)


def test_batched_queries_are_the_queries_texts_sixteen_a_request():
    from encoderrt.runtime.tasks import ClassifyRequest, EmbedRequest, MultiVectorRequest

    for task, kind in (("embed", EmbedRequest), ("classify", ClassifyRequest), ("multi_vector", MultiVectorRequest)):
        single = workloads.build("queries", task, min_requests=32)
        batched = workloads.batched_queries(single, 32)
        assert [len(r.texts) for r in single.requests] == [1] * 512
        assert [len(r.texts) for r in batched.requests] == [16] * 32 and {type(r) for r in batched.requests} == {kind}
        assert [t for r in batched.requests for t in r.texts] == [r.texts[0] for r in single.requests]
        assert batched.reference_texts == single.reference_texts
    colbert = workloads.batched_queries(workloads.build("queries", "multi_vector"))
    assert all(r.side == "query" for r in colbert.requests)
    # 64 clients need 64 requests: 8 texts each
    many = workloads.batched_queries(workloads.build("queries", "embed", min_requests=64), 64)
    assert len(many.requests) == 64 and {len(r.texts) for r in many.requests} == {8}
    assert workloads.batched_queries(workloads.build("queries", "score")) is None  # pairs, not texts


def test_closed_loop_never_sends_a_request_still_in_flight():
    """Requests that finish out of order: a plain cycle through as many requests as clients re-sent running ones."""
    import asyncio
    import random

    from encoderrt.bench.runners import RunResult, closed_loop

    workload = workloads.build("passages", "embed", scale=0.1, min_requests=8)
    in_flight, seen, rng = set(), [], random.Random(0)

    async def call(request):
        assert id(request) not in in_flight
        in_flight.add(id(request))
        seen.append(id(request))
        await asyncio.sleep(rng.uniform(0, 0.004))
        in_flight.discard(id(request))
        return 3

    result = asyncio.run(closed_loop(call, workload, len(workload.requests), 0.05, RunResult("passages", "engine", 8)))
    assert len(seen) > len(workload.requests) and result.tokens == 3 * len(seen)
    assert set(seen[: len(workload.requests)]) == {id(r) for r in workload.requests}  # the first pass is whole


def test_closed_loop_refuses_fewer_requests_than_clients():
    import asyncio

    from encoderrt.bench.runners import RunResult, closed_loop

    workload = workloads.build("rerank", "embed", scale=0.1)

    async def call(request):
        return 1

    with pytest.raises(ValueError, match="would be in flight twice"):
        asyncio.run(closed_loop(call, workload, len(workload.requests) + 1, 0.1, RunResult("rerank", "engine", 1)))


def test_a_servers_result_cache_is_reported_as_what_the_figures_measure(tiny_artifacts, tmp_path, capsys):
    """`--url` against a server that keeps answers: the warm-up pass fills its cache, and every item of the measured
    round is answered from it (its /metrics says so), which the report says beside the figures."""
    from encoderrt.server import ServerSettings, create_app
    from server_helpers import ready_registry, running_server

    engine = Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=256, result_cache_mb=4)
    out = tmp_path / "report"
    with running_server(create_app(ServerSettings(), ready_registry(st=engine))) as url:
        code = main(["bench", str(tiny_artifacts["st-cls"]), "--url", url, "--mode", "http", "--workload", "queries",
                     "--concurrency", "2", "--duration", "0", "--scale", "0.05", "--out", str(out)])
    engine.close()
    assert code == 0, capsys.readouterr().err[-3000:]
    rows = json.loads((out / "report.json").read_text())["results"]
    assert [(r["workload"], r["cached_share"]) for r in rows] == [("queries", 1.0), ("queries-batched", 1.0)]
    assert ("from its result cache (--result-cache-mb), without running them: the bench repeats its texts, so those "
            "figures measure the cache, not the model: queries http at 2 100%, queries-batched http at 2 100%."
            ) in (out / "report.md").read_text().replace("\n", " ")


def test_server_cpu_is_a_median_over_rounds_and_runs_without_a_loop_figure_have_none():
    """A server that does not report its gRPC thread's CPU (an older one) gives gRPC runs no loop figure."""
    from encoderrt.bench.report import Measurement
    from encoderrt.bench.runners import RunResult, ServerCpu

    def run(mode, process, loop):
        return RunResult("queries", mode, 32, latencies=[0.01] * 100, server_cpu_s=ServerCpu(process, loop))

    grpc = Measurement("queries", "grpc", 32, runs=[run("grpc", seconds, None) for seconds in (0.4, 0.6, 0.5)])
    assert grpc.server_cpu_ms_per_request("process") == pytest.approx(5.0)
    assert grpc.server_cpu_ms_per_request("loop") is None
    http = Measurement("queries", "http", 32, runs=[run("http", 0.5, 0.07), run("http", 0.6, 0.06)])
    assert http.server_cpu_ms_per_request("loop") == pytest.approx(0.65)


def test_what_clients_on_the_servers_cores_leave_it_is_counted_from_the_bench_processs_cpu():
    """0.85 ms of CPU a request for the engine and its callers, 0.14 ms for an HTTP load's clients: on cores both
    keep busy, HTTP reaches at most 0.85 / 0.99 of the engine, whatever the server costs."""
    from encoderrt.bench.report import Measurement, Report
    from encoderrt.bench.runners import RunResult

    def run(mode, cpu_s, requests=2000):
        return RunResult("queries", mode, 32, items=requests, tokens=10 * requests, seconds=1.0,
                         latencies=[0.01] * requests, bench_cpu_s=cpu_s)

    report = Report(model={"name": "m", "task": "embed", "precision": "bf16", "target": "openvino", "parity": {}},
                    cpu={"model": "x", "cores": 2, "flags": []}, versions={}, ceilings=[], flops_per_token={})
    report.measurements += [Measurement("queries", "engine", 32, [run("engine", 1.7), run("engine", 1.9)]),
                            Measurement("queries", "http", 32, [run("http", 0.28, 2000), run("http", 0.30, 1000),
                                                                run("http", 0.27, 2000)])]
    engine, http = (report.row(m) for m in report.measurements)
    assert engine["bench_cpu_ms_per_request"] == pytest.approx(0.9) and engine["client_bound"] is None
    assert report.measurements[0].cores_busy() == pytest.approx(1.8)
    assert http["bench_cpu_ms_per_request"] == pytest.approx(0.14)  # rounds: 0.14, 0.30, 0.135
    assert http["client_bound"] == pytest.approx(0.9 / 1.04)
    assert "| queries | http | 32 | 0.140 | 0.900 | 1.80 of 2 | 0.87 |" in report.markdown()
    no_engine = Report(model=report.model, cpu=report.cpu, versions={}, ceilings=[], flops_per_token={})
    no_engine.measurements.append(report.measurements[1])
    assert no_engine.row(no_engine.measurements[0])["client_bound"] is None
    assert "clients run on" not in no_engine.markdown()


def test_figures_are_medians_of_per_round_ratios():
    """One disturbed round (the machine busy during the reference) moves neither the ratio nor the rate."""
    from encoderrt.bench.references import ReferenceResult
    from encoderrt.bench.report import Measurement, Report
    from encoderrt.bench.runners import RunResult

    def run(tokens_per_s):
        return RunResult("passages", "engine", 8, items=10, tokens=int(tokens_per_s), seconds=1.0)

    report = Report(model={"name": "m", "task": "embed", "precision": "bf16", "target": "openvino", "parity": {}},
                    cpu={}, versions={}, ceilings=[], flops_per_token={})
    report.measurements.append(Measurement("passages", "engine", 8, [run(3000), run(3300), run(2000)]))
    report.references["passages"] = {"torch": [ReferenceResult("passages", "torch", "st", 10, 1000, s) for s in (1.0, 1.1, 2.0)]}
    report.raw["passages"] = {8: [3100.0, 3500.0, 1000.0]}
    row = report.row(report.measurements[0])
    # per round: 3000/1000 = 3.0, 3300/909 = 3.63, 2000/500 = 4.0 -> median 3.63; the median run is 3000
    assert row["tokens_per_s"] == 3000 and abs(row["ratio_to_reference"] - 3.63) < 1e-9
    assert abs(row["engine_efficiency"] - 3000 / 3100) < 1e-9  # rounds: 0.968, 0.943, 2.0
    assert report.ratios() == {"passages/engine/c8/vs_reference": 3.63, "passages/engine/c8/vs_backend": round(3000 / 3100, 4)}


def test_without_matplotlib_the_report_is_written_without_plots(tmp_path, monkeypatch):
    """A serving install (the container images) has no matplotlib: the report's JSON and markdown are still written,
    and the plots are left out rather than the bench failing at its end."""
    import subprocess
    import sys

    code = """
import sys, json
sys.modules["matplotlib"] = None  # as if not installed: importing it raises ImportError
from pathlib import Path
from encoderrt.bench.report import Measurement, Report
from encoderrt.bench.runners import RunResult
report = Report(model={"name": "m", "task": "embed", "precision": "fp32", "target": "cpu", "parity": {}},
                cpu={"model": "x", "cores": 2, "flags": []}, versions={}, ceilings=[], flops_per_token={})
report.measurements.append(Measurement("passages", "engine", 1, [RunResult("passages", "engine", 1, 10, 1000, 1.0)]))
print(json.dumps([p.name for p in report.write(Path(sys.argv[1]))]))
"""
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == ["report.json", "report.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "report.md"]


def test_reference_kinds_are_checked():
    from encoderrt.bench.references import parse_kinds

    assert parse_kinds("torch,openvino,torch") == ("torch", "openvino")
    with pytest.raises(ValueError, match="unknown reference tensorflow"):
        parse_kinds("torch,tensorflow")


def test_a_slow_backend_is_measured_not_refused(controlled, tiny_artifacts, monkeypatch):
    """On a backend of 4,000 tokens/s, 8 clients of 64-passage requests queue more than admission's default 5 s of
    work: the bench's own engine takes them all, and a server that sheds load (`--url`) is waited for as clients
    do, where the bench used to stop with a traceback."""
    from controlled_backend import ControlledBackend
    from encoderrt.bench import runners
    from encoderrt.runtime import Engine
    from encoderrt.runtime.errors import Overloaded
    from encoderrt.runtime.tasks import EmbedRequest
    from encoderrt.server import ServerSettings, create_app
    from server_helpers import ready_registry, running_server

    def workload(size: int) -> workloads.Workload:
        texts = [workloads.passages(size, seed=seed) for seed in range(8)]
        return workloads.Workload("passages", [EmbedRequest(t) for t in texts], [t for ts in texts for t in ts], [])

    monkeypatch.setattr(ControlledBackend, "seconds_per_token", 1 / 4000)
    heavy = workload(64)
    with Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=512) as default:
        assert sum(default.count_tokens(r.texts) for r in heavy.requests) > 5 * 4000
        with pytest.raises(Overloaded):
            runners.run_engine(default, heavy, concurrency=8, duration=0.1)
    with runners.load_engine(tiny_artifacts["st-cls"], 512) as engine:
        assert runners.run_engine(engine, heavy, concurrency=8, duration=0.1).items == 8 * 64
    with Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=512, max_queue_seconds=0.5) as shedding:
        with running_server(create_app(ServerSettings(), ready_registry(st=shedding))) as url:
            assert runners.run_http(url, workload(16), concurrency=8, duration=0.1).items == 8 * 16


def test_a_missing_sentence_transformers_backend_is_one_line_naming_its_install(tiny_artifacts, tmp_path, monkeypatch,
                                                                                 capsys):
    """sentence-transformers itself raises a bare Exception without optimum; the bench says what to install, with
    the extra's brackets intact (rich markup once swallowed `[openvino]`)."""
    from encoderrt.bench import references

    monkeypatch.setattr(references, "_installed", lambda module: not module.startswith("optimum"))
    code = main(["bench", str(tiny_artifacts["st-cls"]), "--workload", "passages", "--concurrency", "1", "--duration",
                 "0.1", "--scale", "0.05", "--reference", "torch,openvino", "--out", str(tmp_path / "report")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "error: --reference openvino needs sentence-transformers' openvino backend" in err
    assert "pip install 'optimum-intel[openvino]'" in err


def test_error_lines_print_brackets_as_text():
    import io

    from rich.console import Console

    from encoderrt.cli import common

    out = io.StringIO()
    common.error(Console(file=out, width=40), "--ray needs Ray Serve: pip install 'encoderrt[ray]' ([red] in a path)")
    assert out.getvalue() == "error: --ray needs Ray Serve: pip install 'encoderrt[ray]' ([red] in a path)\n"


def test_the_backend_alone_keeps_every_stream_busy_across_passes(tiny_artifacts, monkeypatch):
    """Three 20 ms batches on two streams: a pass timed alone ends with one stream idle (40 ms a pass, 0.75 of what
    the streams can do); passes queued back to back lose that tail once per timing, not once per pass."""
    from encoderrt.bench import runners
    from encoderrt.runtime.manifest import read_manifest
    from encoderrt.runtime.throughput import real_tokens
    from tests.runtime.test_calibration import CostModel

    backend = CostModel(fixed=0.02, per_token=0.0, parallel_runs=2)
    monkeypatch.setattr(runners, "load_backend", lambda *args, **kwargs: backend)
    artifact = tiny_artifacts["st-cls"]
    workload = workloads.build("passages", "embed", scale=0.1)
    raw = runners.RawBackend(artifact, read_manifest(artifact), workload, max_batch_tokens=256)
    raw.batches = raw.batches[:3]
    raw.tokens = real_tokens(raw.batches)
    raw._pass_seconds = 0.04
    streams_rate = raw.tokens / (1.5 * 0.02)  # two streams busy all the time: 3 batches per 30 ms
    assert raw.run(duration=0.6) > 0.9 * streams_rate
    assert backend.most_at_once == 2


@pytest.mark.every_core
def test_the_backend_alone_loads_no_every_core_copy_it_never_runs(tiny_artifacts):
    """Its batches run on the streams (pass_seconds marks none alone): the session that runs a batch alone on every
    core, a second copy of the weights, is left out."""
    from encoderrt.bench import runners
    from encoderrt.runtime.manifest import read_manifest

    artifact = tiny_artifacts["st-cls"]
    raw = runners.RawBackend(artifact, read_manifest(artifact), workloads.build("queries", "embed", scale=0.1), 256)
    assert raw.backend.parallel_runs > 1  # streams, beside which the every-core session would be built
    assert not any(batch.alone for batch in raw.batches)
    assert not raw.backend.capabilities.runs_alone and raw.backend._alone is None


def test_a_multi_vector_model_is_benched_against_multi_vector_encoder(tiny_dir, compile_artifact, tmp_path, capsys):
    """A ColBERT model's rerank workload runs MaxSim in the engine and through /rerank, its reference is
    MultiVectorEncoder's encode_query / encode_document and its own similarity on the same lists; passages run as
    document vectors (vLLM's /pooling token_embed over HTTP)."""
    import tiny_models as tm

    artifact = compile_artifact(tm.colbert_folder(tiny_dir / "bench-colbert"), tmp_path / "colbert").path
    out = tmp_path / "report"

    code = main(["bench", str(artifact), "--mode", "both", "--concurrency", "1", "--duration", "0.3", "--scale", "0.1",
                 "--reference", "--out", str(out)])
    assert code == 0, capsys.readouterr().err[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert {(r["workload"], r["mode"]) for r in report["results"]} == {
        (w, m) for w in ("queries", "queries-batched", "passages", "rerank") for m in ("engine", "http")}
    for row in report["results"]:
        assert row["tokens_per_s"] > 0 and row["ratio_to_reference"] > 0
    (name,) = {p["name"] for kinds in report["references"].values() for passes in kinds.values() for p in passes}
    assert name == "MultiVectorEncoder.encode + MaxSim fp32, batch 32"


def test_bench_compiles_a_folder_at_the_precision_serve_would_and_refuses_it_of_an_artifact(tiny_models,
                                                                                          tiny_artifacts, tmp_path,
                                                                                          capsys, monkeypatch):
    from encoderrt.compile.cache import content_key
    from encoderrt.runtime.manifest import read_manifest

    monkeypatch.setenv("ENCODERRT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "report"
    code = main(["bench", str(tiny_models["st-cls"]), "--compile-precision", "int8", "--workload", "queries",
                 "--concurrency", "2", "--duration", "0", "--scale", "0.05", "--out", str(out)])
    assert code == 0, capsys.readouterr().err[-3000:]
    (artifact,) = (tmp_path / "cache").iterdir()
    assert artifact.name == content_key(tiny_models["st-cls"], "int8")
    assert json.loads((out / "report.json").read_text())["model"]["precision"] == "int8"
    capsys.readouterr()
    built = read_manifest(tiny_artifacts["st-cls"]).precision
    asked = "int8" if built != "int8" else "fp32"
    assert main(["bench", str(tiny_artifacts["st-cls"]), "--compile-precision", asked, "--out", str(out)]) == 2
    assert f"--compile-precision {asked} applies to model folders" in capsys.readouterr().err
