"""The same job on Ray Data: shards read and embedded by an actor pool of engines, written by the driver into the
same output folder as the local job.

The driver compiles the model once (or takes the artifact folder given) and plans the shards in one pass over the
inputs (positions, not rows, so memory stays flat); each actor of the pool (loading the artifact from the shared
path and checking its manifest hash) reads the shards it is given from their positions and answers for each
whole, and the driver writes each shard as its answer arrives. A shard Ray retries may arrive twice: it is
written once, so the output never holds a duplicate.

The actors read their own shards: separate read tasks (no CPU reserved, so unbounded) had Ray start a worker
process for each, and on a 2-core machine a 6-shard job spent 12 s starting 11 processes before its first row.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Any

from encoderrt.jobs.inputs import Corpus, Position, Row
from encoderrt.jobs.job import (
    IN_FLIGHT,
    FinishedShard,
    JobSettings,
    job_artifact,
    job_engine_config,
    open_output,
    rows_answered,
    submit_rows,
    write_shard,
)
from encoderrt.jobs.outputs import Output
from encoderrt.jobs.placement import RayPlacement
from encoderrt.jobs.progress import Progress, Summary
from encoderrt.jobs.shards import manifest_hash
from encoderrt.runtime.config import EngineConfig
from encoderrt.runtime.manifest import read_manifest


@dataclass
class _Planned:
    index: int
    start: Position
    end: Position
    rows: int
    good: int
    rejected: list[Row]


def run_on_ray(corpus: Corpus, output: str | Path, kind: Output, model: str | Path | None,
               job: JobSettings, config: EngineConfig, placement: RayPlacement = RayPlacement(),
               progress: Progress | None = None) -> Summary:
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise ValueError(f"--ray needs Ray Data: pip install 'encoderrt[ray]' ({exc})") from None
    progress = progress or Progress(enabled=False)
    artifact, _ = job_artifact(model, job)
    manifest = read_manifest(artifact)
    name = str(manifest.source.get("name") or artifact.name)  # as Engine names it
    folder = open_output(corpus, output, kind, name, artifact, job)
    started = time.perf_counter()
    plan = _plan(corpus, folder.shards, job.shard_rows, folder.resume_position()[1])
    progress.start(sum(p.rows for p in plan) + folder.done_rows, folder.done_rows)
    ray.init(address=placement.address, ignore_reinit_error=True, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the job's own progress speaks for it
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    actors = placement.actors or max(1, int(ray.cluster_resources().get("CPU", 1)) // placement.cpus_per_actor)
    tokens = 0
    try:
        specs = [{"shard": p.index, "start": list(p.start), "rows": p.rows} for p in plan if p.good]
        answers = ()  # every pending row rejected: nothing goes to Ray
        if specs:
            engine_config = replace(job_engine_config(job, config), intra_op_threads=placement.cpus_per_actor)
            answers = ray.data.from_items(specs, override_num_blocks=len(specs)).map_batches(
                _ShardEmbedder, fn_constructor_args=(corpus, str(artifact), manifest_hash(artifact), kind,
                                                     engine_config, job.include_text),
                batch_size=1, batch_format="pyarrow", compute=ray.data.ActorPoolStrategy(size=actors),
                num_cpus=placement.cpus_per_actor  # Ray Data restarts a lost actor and retries its shard
            ).iter_batches(batch_format="pyarrow", batch_size=None)
        tokens = _gather(answers, plan, folder, kind, job, corpus, progress)
        folder.finish(sum(r.rows for r in folder.shards.values()))
    finally:
        progress.stop()
    summary = Summary.of(folder.shards.values(), time.perf_counter() - started, folder.root, tokens, None)
    progress.finish(summary)
    return summary


def _plan(corpus: Corpus, done: dict[int, Any], size: int, position: Position) -> list[_Planned]:
    """Every pending shard's position and counts, from one pass over the inputs (its bad rows are kept: the
    driver writes them; Ray carries only good rows)."""
    plan: list[_Planned] = []
    index = position.row // size
    shard = _Planned(index, position, position, 0, 0, [])
    for row, after in corpus.rows(position):
        shard.rows += 1
        shard.end = after
        if row.problem is None:
            shard.good += 1
        else:
            shard.rejected.append(row)
        if shard.rows == size:
            if shard.index not in done:
                plan.append(shard)
            shard = _Planned(shard.index + 1, after, after, 0, 0, [])
    if shard.rows and shard.index not in done:
        plan.append(shard)
    return plan


class _ShardEmbedder:
    """One engine in a Ray actor, loaded from the shared artifact path once its manifest hash is the driver's; it
    reads each shard it is given from its position in the shared inputs and answers for the shard's good rows at
    once, as the local job does (the texts left out unless the output keeps them)."""

    def __init__(self, corpus: Corpus, artifact: str, expected_hash: str, kind: Output, config: EngineConfig,
                 keep_text: bool):
        from encoderrt.runtime import Engine

        found = manifest_hash(Path(artifact))
        if found != expected_hash:
            raise RuntimeError(f"the artifact at {artifact} on this node is not the driver's (manifest sha256 "
                               f"{found[:12]}, expected {expected_hash[:12]}): share one path or copy it whole")
        self.corpus, self.kind, self.keep_text = corpus, kind, keep_text
        self.engine = Engine.load(artifact, config)
        self.pool = ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="encoderrt-job")

    def __call__(self, specs):
        import pyarrow as pa

        (spec,) = specs.to_pylist()
        shard = islice(self.corpus.rows(Position(*spec["start"])), spec["rows"])
        good = [row for row, _ in shard if row.problem is None]  # the driver writes the rejected ones
        value, row_tokens, tokens = rows_answered(*submit_rows(self.pool, self.engine, self.kind,
                                                               [row.values for row in good]))
        if not self.keep_text:
            good = [row._replace(values=()) for row in good]
        answer = pickle.dumps((good, value, row_tokens, tokens))
        return pa.table({"shard": pa.array([spec["shard"]], pa.int64()), "answer": pa.array([answer], pa.binary())})


def _gather(answers: Iterable[Any], plan: list[_Planned], folder, kind: Output, job: JobSettings, corpus: Corpus,
            progress: Progress) -> int:
    """Each shard written as its answer (`_ShardEmbedder`'s table) arrives; a shard Ray retried may arrive twice and
    is written once. Returns the tokens computed."""
    pending = {p.index: p for p in plan}
    started = time.perf_counter()

    def write(planned: _Planned, good: list[Row], value: Any, row_tokens: list[int] | None, computed: int) -> None:
        shard = FinishedShard(planned.index, planned.start, planned.end, planned.rows, good, planned.rejected, value,
                              row_tokens, computed)
        write_shard(shard, folder, kind, job, corpus.fields, time.perf_counter() - started, progress)

    for p in plan:
        if not p.good:  # every row rejected: nothing went to Ray
            write(pending.pop(p.index), [], None, None, 0)
    tokens = 0
    for table in answers:
        for index, answer in zip(table.column("shard").to_pylist(), table.column("answer").to_pylist()):
            planned = pending.pop(index, None)
            if planned is None:
                continue
            good, value, row_tokens, computed = pickle.loads(answer)
            if len(good) != planned.good:
                raise RuntimeError(f"shard {index} read {len(good)} good rows on Ray, {planned.good} on the driver: "
                                   "the inputs changed while the job ran")
            tokens += computed
            write(planned, good, value, row_tokens, computed)
    if pending:
        raise RuntimeError(f"Ray Data returned no answer for shard {next(iter(pending))}")
    return tokens
