"""--target auto / --precision auto: candidates are built, measured here, and the fastest eligible one is kept."""

import time
import weakref

import numpy as np
import pytest

from encoderrt.compile import CompileOptions, compile_model, selection
from encoderrt.compile.progress import StepReporter
from encoderrt.compile.selection import Candidate, plan
from encoderrt.runtime.backends import openvino as openvino_backend
from encoderrt.runtime.backends.onnxruntime_cpu import OnnxRuntimeBackend
from encoderrt.runtime.backends.openvino import OpenVinoBackend
from encoderrt.runtime.manifest import read_manifest

pytest.importorskip("openvino", reason="the choice between targets needs OpenVINO (a default dependency)")


def _slowed(cls, monkeypatch, seconds=0.05):
    """Make every run of one backend class really slower, as a slow candidate would be."""
    real = cls.run

    def slow(self, feeds):
        time.sleep(seconds)
        return real(self, feeds)

    monkeypatch.setattr(cls, "run", slow)


def _auto(source, out, **options):
    return compile_model(CompileOptions(model_dir=source, output_dir=out, quiet=True, **options))


def test_plan_follows_the_cpu(monkeypatch):
    options = CompileOptions(model_dir=None, output_dir=None)
    monkeypatch.setattr(openvino_backend, "native_bf16", lambda: True)
    assert plan(options) == [Candidate("cpu", "fp32"), Candidate("openvino", "fp32"), Candidate("openvino", "bf16")]
    fastest = CompileOptions(model_dir=None, output_dir=None, precision="fastest")
    assert plan(fastest) == plan(options)  # the same candidates; only the rule that keeps one differs
    monkeypatch.setattr(openvino_backend, "native_bf16", lambda: False)
    assert plan(options) == [Candidate("cpu", "fp32"), Candidate("openvino", "fp32")]  # no emulated bf16
    assert plan(fastest) == plan(options)
    assert plan(CompileOptions(model_dir=None, output_dir=None, precision="int8")) == [Candidate("cpu", "int8"),
                                                                                         Candidate("openvino", "int8")]


@pytest.mark.parametrize("free_bytes", [None, 1], ids=["together", "one-at-a-time"])
@pytest.mark.parametrize("slow, expected", [(OpenVinoBackend, "cpu"), (OnnxRuntimeBackend, "openvino")])
def test_the_measured_fastest_candidate_is_kept(slow, expected, free_bytes, tiny_models, tmp_path, monkeypatch,
                                                capsys):
    """Through compile-model as a user runs it: each candidate's speed is said, and the fastest is kept; where the
    candidates would not fit in memory together, they are measured one at a time, none loaded beside another, and
    without a lone-run copy of the weights either way."""
    from encoderrt.cli import compile_model_main

    monkeypatch.setattr(openvino_backend, "native_bf16", lambda: False)  # two fp32 candidates, both exact
    _slowed(slow, monkeypatch)
    if free_bytes is not None:
        monkeypatch.setattr(selection, "free_memory", lambda: free_bytes)
    alive, most, options = set(), [0], []
    real_load = selection.load_backend

    def load_backend(manifest, folder, backend_options):
        backend = real_load(manifest, folder, backend_options)
        options.append((backend_options, backend.capabilities.runs_alone))
        alive.add(id(backend))
        most[0] = max(most[0], len(alive))
        weakref.finalize(backend, alive.discard, id(backend))
        return backend

    monkeypatch.setattr(selection, "load_backend", load_backend)
    assert compile_model_main([str(tiny_models["st-cls"]), "-o", str(tmp_path / "out")]) == 0
    assert most[0] == (2 if free_bytes is None else 1) and len(options) == 2
    assert not any(o.lone_runs or runs_alone for o, runs_alone in options)  # two cores: streams, no lone copy
    out = capsys.readouterr().out
    manifest = read_manifest(tmp_path / "out")  # the choice is recorded in the artifact
    record = manifest.selection
    assert manifest.target == expected and manifest.precision == "fp32"
    rates = {c["target"]: c["tokens_per_s"] for c in record["candidates"]}
    assert set(rates) == {"cpu", "openvino"} and rates[expected] == max(rates.values())
    assert record["chosen"]["target"] == expected and record["measured_tokens"] > 0
    assert ("one candidate at a time" in record["measured"]) == (free_bytes is not None)
    for target, rate in rates.items():  # compile-model's summary, a line per candidate
        assert f"{'chosen' if target == expected else 'measured':<10} fp32 on {target}: {rate:.0f} tokens/s" in out
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"manifest.json", "tokenizer.json"}


def _bf16_like_error(monkeypatch, step=0.08):
    """On a CPU without bf16 the bf16 candidate runs in f32 and is exact; round its logits to `step` so that
    they move by up to step/2, as the tiny cross-encoder's bf16 logits do (~0.04, measured on AMX)."""
    real = OpenVinoBackend.run

    def rounded(self, batch):
        outputs = real(self, batch)
        if "bf16 asked for" not in self.execution:
            return outputs
        return {name: (np.round(out / step) * step).astype(out.dtype) for name, out in outputs.items()}

    monkeypatch.setattr(OpenVinoBackend, "run", rounded)


def _bf16_measured_faster(tiny_models, tmp_path, monkeypatch, precision):
    """Compile the tiny cross-encoder with bf16 measured fastest, as on a CPU with AMX; returns the result, each
    candidate's record and compile's notes."""
    if not openvino_backend.native_bf16():
        _bf16_like_error(monkeypatch)
    monkeypatch.setattr(openvino_backend, "native_bf16", lambda: True)
    _slowed(OnnxRuntimeBackend, monkeypatch)
    real_pass = selection.pass_seconds
    monkeypatch.setattr(selection, "pass_seconds",  # bf16 measured faster, as on a CPU with AMX
                        lambda backend, batches: real_pass(backend, batches) / (4 if "bf16" in backend.execution else 1))
    notes: list[str] = []
    reporter = StepReporter(quiet=True)
    monkeypatch.setattr(reporter, "note", notes.append)
    result = compile_model(CompileOptions(model_dir=tiny_models["bert-cross-encoder"], output_dir=tmp_path / "ce",
                                          precision=precision, quiet=True), reporter)
    return result, {(c["target"], c["precision"]): c for c in result.manifest.selection["candidates"]}, notes


def test_bf16_is_chosen_only_where_it_meets_the_lossless_tier(tiny_models, tmp_path, monkeypatch):
    """The tiny cross-encoder's bf16 logits move by ~0.04: fine for --precision bf16, not for auto. Where it was
    faster, compile says by how much and how to take it."""
    result, records, notes = _bf16_measured_faster(tiny_models, tmp_path, monkeypatch, "auto")
    bf16 = records[("openvino", "bf16")]
    assert bf16["lossless"] is False and bf16["eligible"] is False
    score_diff = bf16["parity"]["max_abs_score_diff"]
    assert score_diff > 1e-3 and f"max |score difference| {score_diff:.2e} > 0.001" in bf16["reason"]
    assert "lossless" in bf16["reason"]
    assert (result.manifest.target, result.manifest.precision) == ("openvino", "fp32")
    assert result.manifest.parity["max_abs_score_diff"] <= 1e-3
    speedup = bf16["tokens_per_s"] / records[("openvino", "fp32")]["tokens_per_s"]
    assert f"bf16 on openvino ran {speedup:.1f}x as fast as the chosen fp32 on openvino" in notes[-1]
    assert ("--precision fastest (serve, embed and bench: --compile-precision fastest) takes it where a CPU computes "
            "bf16 natively") in notes[-1]
    assert notes[-1].endswith("--target openvino --precision bf16 builds it")


def test_fastest_takes_bf16_at_its_own_tolerance(tiny_models, tmp_path, monkeypatch):
    """--precision fastest: the same candidates as auto, bf16 held to its own tolerance only, so the faster bf16
    that auto kept out is the artifact, and its parity is still checked (and recorded) at bf16's tolerance."""
    result, records, notes = _bf16_measured_faster(tiny_models, tmp_path, monkeypatch, "fastest")
    bf16 = records[("openvino", "bf16")]
    assert bf16["eligible"] is True and bf16["reason"] is None and bf16["lossless"] is False
    assert bf16["tokens_per_s"] == max(r["tokens_per_s"] for r in records.values())
    assert (result.manifest.target, result.manifest.precision) == ("openvino", "bf16")
    assert result.manifest.parity["tolerance"] == {"max_abs_logit_diff": 0.15, "min_spearman": 0.98}
    assert result.manifest.parity["max_abs_logit_diff"] <= 0.15
    assert "its own precision's tolerance" in result.manifest.selection["rule"]
    assert not any("ran" in note and "as fast as the chosen" in note for note in notes)


def _slowed_alone(cls, monkeypatch, seconds=0.03):
    """Make one backend class's lone runs (a batch marked alone, as an idle server runs a lone query) really
    slower, and nothing else."""
    real = cls.run

    def slow(self, batch):
        if batch.alone:
            time.sleep(seconds)
        return real(self, batch)

    monkeypatch.setattr(cls, "run", slow)


@pytest.mark.parametrize("free_bytes", [None, 1], ids=["together", "one-at-a-time"])
@pytest.mark.parametrize("openvino_faster_by, slow_alone, expected", [
    (1.03, [OpenVinoBackend], "cpu"),  # as fast in batches, far slower alone: the lone query decides
    (1.03, [OpenVinoBackend, OnnxRuntimeBackend], "openvino"),  # as fast alone too: the faster in batches
    (1.10, [OpenVinoBackend], "openvino"),  # faster in batches by more than the tie: no lone query is timed
], ids=["lone-query-decides", "lone-query-ties", "no-tie"])
def test_of_candidates_as_fast_the_one_that_answers_a_lone_query_sooner_is_kept(
        openvino_faster_by, slow_alone, expected, free_bytes, tiny_models, tmp_path, monkeypatch):
    """Throughput within THROUGHPUT_TIE of the fastest is a tie (compile's measurement spreads by a few percent);
    then the tied candidates are loaded as a server loads them, together where they fit in memory (else one at a
    time), and timed on lone queries, and one LONE_GAIN sooner is kept, with the figures recorded and said."""
    monkeypatch.setattr(openvino_backend, "native_bf16", lambda: False)  # two fp32 candidates, both exact
    monkeypatch.setattr(selection, "pass_seconds",  # the batches' speed as measured: fixed, so the test is exact
                        lambda backend, batches: 1.0 / (openvino_faster_by if "openvino" in backend.execution else 1))
    if free_bytes is not None:
        monkeypatch.setattr(selection, "free_memory", lambda: free_bytes)
    for cls in slow_alone:
        _slowed_alone(cls, monkeypatch)
    alive, most, loads = set(), [0], []
    real_load = selection.load_backend

    def load_backend(manifest, folder, backend_options):
        backend = real_load(manifest, folder, backend_options)
        if backend_options.lone_runs:
            alive.add(id(backend))
            most[0] = max(most[0], len(alive))
            weakref.finalize(backend, alive.discard, id(backend))
            loads.append(manifest.target)
        return backend

    monkeypatch.setattr(selection, "load_backend", load_backend)
    notes: list[str] = []
    reporter = StepReporter(quiet=True)
    monkeypatch.setattr(reporter, "note", notes.append)
    result = compile_model(CompileOptions(model_dir=tiny_models["st-cls"], output_dir=tmp_path / "out", quiet=True),
                           reporter)
    record = result.manifest.selection
    records = {c["target"]: c for c in record["candidates"]}
    assert result.manifest.target == record["chosen"]["target"] == expected
    assert records["openvino"]["tokens_per_s"] == pytest.approx(openvino_faster_by * records["cpu"]["tokens_per_s"],
                                                                rel=1e-3)
    if openvino_faster_by > 1 + selection.THROUGHPUT_TIE:
        assert loads == [] and not any("lone_query_ms" in c for c in records.values())
        return
    assert sorted(loads) == ["cpu", "openvino"]  # each with the copy that runs a lone batch, where it has cores
    assert most[0] == (2 if free_bytes is None else 1)
    lone = {target: c["lone_query_ms"] for target, c in records.items()}
    assert lone["openvino"] > 30 if OnnxRuntimeBackend not in slow_alone else min(lone.values()) > 30  # the sleeps
    for target, c in records.items():
        assert f"{'chosen' if target == expected else 'candidate'} fp32 on {target}: {c['tokens_per_s']:.0f} " \
               f"tokens/s, a lone query {c['lone_query_ms']:.1f} ms" in notes
    gain = lone["openvino"] / lone["cpu"]
    said = [note for note in notes if "answers a lone query" in note]
    if expected == "cpu":
        assert gain >= selection.LONE_GAIN
        assert said == [f"fp32 on cpu ran within 5% of fp32 on openvino's throughput and answers a lone query "
                        f"{gain:.1f}x as fast; --target openvino --precision fp32 builds the other"]
    else:
        assert gain < selection.LONE_GAIN and said == []
    assert "within 5% of it the one that answers a lone query 1.2x as fast" in record["rule"]
