"""Bulk jobs (encoderrt/jobs): the job's vectors against sentence-transformers' encode, in input order with ids
intact, from every input format; bad rows reported; a job killed with SIGKILL and rerun equals the job run whole."""

import csv
import errno
import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from encoderrt.bench.workloads import passages, queries
from encoderrt.jobs import JobFailed, PairScores, embed_corpus, inputs
from encoderrt.jobs.job import JobSettings, load_engine

TEXTS = [*queries(850, seed=11), *passages(150, seed=12)]
SHARD_ROWS = 125
"""The corpus in 8 shards."""
random.Random(5).shuffle(TEXTS)


def write_jsonl(path: Path, rows) -> Path:
    with path.open("w", encoding="utf-8") as file:
        for row in rows:
            file.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


def read_output(folder: Path, column: str = "embedding") -> tuple[list, np.ndarray, list]:
    ids, vectors, tokens = [], [], []
    for shard in sorted(folder.glob("part-*.parquet")):
        table = pq.read_table(shard)
        ids += table.column("id").to_pylist()
        vectors.append(np.stack(table.column(column).to_numpy(zero_copy_only=False)))
        tokens += table.column("tokens").to_pylist() if "tokens" in table.column_names else []
    return ids, np.concatenate(vectors), tokens


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def engine(minilm_fp32):
    engine, _ = load_engine(minilm_fp32.path, JobSettings(), None)
    with engine:
        yield engine


@pytest.fixture(scope="module")
def reference(minilm_dir) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu").encode(TEXTS, batch_size=64)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "corpus.jsonl",
                       ({"doc": f"d{i:05d}", "text": t} for i, t in enumerate(TEXTS)))


@pytest.fixture(scope="module")
def whole_run(engine, corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("whole") / "out"
    summary = embed_corpus(corpus, out, engine=engine, id_field="doc", shard_rows=SHARD_ROWS)
    assert (summary.rows, summary.written, summary.rejected) == (len(TEXTS), len(TEXTS), 0)
    return out


def test_vectors_equal_sentence_transformers_in_input_order_with_ids_and_token_counts(whole_run, reference, minilm_dir):
    from transformers import AutoTokenizer

    ids, vectors, tokens = read_output(whole_run)
    assert ids == [f"d{i:05d}" for i in range(len(TEXTS))]
    assert vectors.shape == reference.shape
    assert cosines(vectors, reference).min() >= 0.99999
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir))
    assert tokens == [len(ids) for ids in tokenizer(TEXTS, truncation=True, max_length=256)["input_ids"]]
    job = json.loads((whole_run / "job.json").read_text())
    assert job["complete"] and job["rows"] == len(TEXTS) and len(job["shards"]) == 8
    assert not list(whole_run.glob(".*"))  # no partial file left behind


def test_every_input_format_gives_the_same_rows(engine, reference, tmp_path):
    rows = TEXTS[:300]
    text_file = tmp_path / "in.txt"
    text_file.write_text("".join(t + "\n" for t in rows), encoding="utf-8")
    with (tmp_path / "in.csv").open("w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(["text", "id"])
        # row 7 holds a line end: CSV quotes it, and the reader must keep it
        writer.writerows([t if i != 7 else t.replace(" ", "\n", 1), f"r{i}"] for i, t in enumerate(rows))
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(300)], "text": rows}), tmp_path / "in.parquet",
                   row_group_size=64)
    expected = reference[:300].copy()
    expected[7] = embed_corpus_row(engine, rows[7].replace(" ", "\n", 1))
    for name, options in (("in.txt", {}), ("in.csv", {"id_field": "id"}), ("in.parquet", {"id_field": "id"})):
        out = tmp_path / f"out-{name}"
        embed_corpus(tmp_path / name, out, engine=engine, shard_rows=128, **options)
        ids, vectors, _ = read_output(out)
        assert ids == (list(range(300)) if name == "in.txt" else [f"r{i}" for i in range(300)]), name
        wanted = reference[:300] if name != "in.csv" else expected
        assert cosines(vectors, wanted).min() >= 0.99999, name


def test_a_byte_order_mark_starting_a_file_is_not_part_of_its_first_row(engine, reference, tmp_path):
    """Windows tools (PowerShell's Out-File, Excel's "CSV UTF-8") start UTF-8 text with a BOM: the first JSON line
    was refused as invalid JSON, the CSV header's first column was not found, a text line carried it."""
    rows = TEXTS[:3]
    bom = "\ufeff"
    (tmp_path / "in.jsonl").write_text(bom + "".join(json.dumps({"id": f"r{i}", "text": t}) + "\r\n"
                                                     for i, t in enumerate(rows)), encoding="utf-8")
    (tmp_path / "in.csv").write_text(bom + "id,text\r\n" + "".join(f"r{i},{t}\r\n" for i, t in enumerate(rows)),
                                     encoding="utf-8")
    (tmp_path / "in.txt").write_text(bom + "".join(t + "\n" for t in rows), encoding="utf-8")
    for name in ("in.jsonl", "in.csv", "in.txt"):
        out = tmp_path / f"out-{name}"
        embed_corpus(tmp_path / name, out, engine=engine, **({} if name == "in.txt" else {"id_field": "id"}))
        ids, vectors, _ = read_output(out)
        assert ids == ([0, 1, 2] if name == "in.txt" else ["r0", "r1", "r2"]), name
        assert not list(out.glob("*.rejected.jsonl")), name
        assert cosines(vectors, reference[:3]).min() >= 0.99999, name


def test_a_parquet_file_that_cannot_be_read_is_named_and_the_shards_read_before_it_are_written(engine, reference,
                                                                                               tmp_path):
    (tmp_path / "garbage.parquet").write_bytes(b"PAR1" + bytes(range(256)) * 4)
    with pytest.raises(ValueError, match=r"garbage\.parquet is not a Parquet file pyarrow can read: "):
        embed_corpus(tmp_path / "garbage.parquet", tmp_path / "none", engine=engine)

    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": TEXTS[:120]}), path, row_group_size=40)
    data = bytearray(path.read_bytes())
    header = pq.ParquetFile(path).metadata.row_group(1).column(0).data_page_offset
    data[header:header + 64] = b"\xff" * 64  # the second row group's first page header no longer decodes
    path.write_bytes(bytes(data))
    with pytest.raises(JobFailed, match=r"in\.parquet: rows 40-79 of the file \(row group 2 of 3\) cannot be read: "
                                        r".*\(the shards before it are written\)"):
        embed_corpus(path, tmp_path / "out", engine=engine, shard_rows=20)
    ids, vectors, _ = read_output(tmp_path / "out")
    assert ids == list(range(40)) and cosines(vectors, reference[:40]).min() >= 0.99999


def test_a_csv_field_longer_than_the_csv_modules_limit_is_a_row_and_a_record_it_cannot_read_is_named(
        engine, tmp_path, monkeypatch):
    long_document = " ".join(TEXTS[850:]) * 8  # past the csv module's own limit of 131,072 characters
    assert len(long_document) > 131_072
    with (tmp_path / "in.csv").open("w", newline="", encoding="utf-8") as file:
        csv.writer(file).writerows([["text"], [TEXTS[0]], [long_document], [TEXTS[1]]])
    embed_corpus(tmp_path / "in.csv", tmp_path / "out", engine=engine)
    ids, vectors, _ = read_output(tmp_path / "out")
    expected = engine.embed([TEXTS[0], long_document, TEXTS[1]])  # cut at the model's limit, as any text is
    assert ids == [0, 1, 2] and cosines(vectors, expected).min() >= 0.99999

    # what the csv module cannot read, however it fails, is named; it is met counting the rows, before any runs
    monkeypatch.setattr(inputs, "CSV_FIELD_LIMIT", 1_000)
    with pytest.raises(ValueError, match=r"in\.csv: the record after byte [\d,]+ cannot be read: field larger than "
                                         r"field limit \(1000\)$"):
        embed_corpus(tmp_path / "in.csv", tmp_path / "stopped", engine=engine, shard_rows=1)
    assert not list((tmp_path / "stopped").glob("part-*"))


def test_a_shard_that_cannot_be_written_stops_the_job_named_leaving_no_half_file_and_a_rerun_resumes(
        engine, corpus, whole_run, tmp_path, monkeypatch):
    from encoderrt.jobs import shards

    real_fsync, synced = shards.os.fsync, []

    def full_disk(descriptor):
        synced.append(descriptor)
        if len(synced) == 2:  # the second shard's file
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(descriptor)

    monkeypatch.setattr(shards.os, "fsync", full_disk)
    with pytest.raises(JobFailed, match=r"shard 1 could not be written to .*: No space left on device \(the shards "
                                        r"before it are written; rerun the same command to resume\)"):
        embed_corpus(corpus, tmp_path / "out", engine=engine, id_field="doc", shard_rows=SHARD_ROWS)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["job.json", "part-00000.parquet"]
    monkeypatch.setattr(shards.os, "fsync", real_fsync)
    embed_corpus(corpus, tmp_path / "out", engine=engine, id_field="doc", shard_rows=SHARD_ROWS)
    assert read_output(tmp_path / "out")[0] == read_output(whole_run)[0]


def embed_corpus_row(engine, text: str) -> np.ndarray:
    return engine.embed([text])[0]


def test_npy_output_and_a_folder_of_shards_as_input(engine, reference, tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    write_jsonl(inputs / "b.jsonl", ({"text": t} for t in TEXTS[100:250]))
    write_jsonl(inputs / "a.jsonl", ({"text": t} for t in TEXTS[:100]))
    embed_corpus(inputs, tmp_path / "out", engine=engine, output_format="npy", shard_rows=64)
    shards = sorted((tmp_path / "out").glob("part-*.npy"))
    vectors = np.concatenate([np.load(s) for s in shards])
    ids = [i for s in shards for i in json.loads(s.with_suffix(".ids.json").read_text())]
    assert ids == list(range(250))  # a.jsonl first: a folder's files by name
    assert cosines(vectors, reference[:250]).min() >= 0.99999


def test_bad_rows_are_listed_with_their_ids_and_the_rest_embedded(engine, reference, tmp_path):
    lines = [json.dumps({"id": "ok0", "text": TEXTS[0]}), json.dumps({"id": "empty", "text": "  "}),
             json.dumps({"id": "number", "text": 5}), "{not json", json.dumps({"id": "none"}),
             json.dumps(["a", "list"]), json.dumps({"id": "ok1", "text": TEXTS[1]}),
             json.dumps({"id": "null", "text": None})]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(("\n".join(lines) + "\n").encode() + b'{"id": "latin1", "text": "caf\xe9"}\n')
    summary = embed_corpus(path, tmp_path / "out", engine=engine, id_field="id", shard_rows=4)
    assert (summary.rows, summary.written, summary.rejected) == (9, 2, 7)
    ids, vectors, _ = read_output(tmp_path / "out")
    assert ids == ["ok0", "ok1"] and cosines(vectors, reference[:2]).min() >= 0.99999
    rejected = [json.loads(line) for f in summary.rejected_files for line in f.read_text().splitlines()]
    assert [(r["row"], r["id"]) for r in rejected] == [(1, "empty"), (2, "number"), (3, 3), (4, "none"), (5, 5),
                                                      (7, "null"), (8, 8)]
    problems = [r["problem"] for r in rejected]
    assert "empty" in problems[0] and "int" in problems[1] and "JSON" in problems[2] and "missing" in problems[3]
    assert problems[5] == "its text field is null" and "UTF-8" in problems[6]

    with pytest.raises(JobFailed, match=r"row 1 \(id 'empty'\).*empty"):
        embed_corpus(path, tmp_path / "strict", engine=engine, id_field="id", shard_rows=4, on_error="fail")


def test_a_folder_of_another_job_or_of_other_files_is_refused(engine, corpus, whole_run, tmp_path):
    with pytest.raises(ValueError, match="different job.*shard_rows"):
        embed_corpus(corpus, whole_run, engine=engine, id_field="doc", shard_rows=400)
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not a job's output folder"):
        embed_corpus(corpus, other, engine=engine)
    assert (other / "notes.txt").read_text() == "keep me"
    with pytest.raises(ValueError, match="npy holds dense vectors"):
        embed_corpus(corpus, tmp_path / "x", engine=engine, kind=PairScores(), output_format="npy")
    with pytest.raises(ValueError, match="input not found"):
        embed_corpus(tmp_path / "missing.jsonl", tmp_path / "y", engine=engine)
    with pytest.raises(ValueError, match=r"--output .*notes.txt/out cannot be made: Not a directory"):
        embed_corpus(corpus, other / "notes.txt" / "out", engine=engine)  # a place no folder can be made


def test_an_input_without_read_permission_is_named_before_it_is_opened(engine, corpus, tmp_path, monkeypatch):
    real_access = os.access  # (the tests run as root, whom no permission stops: the check is what is tested)
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != corpus and real_access(path, mode))
    with pytest.raises(ValueError, match=r"cannot read .*corpus.jsonl: permission denied"):
        embed_corpus(corpus, tmp_path / "out", engine=engine)
    assert not (tmp_path / "out").exists()


def test_a_finished_job_rerun_computes_nothing(engine, corpus, whole_run):
    before = engine.stats.snapshot()["batches"]
    summary = embed_corpus(corpus, whole_run, engine=engine, id_field="doc", shard_rows=SHARD_ROWS)
    assert summary.rows == len(TEXTS) and engine.stats.snapshot()["batches"] == before


def test_killed_with_sigkill_and_rerun_it_equals_the_whole_run(minilm_fp32, corpus, whole_run, tmp_path, capsys):
    """The job killed at a random finished shard, rerun with the same command (in this process: cli.main): the same
    rows, none twice, none missing, and the shards finished before the kill are not computed again."""
    from encoderrt.cli import main

    out = tmp_path / "out"
    command = [sys.executable, "-m", "encoderrt.cli", "embed", str(corpus), "-o", str(out), "--model",
               str(minilm_fp32.path), "--id-field", "doc", "--shard-rows", str(SHARD_ROWS),
               "--max-batch-tokens", "2048"]
    env = {**os.environ, "CI": "true"}
    kill_after = random.Random().randint(1, 5)
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        job = out / "job.json"
        if job.is_file() and len(json.loads(job.read_text())["shards"]) >= kill_after:
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    process.wait(30)
    assert process.returncode == -signal.SIGKILL, process.stderr.read().decode()
    finished = {s["index"]: s for s in json.loads((out / "job.json").read_text())["shards"]}
    assert len(finished) >= kill_after and not json.loads((out / "job.json").read_text())["complete"]
    kept = {name: (out / name).stat().st_mtime_ns for s in finished.values() for name in s["files"]}

    code = main(command[3:])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"resuming: {len(finished) * SHARD_ROWS:,} of {len(TEXTS):,} rows" in err
    assert all((out / name).stat().st_mtime_ns == modified for name, modified in kept.items())
    ids, vectors, tokens = read_output(out)
    whole_ids, whole_vectors, whole_tokens = read_output(whole_run)
    assert ids == whole_ids and tokens == whole_tokens
    assert cosines(vectors, whole_vectors).min() >= 0.99999
    assert sorted(p.name for p in out.iterdir()) == ["job.json", *(f"part-{i:05d}.parquet" for i in range(8))]


def test_a_missing_input_is_told_before_the_model_is_compiled(tmp_path, monkeypatch):
    """Here and on Ray: the bundled model's compile (half a minute here, minutes for a large model) comes after the
    inputs are found, so a typo in a path costs nothing; so do a Parquet file's footer and its columns."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ENCODERRT_CACHE", str(cache))
    (tmp_path / "garbage.parquet").write_bytes(b"not parquet at all")
    with gzip.open(tmp_path / "zipped.jsonl.gz", "wt") as file:
        file.write(json.dumps({"text": "a text"}) + "\n")
    pq.write_table(pa.table({"body": ["a text"]}), tmp_path / "other.parquet")
    for ray in (False, True):
        with pytest.raises(ValueError, match="input not found"):
            embed_corpus(tmp_path / "missing.jsonl", tmp_path / "out", ray=ray)
        with pytest.raises(ValueError, match="garbage.parquet is not a Parquet file pyarrow can read"):
            embed_corpus(tmp_path / "garbage.parquet", tmp_path / "out", ray=ray)
        with pytest.raises(ValueError, match=r"other.parquet has no column text \(its columns: body\)"):
            embed_corpus(tmp_path / "other.parquet", tmp_path / "out", ray=ray)
        with pytest.raises(ValueError, match=r"zipped.jsonl.gz is gzip-compressed: .*\(gunzip zipped.jsonl.gz\)"):
            embed_corpus(tmp_path / "zipped.jsonl.gz", tmp_path / "out", ray=ray)
    assert not cache.exists() and not (tmp_path / "out").exists()


def test_the_command_names_bad_arguments_in_one_line(minilm_fp32, tmp_path, capsys, monkeypatch):
    from encoderrt.cli import main

    corpus = write_jsonl(tmp_path / "small.jsonl", ({"text": t} for t in TEXTS[:48]))
    cache = tmp_path / "cache"
    monkeypatch.setenv("ENCODERRT_CACHE", str(cache))  # the default model, were it compiled, would land here
    assert main(["embed", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "a")]) == 2
    assert "error: input not found" in capsys.readouterr().err
    assert not cache.exists()  # told before the default model was compiled (31 s here), not after
    # a flag of another output kind would be ignored: refused, naming the kinds that take it
    refused = {
        ("--sparse", "--dimensions", "8"): "--dimensions applies to token vectors (--multi-vector) and dense "
                                           "embeddings (the default), not to sparse weights (--sparse)",
        ("--top-k", "3"): "--top-k applies to sparse weights (--sparse), not to dense embeddings",
        ("--multi-vector", "--top-k", "3"): "--top-k applies to sparse weights (--sparse), not to token vectors",
        ("--sparse", "--dimensions", "4"): "--dimensions applies to token vectors (--multi-vector) and dense "
                                           "embeddings (the default), not to sparse weights",
        ("--multi-vector", "--normalize", "--precision", "int8", "--dimensions", "4"):
            "--precision and --normalize apply to dense embeddings (the default), not to token vectors",
        ("--sparse", "--no-normalize", "--top-k", "2"): "--normalize applies to dense embeddings",
        ("--pool-factor", "2"): "--pool-factor applies to token vectors (--multi-vector), not to dense embeddings",
        ("--multi-vector", "--pool-factor", "0.5"): "pool_factor must be a finite number of at least 1, got 0.5",
        ("--sparse", "--top-k", "0"): "top_k must be a positive integer, got 0",
    }
    refused[("--ray-actors", "2", "--ray-cpus-per-actor", "2")] = ("--ray-actors and --ray-cpus-per-actor apply to a "
                                                                   "job on Ray (--ray or --ray-address)")
    for flags, message in refused.items():
        assert main(["embed", str(corpus), "-o", str(tmp_path / "b"), *flags]) == 2
        assert message in capsys.readouterr().err
    with monkeypatch.context() as environment:  # a value from the environment is named by its variable too
        environment.setenv("ENCODERRT_TOP_K", "3")
        assert main(["embed", str(corpus), "-o", str(tmp_path / "b")]) == 2
        assert "--top-k (ENCODERRT_TOP_K is set) applies to sparse weights" in capsys.readouterr().err
    assert not (tmp_path / "b").exists() and not cache.exists()
    # an embedding model has no sparse output (the sparse kind's own flag passes): the job stops at its first
    # shard, naming why, and writes no shard
    assert main(["embed", str(corpus), "-o", str(tmp_path / "c"), "--model", str(minilm_fp32.path), "--sparse",
                 "--top-k", "3", "--max-batch-tokens", "2048"]) == 1
    err = capsys.readouterr().err
    assert "shard 0" in err and "sparse" in err and "Traceback" not in err
    assert not list((tmp_path / "c").glob("part-*"))
    # the same folder, the right arguments: a job that wrote nothing is no other job's output to protect
    assert main(["embed", str(corpus), "-o", str(tmp_path / "c"), "--model", str(minilm_fp32.path),
                 "--max-batch-tokens", "2048", "--shard-rows", "24"]) == 0
    assert len(list((tmp_path / "c").glob("part-*.parquet"))) == 2


def test_a_folder_compiles_at_the_jobs_precision_and_an_artifact_is_used_as_built(tiny_models, minilm_fp32, tmp_path,
                                                                                  capsys, monkeypatch):
    from encoderrt.cli import main
    from encoderrt.compile.cache import content_key
    from encoderrt.runtime import Engine
    from encoderrt.runtime.manifest import read_manifest

    monkeypatch.setenv("ENCODERRT_CACHE", str(tmp_path / "cache"))
    corpus = write_jsonl(tmp_path / "small.jsonl", ({"text": t} for t in TEXTS[:40]))
    folder = tiny_models["st-cls"]
    assert main(["embed", str(corpus), "-o", str(tmp_path / "int8"), "--model", str(folder),
                 "--compile-precision", "int8"]) == 0
    (artifact,) = (tmp_path / "cache").iterdir()
    assert artifact.name == content_key(folder, "int8") and read_manifest(artifact).precision == "int8"
    _, vectors, _ = read_output(tmp_path / "int8")
    with Engine.load(artifact) as engine:
        served = engine.embed(TEXTS[:40])
    # int8 quantises activations by each batch's own range, so the job's batches round otherwise than one call's:
    # on an AVX2-only CPU (uint8 weights) the same artifact's rows moved by up to 3.1e-3 in cosine between batchings
    assert cosines(vectors, served).min() >= 0.99
    # and they keep int8's promise against sentence-transformers fp32 (docs/compile.md)
    from sentence_transformers import SentenceTransformer

    against_reference = cosines(vectors, SentenceTransformer(str(folder), device="cpu").encode(TEXTS[:40]))
    assert against_reference.min() >= 0.98 and against_reference.mean() >= 0.995
    capsys.readouterr()

    # an fp32 artifact asked for bf16 would run in fp32 all the same: refused before any output is made
    assert main(["embed", str(corpus), "-o", str(tmp_path / "bf16"), "--model", str(minilm_fp32.path),
                 "--compile-precision", "bf16"]) == 2
    assert (f"--compile-precision bf16 applies to model folders, which compile on first use; {minilm_fp32.path} is "
            "an artifact built in fp32 on ") in capsys.readouterr().err
    assert not (tmp_path / "bf16").exists()
    with pytest.raises(ValueError, match="artifact built in fp32"):
        embed_corpus(corpus, tmp_path / "bf16", minilm_fp32.path, compile_precision="bf16")


def test_the_python_api_refuses_values_it_would_ignore(engine, corpus, tmp_path, minilm_fp32):
    from encoderrt.jobs import Embeddings
    from encoderrt.runtime import EngineConfig

    # each of these ran before: xml wrote Parquet, "ignore" skipped as "skip" does
    for settings, message in (({"output_format": "xml"}, "output_format must be 'parquet' or 'npy', got 'xml'"),
                              ({"on_error": "ignore"}, "on_error must be 'skip' or 'fail', got 'ignore'"),
                              ({"input_format": "xml"}, "input_format must be one of 'auto', 'jsonl', 'csv'"),
                              ({"compile_precision": "fp16"}, "compile_precision must be one of 'auto', 'fastest'")):
        with pytest.raises(ValueError, match=message):
            embed_corpus(corpus, tmp_path / "out", engine=engine, **settings)
    with pytest.raises(ValueError, match="precision must be one of 'float32', 'int8', 'uint8', 'binary' or 'ubinary'"):
        embed_corpus(corpus, tmp_path / "out", engine=engine, kind=Embeddings(precision="int4"))
    # an engine already loaded is the job's model: what would pick or build another is refused beside it
    with pytest.raises(ValueError, match="model, config, compile_precision, ray: do not apply beside an engine"):
        embed_corpus(corpus, tmp_path / "out", minilm_fp32.path, engine=engine, config=EngineConfig(),
                     compile_precision="bf16", ray=True)
    with pytest.raises(ValueError, match="^model: does not apply beside an engine already loaded"):
        embed_corpus(corpus, tmp_path / "out", minilm_fp32.path, engine=engine)
    assert not (tmp_path / "out").exists()
