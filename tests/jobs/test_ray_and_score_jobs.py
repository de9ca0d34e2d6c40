"""The bulk job on Ray Data (a local cluster of 2 one-CPU actors) writes the rows the local job writes; `encoderrt
score` scores (query, document) rows as CrossEncoder.predict does; `--sparse` and `--multi-vector` write what
SparseEncoder and MultiVectorEncoder encode."""

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import tiny_models as tm
from encoderrt.bench.workloads import passages, queries
from encoderrt.cli import main
from encoderrt.jobs import RayPlacement, classify_corpus, embed_corpus, score_corpus

TEXTS = [*queries(500, seed=21), *passages(100, seed=22)]


def table(folder: Path):
    return pq.read_table(sorted(folder.glob("part-*.parquet")))


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.every_core
def test_the_ray_job_writes_the_local_jobs_rows(minilm_fp32, tmp_path):
    import ray

    rows = [{"id": f"p{i}", "text": t} for i, t in enumerate(TEXTS)]
    rows.insert(250, {"id": "blank", "text": ""})
    corpus = write_jsonl(tmp_path / "corpus.jsonl", rows)
    local = embed_corpus(corpus, tmp_path / "local", minilm_fp32.path, id_field="id", shard_rows=100,
                         include_text=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        on_ray = embed_corpus(corpus, tmp_path / "ray", minilm_fp32.path, id_field="id", shard_rows=100,
                              include_text=True, ray=RayPlacement(actors=2))
    finally:
        ray.shutdown()
    counts = [(s.rows, s.written, s.rejected) for s in (local, on_ray)]
    assert counts == [(601, 600, 1)] * 2
    a, b = table(tmp_path / "local"), table(tmp_path / "ray")
    assert b.column_names == a.column_names == ["id", "embedding", "tokens", "text"]
    for name in ("id", "tokens", "text"):
        assert b.column(name).to_pylist() == a.column(name).to_pylist(), name
    assert b.column("id").to_pylist() == [r["id"] for r in rows if r["text"]]
    x, y = (np.stack(t.column("embedding").to_numpy(zero_copy_only=False)) for t in (a, b))
    assert ((x * y).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1)).min() >= 0.99999
    names = [sorted(p.name for p in (tmp_path / side).iterdir()) for side in ("local", "ray")]
    assert names[0] == names[1]


def test_score_rows_match_cross_encoder_predict(tiny_models, tiny_artifacts, tmp_path):
    from sentence_transformers import CrossEncoder
    from transformers import AutoTokenizer

    artifact = tiny_artifacts["bert-cross-encoder"]
    manifest = json.loads((artifact / "manifest.json").read_text())
    # pairs within the model's limit: past it the engine cuts the document (only_second), CrossEncoder both sides
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_models["bert-cross-encoder"]))
    candidates = list(zip(queries(600, seed=23), queries(600, seed=24)))
    pairs = [p for p in candidates if len(tokenizer(*p)["input_ids"]) <= manifest["max_length"]][:300]
    assert len(pairs) >= 200
    corpus = write_jsonl(tmp_path / "pairs.jsonl", [{"query": q, "document": d} for q, d in pairs])
    assert main(["score", str(corpus), "-o", str(tmp_path / "out"), "--model", str(artifact), "--shard-rows",
                 "128"]) == 0
    scores = np.array(table(tmp_path / "out").column("score").to_pylist())
    model = CrossEncoder(str(tiny_models["bert-cross-encoder"]), device="cpu", max_length=manifest["max_length"])
    expected = model.predict(pairs, batch_size=64)
    assert np.abs(scores - expected).max() < 1e-5

    raw = score_corpus(corpus, tmp_path / "logits", artifact, activation=False, shard_rows=128)
    logits = np.array(table(tmp_path / "logits").column("score").to_pylist())
    assert raw.written == len(pairs) and np.abs(1 / (1 + np.exp(-logits)) - expected).max() < 1e-5


def test_classify_rows_match_the_text_classification_pipeline(tiny_dir, compile_artifact, tmp_path):
    """`encoderrt classify` writes each text's label and its score for every label, as transformers'
    text-classification pipeline gives them (a multi-label classifier's sigmoids here); --no-activation the logits."""
    from transformers import pipeline

    folder = tm.bert_checkpoint(tiny_dir / "classifier-multi-label-job", num_labels=3, seed=12)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "problem_type": "multi_label_classification"}))
    artifact = compile_artifact(folder, tmp_path / "artifact").path
    texts = queries(150, seed=26)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [{"text": t} for t in texts])
    assert main(["classify", str(corpus), "-o", str(tmp_path / "labels"), "--model", str(artifact), "--shard-rows",
                 "64"]) == 0
    rows = table(tmp_path / "labels")
    assert rows.column_names == ["id", "label", "scores", "tokens"]
    expected = pipeline("text-classification", model=str(folder), top_k=None, device="cpu")(texts, truncation=True)
    labels = config["id2label"]
    for label, scores, reference in zip(rows.column("label").to_pylist(), rows.column("scores").to_pylist(), expected,
                                        strict=True):
        by_label = {item["label"]: item["score"] for item in reference}
        np.testing.assert_allclose(scores, [by_label[labels[str(i)]] for i in range(3)], atol=1e-5)
        assert label == reference[0]["label"]
    raw = classify_corpus(corpus, tmp_path / "logits", artifact, activation=False, shard_rows=64)
    logits = np.array(table(tmp_path / "logits").column("scores").to_pylist())
    assert raw.written == len(texts)
    np.testing.assert_allclose(1 / (1 + np.exp(-logits)), np.array(rows.column("scores").to_pylist()), atol=1e-5)


def test_sparse_and_token_vector_rows_match_sentence_transformers(tiny_dir, compile_artifact, tmp_path):
    from sentence_transformers import MultiVectorEncoder, SparseEncoder

    texts = queries(150, seed=25)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [{"text": t} for t in texts])
    splade = tm.sparse_encoder_folder(tiny_dir / "splade-max-relu", pooling_strategy="max", activation="relu")
    artifact = compile_artifact(splade, tmp_path / "splade").path
    assert main(["embed", str(corpus), "-o", str(tmp_path / "sparse"), "--model", str(artifact), "--sparse",
                 "--shard-rows", "64"]) == 0
    rows = table(tmp_path / "sparse")
    assert rows.column("id").to_pylist() == list(range(150))
    expected = SparseEncoder(str(splade), device="cpu").encode(texts, convert_to_tensor=True).to_dense().numpy()
    for indices, weights, wanted in zip(rows.column("indices").to_pylist(), rows.column("weights").to_pylist(),
                                        expected):
        assert set(indices) == set(np.flatnonzero(wanted > 0).tolist())
        np.testing.assert_allclose(weights, wanted[indices], rtol=1e-4, atol=1e-5 * wanted.max())

    free = tm.inference_free_sparse_folder(tiny_dir / "inference-free-query-prompted", default_route="query",
                                           prompts={"query": "nations search ", "document": "über das "})
    artifact = compile_artifact(free, tmp_path / "inference-free").path
    model = SparseEncoder(str(free), device="cpu")
    for side, flags, encode in (("document", [], model.encode_document),
                                ("query", ["--side", "query"], model.encode_query),
                                ("named", ["--prompt-name", "query"],
                                 lambda texts, **kw: model.encode_document(texts, prompt_name="query", **kw))):
        # a corpus job embeds documents, even where the model's default side is the query one; each side with its
        # prompt
        assert main(["embed", str(corpus), "-o", str(tmp_path / side), "--model", str(artifact), "--sparse", *flags,
                     "--shard-rows", "64"]) == 0
        rows, expected = table(tmp_path / side), encode(texts, convert_to_tensor=True).to_dense().numpy()
        for indices, weights, wanted in zip(rows.column("indices").to_pylist(), rows.column("weights").to_pylist(),
                                            expected, strict=True):
            assert set(indices) == set(np.flatnonzero(wanted > 0).tolist()), side
            np.testing.assert_allclose(weights, wanted[indices], rtol=1e-4, atol=1e-5 * wanted.max())

    colbert = tm.colbert_folder(tiny_dir / "colbert-classic")
    artifact = compile_artifact(colbert, tmp_path / "colbert").path
    assert main(["embed", str(corpus), "-o", str(tmp_path / "vectors"), "--model", str(artifact), "--multi-vector",
                 "--shard-rows", "64"]) == 0
    got = [np.array(v, np.float32) for v in table(tmp_path / "vectors").column("vectors").to_pylist()]
    reference = MultiVectorEncoder(str(colbert), device="cpu").encode_document(texts)
    expected = [e.numpy() for e in reference]
    assert [g.shape for g in got] == [e.shape for e in expected]
    np.testing.assert_allclose(np.concatenate(got), np.concatenate(expected), atol=1e-4)
    # documents pooled to about a half of their vectors, as per-call token pooling in sentence-transformers pools them
    from sentence_transformers.multi_vector_encoder.modules import HierarchicalTokenPooling

    assert main(["embed", str(corpus), "-o", str(tmp_path / "pooled"), "--model", str(artifact), "--multi-vector",
                 "--pool-factor", "2", "--dimensions", "16", "--shard-rows", "64"]) == 0
    got = [np.array(v, np.float32) for v in table(tmp_path / "pooled").column("vectors").to_pylist()]
    expected = [e.numpy() for e in MultiVectorEncoder(str(colbert), device="cpu").encode_document(
        texts, token_pooling=HierarchicalTokenPooling(pool_factor=2), truncate_dim=16)]
    assert [g.shape for g in got] == [e.shape for e in expected] and len(np.concatenate(got)) < len(np.concatenate(
        [e.numpy() for e in reference])) * 0.6
    np.testing.assert_allclose(np.concatenate(got), np.concatenate(expected), atol=1e-4)
