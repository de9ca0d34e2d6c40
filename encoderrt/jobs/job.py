"""A bulk job on one machine: input rows -> shards of `shard_rows` -> engine requests -> one output file a shard, in
input order.

A shard's rows are sorted by length and sent as requests of CHUNK_ROWS rows, IN_FLIGHT at a time: the
scheduler's queue holds thousands of rows, so every batch is cut from close neighbours in length (cutting a batch
costs the batch, not the queue: runtime/waiting.py), while each request is tokenised as the ones before it run;
the next shard is read and its requests queued while the engine runs the current one. Shards are written in order as
they finish. Memory holds two shards and nothing else, whatever the corpus size.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from encoderrt.compile.cache import PRECISION_HELP, CachePrecision
from encoderrt.jobs.inputs import Corpus, Fields, InputFormat, Position, Row, UnreadableInput, resolve
from encoderrt.jobs.outputs import Output
from encoderrt.jobs.progress import Progress, Summary
from encoderrt.jobs.shards import OutputFolder, ShardRecord, identity_of, manifest_hash, shard_name
from encoderrt.runtime import Engine, EngineConfig
from encoderrt.runtime.errors import InvalidRequest
from encoderrt.runtime.settings import check_choices, declared_setting, setting


@dataclass(frozen=True)
class JobSettings:
    """How a job reads its input and writes its output (what it computes is its `Output`)."""

    input_format: InputFormat = setting(
        "auto", "how to read the inputs; auto: by suffix (.jsonl/.json/.ndjson, .csv, .tsv, .parquet; else text "
        "lines)")
    text_field: str = setting("text", "the field (JSON key, CSV column, Parquet column) holding the text",
                              metavar="NAME")
    id_field: str | None = setting(None, "the field holding each row's id", metavar="NAME",
                                   shown="the row's number, from 0, across the inputs")
    query_field: str = setting("query", "the field holding a pair's query (score)", metavar="NAME")
    document_field: str = setting("document", "the field holding a pair's document (score)", metavar="NAME")
    output_format: Literal["parquet", "npy"] = setting(
        "parquet", "Parquet shards (ids, vectors as fixed-size lists, token counts), or NumPy .npy shards with the "
        "ids beside them in JSON (dense vectors only)")
    shard_rows: int = setting(10_000, "input rows a shard holds: a resumed job redoes at most one shard",
                              metavar="N")
    include_text: bool = setting(False, "write each row's text beside its output")
    on_error: Literal["skip", "fail"] = setting(
        "skip", "a bad row (missing, empty or non-string text, invalid JSON or UTF-8): skip it, listing it in the "
        "shard's .rejected.jsonl, or stop the job at its shard (finished shards are kept)")
    overwrite: bool = setting(False, "start again where --output holds a different job's output")
    compile_precision: CachePrecision = setting("auto", PRECISION_HELP)

    def __post_init__(self) -> None:
        check_choices(self)
        if self.shard_rows < 1:
            raise ValueError(f"shard_rows must be positive, got {self.shard_rows}")


class JobFailed(Exception):
    """A bad row under `on_error="fail"`, or a shard the engine refused; finished shards are kept."""


CHUNK_ROWS = 1024
"""Rows per engine request. all-MiniLM-L6-v2 bf16, AMX, 20,000 passages at the job's 2,048-token budget, medians
of 3 alternating rounds against the backend alone: 0.87x at 64 rows (padding efficiency 0.976: 256 rows waiting
are 8 batches' worth), 0.90x at 512, 0.92x at 1,024, 0.91x at 2,048, 0.92x with the whole 10,000-row shard."""
IN_FLIGHT = 4


@dataclass
class _Shard:
    index: int
    start: Position
    end: Position
    rows: list[Row] = field(default_factory=list)
    good: list[Row] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    """The good rows' indices, shortest text first: the order the requests carry them in."""
    futures: list[Future] = field(default_factory=list)
    started: float = 0.0


def run_job(corpus: Corpus, output: str | Path, kind: Output, engine: Engine, artifact: Path,
            job: JobSettings = JobSettings(), progress: Progress | None = None) -> Summary:
    """The job over `corpus` (open_inputs'), run here on `engine` (loaded from `artifact`); a rerun with the same
    arguments resumes it."""
    folder = open_output(corpus, output, kind, engine.info.name, artifact, job)
    progress = progress or Progress(enabled=False)
    started, before = time.perf_counter(), engine.stats.snapshot()
    total = corpus.count()
    progress.start(total, folder.done_rows)
    try:
        if not folder.complete:
            _run_shards(corpus, folder, kind, engine, job, progress)
            folder.finish(total)
    finally:
        progress.stop()
    after = engine.stats.snapshot()
    real, padded = (after[key] - before[key] for key in ("real_tokens", "padded_tokens"))
    summary = Summary.of(folder.shards.values(), time.perf_counter() - started, folder.root, real,
                         real / padded if padded else None)
    progress.finish(summary)
    return summary


def _run_shards(corpus: Corpus, folder: OutputFolder, kind: Output, engine: Engine, job: JobSettings,
                progress: Progress) -> None:
    first, position = folder.resume_position()
    unreadable = None
    with ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="encoderrt-job") as pool:
        pending: deque[_Shard] = deque()
        try:
            for shard in _shards(corpus, position, first, job.shard_rows, folder):
                _check_rows(shard, job, pending, folder, kind, corpus, progress)
                shard.started = time.perf_counter()
                shard.order, shard.futures = submit_rows(pool, engine, kind, [row.values for row in shard.good])
                pending.append(shard)
                while len(pending) > 1 or (pending and not pending[0].futures):
                    _write(pending.popleft(), folder, kind, corpus, job, progress)
        except UnreadableInput as exc:  # the shards read before it are still written
            unreadable = exc
        while pending:
            _write(pending.popleft(), folder, kind, corpus, job, progress)
    if unreadable is not None:
        raise JobFailed(f"{unreadable} (the shards before it are written)") from None


def load_engine(model: str | Path | None, job: JobSettings, config: EngineConfig | None = None,
                reporter=None) -> tuple[Engine, Path]:
    """The engine for an artifact folder, a model folder (compiled into the cache once) or None (the bundled
    model), with the queue limits a job needs."""
    artifact, _ = job_artifact(model, job, reporter)
    settings = job_engine_config(job, config or EngineConfig())
    return Engine.load(artifact, settings), artifact


def job_artifact(model: str | Path | None, job: JobSettings, reporter=None) -> tuple[Path, str | None]:
    """The artifact a job runs: an artifact folder as built, a model folder compiled into the cache once at
    the job's `compile_precision`, or None (the bundled model); problems are ValueErrors naming them."""
    from encoderrt.compile.cache import artifact_for

    try:
        return artifact_for(None if model is None else Path(model), reporter, job.compile_precision,
                            declared_setting(JobSettings, "compile_precision").given_as())
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from None


def open_inputs(inputs: list[str | Path], kind: Output, job: JobSettings) -> Corpus:
    """The inputs, checked as far as they can be without the model: every problem found here is a ValueError naming
    it. The entry points open them before they load or compile the model, so that a missing file is reported at once
    rather than after a compile of minutes."""
    if job.output_format == "npy" and not kind.dense:
        raise ValueError(f"--output-format npy holds dense vectors; {kind.name} output is written as Parquet")
    names = (job.text_field,) if kind.fields == 1 else (job.query_field, job.document_field)
    return Corpus(resolve(inputs), Fields(names, job.id_field), job.input_format)


def open_output(corpus: Corpus, output: str | Path, kind: Output, model: str, artifact: Path,
                job: JobSettings) -> OutputFolder:
    """The output folder of this job over `corpus`, checked (a folder of another job's is refused): every problem
    found here is a ValueError naming it."""
    identity = identity_of(kind=kind.settings(), model=model, artifact_sha256=manifest_hash(artifact),
                           inputs=corpus.fingerprint(), shard_rows=job.shard_rows, output_format=job.output_format,
                           include_text=job.include_text, fields={"values": corpus.fields.values, "id": job.id_field})
    return OutputFolder(Path(output), identity, job.overwrite)


def job_engine_config(job: JobSettings, config: EngineConfig = EngineConfig()) -> EngineConfig:
    """A job queues two shards at once and waits as long as they take: no admission limit refuses them, a
    multi-vector shard returns every token's vector, its batches are as big as throughput allows, and none runs
    alone while the queue is that deep, so no every-core copy of the weights is loaded for it.

    The budget is calibrated for throughput, and the deep queue's budget (1,024 tokens where the calibration lands
    below it) applies, as the job's queue is always deep: that calibration landed on 512 in one load and on 2,048
    in another, and against the backend alone at 1,024, jobs ran 0.816x at 512, 0.905x at 1,024 and 0.890x at 2,048
    (all-MiniLM-L6-v2 bf16, 2-core Sapphire Rapids, 20,000 passages, three alternating rounds in one process)."""
    return replace(config, calibrate_for="throughput", max_queue_items=max(config.max_queue_items, 4 * job.shard_rows),
                   max_queue_seconds=float("inf"), max_token_embeddings=max(config.max_token_embeddings, 2**31 - 1),
                   lone_runs=False)


def _shards(corpus: Corpus, position: Position, first: int, size: int, folder: OutputFolder) -> Iterator[_Shard]:
    """Shards from `first` on; those already finished (a Ray job's, out of order) are read past, not run."""
    index, shard = first, _Shard(first, position, position)
    for row, after in corpus.rows(position):
        shard.rows.append(row)
        shard.end = after
        if len(shard.rows) == size:
            if index not in folder.shards:
                yield shard
            index += 1
            shard = _Shard(index, after, after)
    if shard.rows and index not in folder.shards:
        yield shard


def _check_rows(shard: _Shard, job: JobSettings, pending: deque[_Shard], folder: OutputFolder, kind: Output,
                corpus: Corpus, progress: Progress) -> None:
    shard.good = [row for row in shard.rows if row.problem is None]
    if job.on_error == "fail" and len(shard.good) < len(shard.rows):
        bad = next(row for row in shard.rows if row.problem is not None)
        while pending:  # the shards before it are finished and kept
            _write(pending.popleft(), folder, kind, corpus, job, progress)
        raise JobFailed(f"row {bad.row} (id {bad.id!r}) of {corpus.files[bad.file]}: {bad.problem}; the shards "
                        "before it are written (--on-error skip lists bad rows in a side file and goes on)")


def _write(shard: _Shard, folder: OutputFolder, kind: Output, corpus: Corpus, job: JobSettings,
           progress: Progress) -> None:
    try:
        value, row_tokens, tokens = rows_answered(shard.order, shard.futures)
    except InvalidRequest as exc:
        raise JobFailed(f"shard {shard.index} (rows {shard.start.row}-{shard.end.row - 1}): {exc}") from None
    finished = FinishedShard(shard.index, shard.start, shard.end, len(shard.rows), shard.good,
                             [row for row in shard.rows if row.problem is not None], value, row_tokens, tokens)
    write_shard(finished, folder, kind, job, corpus.fields, time.perf_counter() - shard.started, progress)


@dataclass(frozen=True)
class FinishedShard:
    """A shard's answer, whichever way it ran (here or on Ray)."""

    index: int
    start: Position
    end: Position
    rows: int
    good: list[Row]
    """The rows computed, in input order."""
    rejected: list[Row]
    value: Any
    """The kind's answer for `good`, in the same order (None: no good rows)."""
    row_tokens: list[int] | None
    tokens: int


def write_shard(shard: FinishedShard, folder: OutputFolder, kind: Output, job: JobSettings, fields: Fields,
                seconds: float, progress: Progress) -> None:
    contents = _output_files(shard, kind, job, fields) if shard.good else []
    if shard.rejected:
        contents.append((shard_name(shard.index, ".rejected.jsonl"),
                         lambda path: _write_rejected(path, shard.rejected)))
    record = ShardRecord(shard.index, shard.start, shard.end, shard.rows, len(shard.good), len(shard.rejected),
                         shard.tokens, round(seconds, 3), tuple(name for name, _ in contents))
    try:
        folder.write(record, contents)
    except OSError as exc:  # a full disk, a folder gone: the job stops, named, with what it finished kept
        raise JobFailed(f"shard {shard.index} could not be written to {folder.root}: {exc.strerror or exc} (the "
                        "shards before it are written; rerun the same command to resume)") from None
    progress.shard(record)


def submit_rows(pool: ThreadPoolExecutor, engine: Engine, kind: Output,
                values: list[tuple[str, ...]]) -> tuple[list[int], list[Future]]:
    """A shard's rows to the engine, shortest text (or pair) first so that neighbours in length share batches, in
    requests of CHUNK_ROWS that `pool` keeps in flight: (the order sent, each request's future)."""
    order = sorted(range(len(values)), key=lambda i: sum(map(len, values[i])))
    return order, [pool.submit(engine.run, kind.request([values[i] for i in order[start: start + CHUNK_ROWS]]))
                   for start in range(0, len(order), CHUNK_ROWS)]


def rows_answered(order: list[int], futures: list[Future]) -> tuple[Any, list[int] | None, int]:
    """submit_rows' answers back in the rows' order: (the kind's answer, or None for no rows; each row's tokens,
    where the kind counts them; the prompt tokens)."""
    if not futures:
        return None, None, 0
    completions = [future.result() for future in futures]
    inverse = np.argsort(order)  # sorted position of each row
    value = in_order(joined([c.value for c in completions]), inverse)
    counts = [n for c in completions for n in c.row_tokens]
    row_tokens = [counts[i] for i in inverse] if len(counts) == len(order) else None
    return value, row_tokens, sum(c.prompt_tokens for c in completions)


def joined(values: list[Any]) -> Any:
    """Requests' answers as one: arrays stacked, lists concatenated."""
    if isinstance(values[0], np.ndarray) and values[0].ndim == 2 and all(v.ndim == 2 for v in values):
        return np.concatenate(values)
    return [item for value in values for item in value]


def in_order(value: Any, indices: Any) -> Any:
    return value[indices] if isinstance(value, np.ndarray) else [value[i] for i in indices]


def _output_files(shard: FinishedShard, kind: Output, job: JobSettings, fields: Fields) -> list[tuple[str, Any]]:
    """(name, writer) for each file of the shard's output."""
    ids = _ids([row.id for row in shard.good], job.id_field is not None)
    if job.output_format == "npy":
        vectors = np.asarray(shard.value)
        return [(shard_name(shard.index, ".ids.json"), lambda path: path.write_text(json.dumps(ids.to_pylist()))),
                (shard_name(shard.index, ".npy"), lambda path: _save_npy(path, vectors))]
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, Any] = {"id": ids, **kind.columns(shard.value)}
    if shard.row_tokens is not None:
        columns["tokens"] = pa.array(shard.row_tokens, pa.int32())
    if job.include_text:
        for position, name in enumerate(fields.values):
            columns[name] = pa.array([row.values[position] for row in shard.good], pa.string())
    table = pa.table(columns)
    return [(shard_name(shard.index, ".parquet"), lambda path: pq.write_table(table, path))]


def _save_npy(path: Path, vectors: np.ndarray) -> None:
    with open(path, "wb") as file:  # np.save would add .npy to the hidden name
        np.save(file, vectors, allow_pickle=False)


def _ids(values: list[Any], from_field: bool):
    """Row numbers as int64; ids from a field as strings (an integer as its digits), so every shard has one schema."""
    import pyarrow as pa

    if not from_field:
        return pa.array(values, pa.int64())
    return pa.array([str(v) for v in values], pa.string())


def _write_rejected(path: Path, rows: list[Row]) -> None:
    with open(path, "w", encoding="utf-8") as file:
        for row in rows:
            identity = row.id if isinstance(row.id, (int, str)) else repr(row.id)
            file.write(json.dumps({"row": row.row, "id": identity, "problem": row.problem}) + "\n")
