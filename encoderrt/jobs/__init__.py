"""Bulk jobs: a corpus in files -> an engine -> Parquet (or .npy) shards, resumable, here or on a Ray cluster.

`embed_corpus`, `score_corpus` and `classify_corpus` are the Python face of `encoderrt embed`, `encoderrt score` and
`encoderrt classify`; all run the same job (jobs/job.py on one machine, jobs/on_ray.py on Ray Data) and write the
same output folder (jobs/shards.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from encoderrt.jobs.job import JobFailed, JobSettings, load_engine, open_inputs, run_job
from encoderrt.jobs.outputs import KINDS, Embeddings, Labels, Output, PairScores, SparseWeights, TokenVectors
from encoderrt.jobs.placement import RayPlacement
from encoderrt.jobs.progress import Progress, Summary
from encoderrt.runtime import Engine, EngineConfig

__all__ = ["JobFailed", "JobSettings", "RayPlacement", "Summary", "embed_corpus", "score_corpus", "classify_corpus",
           "KINDS", "Embeddings", "SparseWeights", "TokenVectors", "PairScores", "Labels"]


def embed_corpus(inputs: str | Path | list[str | Path], output: str | Path, model: str | Path | None = None, *,
                 kind: Output | None = None, engine: Engine | None = None, config: EngineConfig | None = None,
                 ray: bool | RayPlacement = False, show_progress: bool = False,
                 **settings: Any) -> Summary:
    """Embed every row of `inputs` (files, folders or globs) into `output`, a folder of shards; rerun to resume.

    `model`: an artifact folder, a model folder (compiled once) or None for the bundled all-MiniLM-L6-v2. `kind`:
    what to compute (default `Embeddings()`; `SparseWeights()`, `TokenVectors()`, `PairScores()`, `Labels()`);
    `settings`: JobSettings' fields (`text_field`, `id_field`, `shard_rows`, `output_format`, `on_error`,
    `compile_precision` ...). An `engine` already loaded is used as it is (its artifact is the model; `model`, `config`,
    `compile_precision` and `ray` are refused beside it); `ray=True` (or a `RayPlacement`: actors, CPUs each, the
    cluster's address) runs on Ray Data instead.
    """
    job = JobSettings(**settings)
    kind = kind or Embeddings()
    paths = [inputs] if isinstance(inputs, (str, Path)) else list(inputs)
    progress = Progress(enabled=show_progress)
    if engine is not None:
        # what else picks, builds or places the engine would be ignored beside the one given
        ignored = [name for name, given in (("model", model is not None), ("config", config is not None),
                                            ("compile_precision", job.compile_precision != "auto"), ("ray", ray))
                   if given]
        if ignored:
            raise ValueError(f"{', '.join(ignored)}: {'does' if len(ignored) == 1 else 'do'} not apply beside an "
                             "engine already loaded, which a local job uses as it is")
    corpus = open_inputs(paths, kind, job)  # before a model is loaded or compiled
    if engine is not None:
        return run_job(corpus, output, kind, engine, engine.artifact_dir, job, progress)
    if ray:
        from encoderrt.jobs.on_ray import run_on_ray

        placement = ray if isinstance(ray, RayPlacement) else RayPlacement()
        return run_on_ray(corpus, output, kind, model, job, config or EngineConfig(), placement, progress)
    engine, artifact = load_engine(model, job, config)
    with engine:
        return run_job(corpus, output, kind, engine, artifact, job, progress)


def score_corpus(inputs: str | Path | list[str | Path], output: str | Path, model: str | Path | None = None, *,
                 activation: bool = True, prompt_name: str | None = None, **options: Any) -> Summary:
    """Score every (query, document) row of `inputs` (fields `query_field` and `document_field`) into `output`:
    a cross-encoder's CrossEncoder.predict scores, or an embedding model's similarity (its folder's
    similarity_fn_name, as model.similarity). Options as `embed_corpus`'s."""
    return embed_corpus(inputs, output, model, kind=PairScores(activation, prompt_name), **options)



def classify_corpus(inputs: str | Path | list[str | Path], output: str | Path, model: str | Path | None = None, *,
                    activation: bool = True, **options: Any) -> Summary:
    """Classify every row of `inputs` into `output`: each text's label and its score for every label (a
    classifier's, or a cross-encoder's score of the text alone). Options as `embed_corpus`'s."""
    return embed_corpus(inputs, output, model, kind=Labels(activation), **options)
