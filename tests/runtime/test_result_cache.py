"""The result cache (EngineConfig.result_cache_mb): a repeated row is answered without running, with the answer
sentence-transformers gives, and nothing but the row's tokens and the outputs asked for decides a hit."""

import asyncio

import httpx
import numpy as np
import pytest

from encoderrt import Engine
from encoderrt.runtime.config import EngineConfig
from encoderrt.runtime.result_cache import ENTRY_BYTES, ResultCache, row_key
from encoderrt.runtime.tokenizer import Tokens
from encoderrt.server import ServerSettings, create_app
from server_helpers import metric, ready_registry, running_server, wait_for

QUERIES = ["how do vector databases index embeddings", "capital of France", "¿dónde está la biblioteca?",
           "symptoms of the flu", "a"]


@pytest.fixture(scope="module")
def st_model(minilm_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")


@pytest.fixture(scope="module")
def cached(minilm_fp32):
    with Engine.load(minilm_fp32.path, result_cache_mb=1) as engine:
        yield engine


def _ran(engine, call):
    """What `call` returned, and how many items it submitted, ran and took from the cache."""
    before = engine.stats.snapshot()
    value = call()
    after = engine.stats.snapshot()
    return value, {name: after[name] - before[name] for name in ("items", "batch_rows", "cached_items")}


def _cosines(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_repeated_queries_are_answered_without_running(cached, st_model):
    first, counts = _ran(cached, lambda: cached.embed(QUERIES))
    assert counts == {"items": 5, "batch_rows": 5, "cached_items": 0}
    again, counts = _ran(cached, lambda: cached.embed([QUERIES[2], "never asked before", QUERIES[0]]))
    assert counts == {"items": 3, "batch_rows": 1, "cached_items": 2}
    np.testing.assert_array_equal(again[[0, 2]], first[[2, 0]])  # the answers kept, as they were
    reference = st_model.encode([QUERIES[2], "never asked before", QUERIES[0]], normalize_embeddings=True)
    assert _cosines(again, reference).min() >= 0.99999


def test_what_follows_the_graph_runs_on_every_request(cached, st_model):
    """Dimensions, normalising and quantising apply to the kept answer, as sentence-transformers applies them."""
    cached.embed(QUERIES)
    cut, counts = _ran(cached, lambda: cached.embed(QUERIES, dimensions=64))
    assert counts["cached_items"] == 5 and counts["batch_rows"] == 0
    reference = st_model.encode(QUERIES)[:, :64]
    np.testing.assert_allclose(cut, reference / np.linalg.norm(reference, axis=1, keepdims=True), atol=1e-5)
    raw, counts = _ran(cached, lambda: cached.embed(QUERIES, normalize=False))
    assert counts["cached_items"] == 5  # the mean of the token states, before the folder's Normalize
    means = [tokens.numpy().mean(0) for tokens in st_model.encode(QUERIES, output_value="token_embeddings")]
    np.testing.assert_allclose(raw, np.stack(means), atol=1e-5)
    binary, counts = _ran(cached, lambda: cached.embed(QUERIES, precision="ubinary"))
    assert counts["cached_items"] == 5
    from sentence_transformers.quantization import quantize_embeddings

    np.testing.assert_array_equal(binary, quantize_embeddings(st_model.encode(QUERIES), precision="ubinary"))


def test_other_tokens_are_another_row(cached, st_model):
    """A prompt or a shorter truncation changes the row, so it runs; the answers are sentence-transformers'."""
    cached.embed(QUERIES)
    prompted, counts = _ran(cached, lambda: cached.embed(QUERIES, prompt="query: "))
    assert counts["cached_items"] == 0 and counts["batch_rows"] == 5
    assert _cosines(prompted, st_model.encode(QUERIES, prompt="query: ")).min() >= 0.99999
    cut, counts = _ran(cached, lambda: cached.embed(QUERIES[:1], truncate=4))
    assert counts["cached_items"] == 0
    st_model.max_seq_length = 4
    try:
        assert _cosines(cut, st_model.encode(QUERIES[:1])).min() >= 0.99999
    finally:
        st_model.max_seq_length = 256


def test_a_callers_changes_do_not_reach_the_cache(cached, st_model):
    """Token vectors reach the caller as the scheduler delivered them, with no stacking copy between."""
    texts = ["changed by its caller", "and this one too"]
    cached.embed_tokens(texts)
    for kept in cached.embed_tokens(texts):  # answered from the cache
        kept[:] = 0
    again, counts = _ran(cached, lambda: cached.embed_tokens(texts))
    assert counts["cached_items"] == 2
    for got, expected in zip(again, st_model.encode(texts, output_value="token_embeddings")):
        np.testing.assert_allclose(got, expected.numpy(), atol=1e-4, rtol=1e-4)


def test_token_vectors_are_kept_apart_from_pooled_ones(cached, st_model):
    cached.embed(QUERIES)
    tokens, counts = _ran(cached, lambda: cached.embed_tokens(QUERIES))
    assert counts["cached_items"] == 0  # the pooled answers are not the token vectors
    again, counts = _ran(cached, lambda: cached.embed_tokens(QUERIES))
    assert counts == {"items": 5, "batch_rows": 0, "cached_items": 5}
    reference = st_model.encode(QUERIES, output_value="token_embeddings")
    for got, expected in zip(again, reference):
        np.testing.assert_allclose(got, expected.numpy(), atol=1e-4, rtol=1e-4)
    for first, second in zip(tokens, again):
        np.testing.assert_array_equal(first, second)


def test_an_async_request_answered_whole_settles_on_its_loop(cached, st_model):
    cached.embed(QUERIES)

    async def ask():
        return await asyncio.gather(*(cached.aembed([query]) for query in QUERIES))

    answers, counts = _ran(cached, lambda: asyncio.run(ask()))
    assert counts["cached_items"] == 5 and counts["batch_rows"] == 0
    assert _cosines(np.concatenate(answers), st_model.encode(QUERIES)).min() >= 0.99999


def test_cross_encoder_pairs(tiny_artifacts, tiny_models):
    from sentence_transformers import CrossEncoder

    reference = CrossEncoder(str(tiny_models["bert-cross-encoder"]), device="cpu", max_length=64)
    documents = ["the fox", "a dog sleeps", "cats and dogs"]
    with Engine.load(tiny_artifacts["bert-cross-encoder"], max_batch_tokens=256, result_cache_mb=1) as engine:
        first = engine.score("where is the fox", documents)
        again, counts = _ran(engine, lambda: engine.score("where is the fox", documents))
        other, other_counts = _ran(engine, lambda: engine.score("a new query", documents))
    assert counts["cached_items"] == 3 and counts["batch_rows"] == 0 and again == first
    assert other_counts["cached_items"] == 0  # a pair's row holds its query
    expected = reference.predict([("where is the fox", d) for d in documents] + [("a new query", d) for d in documents])
    np.testing.assert_allclose(first + other, expected, atol=1e-3)


DOCUMENTS = ["the amazon rainforest covers much of the amazon basin", "der schnelle braune fuchs", "café",
             "Paris is the capital and largest city of France.", " ".join(["fox jumps over the lazy dog."] * 30)]


def test_a_documents_vectors_are_kept_for_the_next_querys_rerank(cached, st_model):
    """An embedding model's rerank embeds each document apart from the query: the next query's rerank of the same
    candidates runs its query alone, and ranks as sentence-transformers' cosine similarities do."""
    cached.rerank("where is the amazon rainforest", DOCUMENTS)
    ranked, counts = _ran(cached, lambda: cached.rerank("what is the capital of france", DOCUMENTS))
    assert counts == {"items": 6, "batch_rows": 1, "cached_items": 5}
    similarities = st_model.similarity(st_model.encode("what is the capital of france"), st_model.encode(DOCUMENTS))
    assert [i for i, _ in ranked] == np.argsort(-similarities.numpy()[0], kind="stable").tolist()
    np.testing.assert_allclose([score for _, score in sorted(ranked)], similarities.numpy()[0], atol=1e-5)


def test_a_multi_vector_documents_token_vectors_are_kept_for_the_next_query(tiny_dir, compile_artifact, tmp_path):
    """ColBERT: the documents' per-token vectors are the kept answers; MaxSim against the next query is
    MultiVectorEncoder's own."""
    from sentence_transformers import MultiVectorEncoder

    import tiny_models as tm

    folder = tm.colbert_folder(tiny_dir / "colbert-classic")
    reference = MultiVectorEncoder(str(folder), device="cpu")
    queries = ["where is the amazon rainforest?", "fox"]
    expected = reference.similarity(reference.encode_query(queries), reference.encode_document(DOCUMENTS)).numpy()
    with Engine.load(compile_artifact(folder, tmp_path / "out").path, result_cache_mb=1) as engine:
        first = engine.score(queries[0], DOCUMENTS)
        second, counts = _ran(engine, lambda: engine.score(queries[1], DOCUMENTS))
    assert counts == {"items": 6, "batch_rows": 1, "cached_items": 5}
    assert np.abs(np.array([first, second]) - expected).max() <= 1e-3


def test_least_recently_used_answers_go_first_within_the_bound():
    row = np.arange(4, dtype=np.float32)
    entry = 1 + row.nbytes + ENTRY_BYTES  # a one-byte key, 16 bytes of data, the entry's own cost
    cache = ResultCache(3 * entry)
    for key in b"abc":
        cache.put(bytes([key]), row + key)
    assert cache.get(b"a")[0] == ord("a")  # now the most recently used
    cache.put(b"d", row)
    assert cache.get(b"b") is None and len(cache) == 3 and cache.nbytes == 3 * entry
    assert {key for key in (b"a", b"c", b"d") if cache.get(key) is not None} == {b"a", b"c", b"d"}
    cache.put(b"huge", np.zeros(3 * entry, np.uint8))  # bigger than the whole bound: not kept, nothing evicted
    assert cache.get(b"huge") is None and len(cache) == 3
    named = {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)}
    cache.put(b"n", named)
    assert cache.nbytes <= cache.max_bytes and cache.get(b"n")["b"].shape == (2,) and cache.get(b"a") is None


def test_a_rows_key_holds_all_of_the_row_and_the_outputs_asked_for():
    row = Tokens([101, 7592, 102], [0, 0, 0])
    variants = [row._replace(ids=[101, 7593, 102]), row._replace(type_ids=[0, 1, 1]), row._replace(pooling_start=1),
                row._replace(adapter=2), row._replace(attended=2), Tokens([101, 7592], [0, 0])]
    keys = {row_key(variant, ()) for variant in variants} | {row_key(row, ()), row_key(row, ("token_embeddings",))}
    assert len(keys) == len(variants) + 2
    assert row_key(Tokens([101, 7592, 102], [0, 0, 0]), ()) == row_key(row, ())
    # ids and segment ids are one run of bytes: the length keeps [1, 2] + [0] apart from [1] + [2, 0]
    assert row_key(Tokens([1, 2], [0, 0]), ()) != row_key(Tokens([1], [2]), ())


def test_an_engine_without_it_keeps_nothing(minilm_fp32):
    with Engine.load(minilm_fp32.path) as engine:
        engine.embed(QUERIES)
        _, counts = _ran(engine, lambda: engine.embed(QUERIES))
    assert counts == {"items": 5, "batch_rows": 5, "cached_items": 0}


@pytest.mark.parametrize("value", [-1.0, float("inf"), float("nan")])
def test_a_bad_size_is_refused_naming_the_setting(value):
    with pytest.raises(ValueError, match=f"result_cache_mb must be 0 \\(off\\) or more, and finite, got {value}"):
        EngineConfig(result_cache_mb=value)


def test_served_with_the_flag_and_counted_in_metrics(minilm_fp32, st_model):
    engine = Engine.load(minilm_fp32.path, result_cache_mb=1)
    with running_server(create_app(ServerSettings(), ready_registry(minilm=engine))) as url:
        bodies = [httpx.post(f"{url}/v1/embeddings", json={"input": QUERIES, "model": "minilm"}, timeout=60)
                  for _ in range(2)]
        assert [b.status_code for b in bodies] == [200, 200]
        assert bodies[0].json()["usage"] == bodies[1].json()["usage"]  # usage counts the tokens, run or kept
        vectors = np.array([d["embedding"] for d in bodies[1].json()["data"]])
        assert _cosines(vectors, st_model.encode(QUERIES)).min() >= 0.99999
        assert metric(url, "encoderrt_cached_items_total", 'model="minilm"') == len(QUERIES)
        # what it holds, beside its bound: five answers and five texts' tokens; many more texts fill it to the bound
        assert metric(url, "encoderrt_result_cache_limit_bytes", 'model="minilm"') == 2**20
        held = metric(url, "encoderrt_result_cache_bytes", 'model="minilm"')
        assert len(QUERIES) * (ENTRY_BYTES + 384 * 4) < held < len(QUERIES) * 4096
        many = [f"query number {i} about rivers" for i in range(600)]
        for start in range(0, len(many), 64):
            httpx.post(f"{url}/v1/embeddings", json={"input": many[start:start + 64], "model": "minilm"},
                       timeout=60).raise_for_status()
        assert 2**20 - 4096 < metric(url, "encoderrt_result_cache_bytes", 'model="minilm"') <= 2**20
    engine.close()


def test_callers_at_once_with_cancellations_and_evictions_each_get_their_own_answers(minilm_fp32, st_model):
    """Threads and async callers ask for overlapping texts at once (identical rows waiting together, hits, misses),
    a fifth of the async ones are cancelled while they wait, and the table holds a few dozen answers, so evictions
    run under contention: every answer that arrives is its own text's, in order, as sentence-transformers gives it,
    and afterwards nothing waits and the engine still answers."""
    import concurrent.futures
    import random

    pool = [f"{topic} question number {i}" for i, topic in enumerate(["river", "bread", "database", "flu"] * 15)]
    reference = dict(zip(pool, st_model.encode(pool, normalize_embeddings=True)))
    kept = 40 * (384 * 4 + 64 + ENTRY_BYTES) / 2**20  # about 40 pooled answers of this model: evicting all along
    checked = {"answers": 0, "cancelled": 0}

    def check(texts, vectors):
        assert vectors.shape == (len(texts), 384)
        assert _cosines(vectors, np.stack([reference[t] for t in texts])).min() >= 0.99999, texts
        checked["answers"] += len(texts)

    with Engine.load(minilm_fp32.path, result_cache_mb=kept) as engine:
        def sync_caller(seed):
            rng = random.Random(seed)
            for _ in range(25):
                texts = rng.choices(pool, k=rng.randint(1, 6))
                check(texts, engine.embed(texts))

        async def async_caller(rng):
            for _ in range(25):
                texts = rng.choices(pool, k=rng.randint(1, 6))
                if rng.random() < 0.2:
                    task = asyncio.ensure_future(engine.aembed(texts))
                    await asyncio.sleep(rng.random() * 0.004)
                    if task.cancel():
                        checked["cancelled"] += 1
                        continue
                    check(texts, await task)
                else:
                    check(texts, await engine.aembed(texts))

        async def async_callers():
            await asyncio.gather(*(async_caller(random.Random(seed)) for seed in range(24)))

        with concurrent.futures.ThreadPoolExecutor(4) as threads:
            done = [threads.submit(sync_caller, seed) for seed in range(100, 104)]
            asyncio.run(async_callers())
            for future in done:
                future.result()
        # a cancelled caller's rows leave the queue when a worker next cuts a batch (they are dropped unrun then),
        # not at the moment of the cancel: the last cancellations may still be queued when the callers are done
        wait_for(lambda: engine.stats.snapshot()["queue_depth"] == 0, 5, "rows were still queued after every caller")
        stats = engine.stats.snapshot()
        assert stats["cached_items"] > 0 and checked["cancelled"] > 0 and checked["answers"] > 500
        check(pool[:3], engine.embed(pool[:3]))


class _CountingMemo:
    """A memo that counts what the tokenizer asks of it."""

    def __init__(self):
        self.kept, self.asked = {}, 0

    def tokens(self, key):
        self.asked += 1
        return self.kept.get(key)

    def keep_tokens(self, key, tokens):
        assert key not in self.kept, f"{key} tokenised twice"
        self.kept[key] = tokens


def test_short_texts_tokenise_once_and_as_without_the_memo(minilm_fp32):
    """The memo's key holds all that decides the tokens (the limit, the truncation side or none, the prompted text):
    every rule gives what the tokenizer without a memo gives, the second time from the memo; long texts and many at
    once are not remembered; a text past the limit is still refused when truncation is off."""
    from encoderrt.runtime.errors import InputTooLong
    from encoderrt.runtime.tokenizer import MEMO_CHARS, SEQUENTIAL_TEXTS, TextTokenizer

    args = (minilm_fp32.path / "tokenizer.json", 256, 0, ("input_ids", "attention_mask", "token_type_ids"))
    memo = _CountingMemo()
    remembering, plain = TextTokenizer(*args, memo=memo), TextTokenizer(*args)
    long_text = "rivers " * (MEMO_CHARS // 7 + 1)
    calls = [((["how do rivers form", "x"],), {}), ((["how do rivers form"],), {"side": "left"}),
             ((["how do rivers form"],), {"truncate": False}), ((["how do rivers form"],), {"prompt": "query: "}),
             (([long_text],), {}), ((["a"] * (SEQUENTIAL_TEXTS + 1),), {})]
    for limit in (256, 4):  # 4: a request's own limit (truncate=N), which cuts these texts
        ours, theirs = remembering.limited(limit), plain.limited(limit)
        for args_, kwargs in calls:
            if limit == 4 and kwargs.get("truncate") is False:
                for tokenizer in (ours, ours, theirs):  # refused every time, the memo's tokens or not
                    with pytest.raises(InputTooLong):
                        tokenizer.encode(*args_, **kwargs)
                continue
            expected = theirs.encode(*args_, **kwargs)
            assert ours.encode(*args_, **kwargs) == expected == ours.encode(*args_, **kwargs), (limit, kwargs)
    assert {(limit, rule) for limit, rule, _ in memo.kept} == {(256, "right"), (256, "left"), (256, "whole"),
                                                                (4, "right"), (4, "left"), (4, "whole")}
    assert {text for _, _, text in memo.kept} == {"how do rivers form", "x", "query: how do rivers form"}
    assert remembering.limited(4).encode(["how do rivers form"]) != remembering.encode(["how do rivers form"])


def test_remembered_tokens_count_in_the_bound_and_stay_the_memos(minilm_fp32):
    """Tokens share the answers' bound and order; a caller of Engine.tokenize gets ids of its own."""
    from encoderrt.runtime.result_cache import TOKEN_BYTES, TOKENS_ENTRY_BYTES

    row = Tokens([101, 7592, 102], [0, 0, 0])
    entry = len("hello") + 3 * TOKEN_BYTES + TOKENS_ENTRY_BYTES
    cache = ResultCache(2 * entry)
    cache.keep_tokens((256, "right", "hello"), row)
    cache.keep_tokens((256, "left", "hello"), row)
    assert cache.nbytes == 2 * entry and cache.tokens((256, "right", "hello")) is row
    cache.keep_tokens((256, "whole", "hello"), row)  # the least recently used ("left") goes
    assert cache.tokens((256, "left", "hello")) is None and len(cache) == 2 and cache.nbytes == 2 * entry
    with Engine.load(minilm_fp32.path, result_cache_mb=1) as engine:
        ids = engine.tokenize("how do rivers form")
        ids.append(999)
        assert engine.tokenize("how do rivers form") == ids[:-1]
        with Engine.load(minilm_fp32.path) as plain:
            np.testing.assert_array_equal(engine.embed(["how do rivers form"]), plain.embed(["how do rivers form"]))
