"""Engine behaviour: parity through the scheduler, concurrency, batching, cancellation, overload, errors."""

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from encoderrt import Engine
from encoderrt.runtime.errors import InferenceFailed, InputTooLong, InvalidRequest, Overloaded
from encoderrt.runtime.manifest import ManifestError

TEXTS = [
    "how do vector databases index embeddings",
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France.",
    "a",
    "Quantum computers use qubits, which can be in superpositions of states, to perform certain computations faster.",
    "¿Dónde está la biblioteca? 图书馆在哪里？",
    "short query",
    " ".join(["long passage"] * 200),
]


@pytest.fixture(scope="module")
def minilm_engine(minilm_fp32):
    with Engine.load(minilm_fp32.path) as engine:
        yield engine


@pytest.fixture(scope="module")
def st_model(minilm_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")


@pytest.fixture(scope="module")
def ce_engine(tiny_artifacts):
    with Engine.load(tiny_artifacts["bert-cross-encoder"], max_batch_tokens=256) as engine:
        yield engine


@pytest.fixture(scope="module")
def cross_encoder(tiny_models):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(tiny_models["bert-cross-encoder"]), device="cpu", max_length=64)


# -- parity and the public verbs ------------------------------------------------------------


def test_embed_matches_sentence_transformers(minilm_engine, st_model):
    reference = st_model.encode(TEXTS, normalize_embeddings=True)
    embeddings = minilm_engine.embed(TEXTS)
    assert embeddings.dtype == np.float32 and embeddings.shape == (len(TEXTS), 384)
    assert (embeddings * reference).sum(1).min() >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)


def test_calibration_chose_a_budget(minilm_engine):
    info = minilm_engine.info
    assert info.max_batch_tokens >= info.max_length
    assert info.calibration and all(tokens_per_s > 0 for _, tokens_per_s, _ in info.calibration)


def test_empty_string_embeds_like_sentence_transformers(minilm_engine, st_model):
    reference = st_model.encode([""], normalize_embeddings=True)
    assert float((minilm_engine.embed([""]) * reference).sum()) >= 0.99999


def test_empty_list_and_single_string(minilm_engine):
    assert minilm_engine.embed([]).shape == (0, 384)
    assert minilm_engine.embed("one text").shape == (1, 384)
    assert minilm_engine.score("q", []) == []
    assert minilm_engine.rerank("q", []) == []


def test_matryoshka_dimensions_and_normalize(minilm_engine, st_model):
    raw = minilm_engine.embed(TEXTS, normalize=False)
    reference = st_model.encode(TEXTS, normalize_embeddings=False)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)
    cut = minilm_engine.embed(TEXTS, dimensions=64)
    expected = reference[:, :64] / np.linalg.norm(reference[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, expected, atol=1e-4)
    assert minilm_engine.embed(TEXTS, dimensions=64, normalize=False).shape == (len(TEXTS), 64)
    for bad in (0, 385, 1.5):
        with pytest.raises(InvalidRequest, match="dimensions must be an integer from 1 to 384"):
            minilm_engine.embed(TEXTS, dimensions=bad)


def test_texts_that_are_no_text_are_named_and_the_engine_goes_on(minilm_engine):
    with pytest.raises(InvalidRequest, match="texts must be a string or a list of strings, got bytes"):
        minilm_engine.embed(b"how rivers form")  # a sequence, of ints
    # a Python str may hold a lone surrogate (a file decoded with surrogateescape); the tokenizer refuses it
    many = [TEXTS[0]] * 20 + ["rivers \udcff form"]  # tokenised on the calling thread, and in one batch call
    for texts in (["rivers \udcff form"], many):
        with pytest.raises(InvalidRequest, match=r"a text is not valid Unicode: it holds a lone surrogate "
                                                 r"\('\\udcff'\) at character 7, after 'rivers '"):
            minilm_engine.embed(texts)
    with pytest.raises(InvalidRequest, match="lone surrogate"):
        minilm_engine.rerank("\ud800", [TEXTS[1]])
    assert minilm_engine.embed([TEXTS[0]]).shape == (1, 384)


def test_embedding_model_scores_by_cosine(minilm_engine, st_model):
    from sentence_transformers.util import cos_sim

    query, documents = TEXTS[0], TEXTS[1:5]
    reference = cos_sim(st_model.encode([query]), st_model.encode(documents))[0].numpy()
    np.testing.assert_allclose(minilm_engine.score(query, documents), reference, atol=1e-5)
    ranked = minilm_engine.rerank(query, documents, top_n=2)
    assert [i for i, _ in ranked] == list(np.argsort(-reference)[:2])


def test_cross_encoder_scores_with_activation_and_raw_logits(ce_engine, cross_encoder):
    import torch

    query, documents = "where is the amazon rainforest", ["the amazon basin of south america", "über schnelle fuchs", "x"]
    logits = cross_encoder.predict([(query, d) for d in documents], activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(ce_engine.score(query, documents, activation=False), logits, atol=1e-3)
    np.testing.assert_allclose(ce_engine.score(query, documents), 1 / (1 + np.exp(-logits)), atol=1e-4)
    np.testing.assert_allclose(ce_engine.score(query, documents), cross_encoder.predict([(query, d) for d in documents]), atol=1e-4)


def test_rerank_sorts_best_first_and_honours_top_n(ce_engine):
    query, documents = "the quick fox", ["lazy dog", "quick brown fox jumps", "the fox", "rank score", "café"]
    scores = ce_engine.score(query, documents)
    ranked = ce_engine.rerank(query, documents)
    assert [i for i, _ in ranked] == sorted(range(5), key=lambda i: -scores[i])
    assert [s for _, s in ranked] == sorted(scores, reverse=True)
    assert ce_engine.rerank(query, documents, top_n=2) == ranked[:2]
    assert ce_engine.rerank(query, documents, top_n=50) == ranked
    with pytest.raises(InvalidRequest, match="top_n must be a positive integer"):
        ce_engine.rerank(query, documents, top_n=0)


def test_score_pairing_rules(ce_engine):
    a, b, c = "fox", "dog", "café"
    one_to_one = ce_engine.score(a, b)
    one_to_many = ce_engine.score(a, [b, c])
    assert len(one_to_one) == 1 and len(one_to_many) == 2
    assert ce_engine.score([a], [b, c]) == one_to_many
    pairwise = ce_engine.score([a, c], [b, b])
    assert pairwise[0] == pytest.approx(one_to_one[0]) and pairwise[1] == pytest.approx(ce_engine.score(c, b)[0])
    assert ce_engine.score([], []) == []
    with pytest.raises(InvalidRequest, match="text_1 is a list of 2 texts but text_2 is a single text"):
        ce_engine.score([a, c], b)
    with pytest.raises(InvalidRequest, match="text_1 has 2 texts and text_2 has 3"):
        ce_engine.score([a, c], [a, b, c])
    with pytest.raises(InvalidRequest, match=r"text_2\[1\] must be a string"):
        ce_engine.score(a, [b, 3])


def test_wrong_task_is_a_clear_error(ce_engine, minilm_engine, tiny_artifacts):
    with pytest.raises(InvalidRequest, match="embed is not available for this score model"):
        ce_engine.embed(["text"])
    with pytest.raises(InvalidRequest, match="classify is not available for this embed model"):
        minilm_engine.classify(["text"])
    with Engine.load(tiny_artifacts["bert-classifier"], max_batch_tokens=256) as classifier:
        with pytest.raises(InvalidRequest, match="score is not available for this classify model"):
            classifier.score("a", "b")


def test_classify_returns_labels_and_probabilities(tiny_models, tiny_artifacts):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    texts = ["the quick brown fox", "привет мир", "rank"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["bert-classifier"])
    model = AutoModelForSequenceClassification.from_pretrained(tiny_models["bert-classifier"]).eval()
    with torch.inference_mode():
        probs = torch.softmax(model(**tokenizer(texts, padding=True, return_tensors="pt")).logits, -1).numpy()
    with Engine.load(tiny_artifacts["bert-classifier"], max_batch_tokens=256) as engine:
        results = engine.classify(texts)
    for result, expected in zip(results, probs):
        np.testing.assert_allclose(result.probs, expected, atol=1e-4)
        assert result.label == f"LABEL_{int(np.argmax(expected))}"


def test_truncation_on_and_off(ce_engine, minilm_engine):
    long_text = " ".join(["fox"] * 300)
    with pytest.raises(InputTooLong, match="input 1 is 302 tokens long, above the model's limit of 256"):
        minilm_engine.embed(["short", long_text], truncate=False)
    assert minilm_engine.embed(["short", long_text]).shape == (2, 384)
    with pytest.raises(InputTooLong, match="input 0"):
        ce_engine.score("fox", long_text, truncate=False)
    # truncation cuts the document: a query followed by a too-long document still scores like the cut pair
    query = "where is the rainforest"
    cut = ce_engine.tokenize(query, long_text)
    assert len(cut) == 64 and cut[: len(ce_engine.tokenize(query))] == ce_engine.tokenize(query)


def test_load_errors(tmp_path, tiny_models):
    with pytest.raises(ManifestError, match="no manifest.json$"):
        Engine.load(tmp_path)
    # a model folder is not loaded as it is: the error says how it becomes an artifact
    folder = tiny_models["st-cls"]
    with pytest.raises(ManifestError, match=rf"no manifest.json; it is a model folder: compile it \(compile-model "
                                            rf"{folder} --output ARTIFACT_DIR\), or give it to `encoderrt serve`"):
        Engine.load(folder)


# -- the scheduler --------------------------------------------------------------------------


def test_concurrent_threads_get_their_own_results(minilm_engine):
    requests = [[f"{t} #{caller}" for t in TEXTS[:5]] for caller in range(24)]
    expected = [np.concatenate([minilm_engine.embed([t]) for t in texts]) for texts in requests[:3]]
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(minilm_engine.embed, requests))
    for got, want in zip(results, expected):
        np.testing.assert_allclose(got, want, atol=1e-5)
    for texts, got in zip(requests, results):
        assert got.shape == (5, 384)
        # row i belongs to text i: the nearest of the caller's own texts
        np.testing.assert_allclose(got[2], minilm_engine.embed([texts[2]])[0], atol=1e-5)


def test_concurrent_asyncio_callers(minilm_engine):
    async def main():
        requests = [[f"caller {i} asks about {t}" for t in ("rivers", "mountains", "cities")] for i in range(20)]
        results = await asyncio.gather(*(minilm_engine.aembed(r) for r in requests))
        return requests, results

    requests, results = asyncio.run(main())
    for texts, got in zip(requests, results):
        np.testing.assert_allclose(got, minilm_engine.embed(texts), atol=1e-5)


def test_async_verbs(ce_engine):
    async def main():
        return await asyncio.gather(ce_engine.ascore("fox", ["dog", "fox"]), ce_engine.arerank("fox", ["dog", "fox"], top_n=1))

    scores, ranked = asyncio.run(main())
    assert scores == pytest.approx(ce_engine.score("fox", ["dog", "fox"]))
    assert ranked[0][0] == int(np.argmax(scores))


def test_large_request_is_split_and_reassembled(tiny_artifacts):
    from tiny_models import CORPUS_WORDS

    words = CORPUS_WORDS
    texts = [" ".join(words[(i + k) % len(words)] for k in range(1 + i % 40)) for i in range(120)]
    assert len(set(texts)) == 120
    with Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=128) as engine:
        together = engine.embed(texts)
        stats = engine.stats.snapshot()
        one_by_one = np.concatenate([engine.embed([t]) for t in texts])
    assert stats["batches"] > 10
    assert stats["padded_tokens"] / stats["batches"] <= 128 or stats["batch_rows"] == stats["batches"]
    np.testing.assert_allclose(together, one_by_one, atol=1e-5)


def test_a_deep_queue_is_cut_in_bigger_batches_and_a_shallow_one_at_the_budget(controlled, tiny_artifacts):
    """While a batch at the deep budget is waiting, batches are cut at it; once fewer tokens wait, at the budget
    again. A hand count of padded tokens (rows x longest) per run."""
    from tiny_models import CORPUS_WORDS

    words = CORPUS_WORDS
    texts = [" ".join(words[(i + k) % len(words)] for k in range(1 + i % 12)) for i in range(120)]
    shallow = texts[4:8]  # 4 rows of 7-10 tokens: more than one 32-token batch holds, less than a deep one
    vectors = {}
    for deep in (64, 0):
        with Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=32, deep_batch_tokens=deep) as engine:
            assert engine.info.max_batch_tokens == 32 and engine.info.deep_batch_tokens == (deep or 32)
            assert engine.info.parallel_runs == 1  # ControlledBackend: one stream, one batch at a time
            controlled[-1].batches.clear()
            vectors[deep] = engine.embed(texts)
            deep_runs = [rows * width for rows, width in controlled[-1].batches]
            controlled[-1].batches.clear()
            engine.embed(shallow)
            shallow_runs = [rows * width for rows, width in controlled[-1].batches]
        assert max(deep_runs) <= (deep or 32) and max(shallow_runs) <= 32 and len(shallow_runs) >= 2
        if deep:
            assert sum(padded > 32 for padded in deep_runs) >= len(deep_runs) // 2
            assert deep_runs[-1] <= 32  # the queue's tail, shallow again
    np.testing.assert_allclose(vectors[64], vectors[0], atol=1e-5)


def test_the_engine_is_backlogged_while_a_deep_batchs_worth_waits(controlled, tiny_artifacts):
    """Engine.backlogged: true once the padded tokens waiting reach the deep budget (a hand count: rows x their
    padded width), false again when they drain."""
    from tiny_models import CORPUS_WORDS

    texts = [" ".join(CORPUS_WORDS[(i + k) % len(CORPUS_WORDS)] for k in range(3)) for i in range(40)]
    with Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=32, deep_batch_tokens=64) as engine:
        backend = controlled[-1]
        backend.gate.clear()
        held = engine._scheduler.submit(engine._tokenizer.encode(["the first row, held at the gate"]))
        assert backend.entered.wait(30) and not engine.backlogged()  # running is not waiting
        rows = engine._tokenizer.encode(texts)  # distinct rows: identical ones would wait as one
        futures = []
        for row in rows:
            futures.append(engine._scheduler.submit([row]))
            waiting = engine._scheduler._rows.tokens
            assert engine.backlogged() == (waiting >= 64), waiting
        assert engine.backlogged()
        backend.gate.set()
        for future in [held, *futures]:
            future.result(30)
        assert not engine.backlogged()


def test_a_deep_queue_takes_1024_tokens_over_a_calibrated_budget_and_a_given_one_is_kept(tiny_artifacts):
    """The deep budget: 1,024 tokens over a calibrated budget below it (scheduler.DEEP_BATCH_TOKENS), a calibrated
    budget above it as it is; a budget the user gives is theirs; none past what the engine was built for."""
    from encoderrt.runtime.engine import _deep_budget

    with Engine.load(tiny_artifacts["st-cls"]) as calibrated, Engine.load(tiny_artifacts["st-cls"],
                                                                            max_batch_tokens=96) as given:
        assert calibrated.info.deep_batch_tokens == max(1024, calibrated.info.max_batch_tokens)
        assert given.info.deep_batch_tokens == given.info.max_batch_tokens == 96
    assert _deep_budget(None, 512, True, 768) == 768 and _deep_budget(0, 512, True, None) == 512
    assert _deep_budget(None, 256, True, None) == 1024 and _deep_budget(None, 2048, True, None) == 2048
    assert _deep_budget(100, 512, False, None) == 512  # never below the budget
    with pytest.raises(ValueError, match="deep_batch_tokens must be 0 or more"):
        Engine.load(tiny_artifacts["st-cls"], deep_batch_tokens=-1)


@pytest.mark.parametrize("field, value, says", [
    ("intra_op_threads", -1, "intra_op_threads must be 0 (every core) or more, got -1"),
    ("calibration_latency_ms", 0.0, "calibration_latency_ms must be above 0 and finite, got 0.0"),
    ("calibration_latency_ms", float("nan"), "calibration_latency_ms must be above 0 and finite, got nan"),
    ("max_wait_ms", float("nan"), "max_wait_ms must not be negative, got nan"),
])
def test_settings_out_of_range_are_refused_naming_the_setting(field, value, says):
    """Each was taken before and quietly meant something else (-1 threads: every core; a latency cap of 0 or NaN:
    the budget calibration falls back to)."""
    from encoderrt.runtime.config import EngineConfig

    with pytest.raises(ValueError) as refused:
        EngineConfig(**{field: value})
    assert str(refused.value) == says


def test_padding_efficiency_on_a_length_mix(tiny_artifacts):
    from encoderrt.bench import workloads

    with Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=256) as engine:
        engine.embed(workloads.mixed(300))
        assert engine.stats.padding_efficiency >= 0.9


def test_duplicates_are_computed_once(ce_engine):
    before = ce_engine.stats.snapshot()
    scores = ce_engine.score(["fox"] * 6, ["dog", "dog", "cat", "dog", "cat", "dog"])
    after = ce_engine.stats.snapshot()
    assert after["deduplicated_items"] - before["deduplicated_items"] == 4
    assert after["batch_rows"] - before["batch_rows"] == 2
    assert scores[0] == scores[1] == scores[3] == scores[5] and scores[2] == scores[4]


def test_cancelled_request_is_dropped_before_it_runs(controlled, tiny_artifacts):
    with Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=64, max_wait_ms=0) as engine:
        backend = controlled[0]
        backend.gate.clear()

        async def main():
            blocker = asyncio.create_task(engine.aembed(["the first request holds the backend"]))
            await asyncio.to_thread(backend.entered.wait, 10)
            victim = asyncio.create_task(engine.aembed([f"cancelled text {i}" for i in range(30)]))
            while engine.stats.snapshot()["queue_depth"] < 30:
                await asyncio.sleep(0.001)
            victim.cancel()
            await asyncio.sleep(0)
            backend.gate.set()
            await blocker
            survivor = await engine.aembed(["after the cancellation"])
            return victim, survivor

        victim, survivor = asyncio.run(main())
        assert victim.cancelled() and survivor.shape == (1, 32)
        stats = engine.stats.snapshot()
        assert stats["cancelled_items"] == 30
        assert sum(rows for rows, _ in backend.batches) == 2  # the blocker and the survivor, nothing of the victim


def test_a_batchs_answers_reach_their_loop_in_one_call(controlled, tiny_artifacts):
    """Ten awaited requests that run as one batch are answered with one call into their loop (each call writes to
    the loop's self-pipe), not one each, and each gets its own row, as in a request of them all."""
    texts = [" ".join(["fox"] * length) for length in range(1, 11)]  # rows of their own in the tiny vocabulary
    with Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=1024, max_wait_ms=0) as engine:
        alone = engine.embed(texts)
        backend = controlled[0]
        backend.batches.clear()
        backend.entered.clear()  # set by the batch above: the blocker's run must set it again
        backend.gate.clear()

        async def main():
            loop, calls = asyncio.get_running_loop(), []
            threadsafe = loop.call_soon_threadsafe

            def counted(callback, *args, **kwargs):
                calls.append(threading.current_thread().name)
                return threadsafe(callback, *args, **kwargs)

            blocker = asyncio.create_task(engine.aembed(["holds the backend"]))
            assert await asyncio.to_thread(backend.entered.wait, 10)
            waiting = [asyncio.create_task(engine.aembed([text])) for text in texts]
            deadline = time.perf_counter() + 10
            while engine.stats.snapshot()["queue_depth"] < len(texts):
                assert time.perf_counter() < deadline, "the ten requests never all queued"
                await asyncio.sleep(0.001)
            loop.call_soon_threadsafe = counted
            backend.gate.set()
            await blocker
            answers = await asyncio.gather(*waiting)
            loop.call_soon_threadsafe = threadsafe
            return answers, calls

        answers, calls = asyncio.run(main())
        assert [rows for rows, _ in backend.batches] == [1, len(texts)]
        assert len([name for name in calls if name.startswith("encoderrt-batcher")]) == 2  # one a batch
        for row, answer in zip(alone, answers):
            np.testing.assert_allclose(answer[0], row, atol=1e-5)


def test_full_queue_fails_at_once(controlled, tiny_artifacts):
    with Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=64, max_queue_items=10, max_wait_ms=0) as engine:
        backend = controlled[0]
        backend.gate.clear()
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(engine.embed, ["holds the backend"])
            assert backend.entered.wait(10)
            queued = pool.submit(engine.embed, [f"waiting {i}" for i in range(10)])
            while engine.stats.snapshot()["queue_depth"] < 10:
                time.sleep(0.001)
            start = time.perf_counter()
            with pytest.raises(Overloaded, match="queue is full"):
                engine.embed(["one too many"])
            assert time.perf_counter() - start < 1.0
            with pytest.raises(InvalidRequest, match="larger than the engine's queue"):
                engine.embed([f"huge {i}" for i in range(11)])
            backend.gate.set()
            assert first.result(10).shape == (1, 32) and queued.result(10).shape == (10, 32)
        assert engine.stats.snapshot()["overloaded"] == 1


def test_backend_failure_fails_only_its_batch(controlled, tiny_artifacts):
    with Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=256) as engine:
        backend = controlled[0]
        backend.fail_next = True
        with pytest.raises(InferenceFailed, match="inference failed for a batch of 1 rows") as failure:
            engine.embed(["this batch fails"])
        assert "simulated device fault" in str(failure.value.__cause__)
        assert engine.embed(["the next batch succeeds"]).shape == (1, 32)
        assert engine.stats.snapshot()["failed_batches"] == 1


@pytest.mark.parametrize("where", ["forming", "answering"])
def test_a_fault_of_the_batching_loop_fails_its_requests_and_the_workers_go_on(where, tiny_artifacts, monkeypatch,
                                                                                caplog):
    """Not the backend's failure (above) but the loop's own, in cutting a batch from the queue or in handing out its
    rows: the requests it touched fail, the log has the traceback, and the workers keep serving (a worker that died
    left every later request waiting for ever)."""
    from encoderrt.runtime.scheduler import _Ticket
    from encoderrt.runtime.waiting import WaitingRows

    with Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=256) as engine:
        target, name = (WaitingRows, "take") if where == "forming" else (_Ticket, "deliver")
        real, faults = getattr(target, name), [RuntimeError(f"simulated fault in {where}")]

        def faulty(self, *args):
            if faults:
                raise faults.pop()
            return real(self, *args)

        monkeypatch.setattr(target, name, faulty)

        def embed(texts):  # a hang fails the test (the wait is cancelled) rather than stalling it
            return asyncio.run(asyncio.wait_for(engine.aembed(texts), 10))

        with pytest.raises(InferenceFailed, match="the engine failed on this request; the server log has the cause"):
            embed(["this one meets the fault"])
        assert embed(["the next one runs", "and so does its neighbour"]).shape == (2, 32)
        assert engine.stats.snapshot()["queue_depth"] == 0
    assert f"simulated fault in {where}" in caplog.text


def test_closed_engine_refuses_work(tiny_artifacts):
    from encoderrt.runtime.errors import EngineClosed

    engine = Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=256)
    engine.close()
    with pytest.raises(EngineClosed):
        engine.embed(["late"])


def test_truncation_to_a_shorter_length(minilm_engine, st_model):
    text = " ".join(["rivers and mountains"] * 30)
    assert len(minilm_engine.tokenize(text, truncate=16)) == 16
    st_model.max_seq_length = 16
    try:
        reference = st_model.encode([text], normalize_embeddings=True)
    finally:
        st_model.max_seq_length = 256
    assert float((minilm_engine.embed([text], truncate=16) * reference).sum()) >= 0.99999
    with pytest.raises(InvalidRequest, match="truncation length must be an integer from 2 to 256"):
        minilm_engine.embed([text], truncate=1000)


def test_token_id_input(minilm_engine):
    from encoderrt import EmbedRequest

    text = "token ids in, the same vector out"
    ids = minilm_engine.tokenize(text)
    by_ids = minilm_engine.run(EmbedRequest(token_ids=[ids])).value
    np.testing.assert_allclose(by_ids, minilm_engine.embed([text]), atol=1e-6)
    with pytest.raises(InvalidRequest, match="token ids of input 0 must be integers from 0 to 30521"):
        minilm_engine.run(EmbedRequest(token_ids=[[101, 99999999]]))


@pytest.mark.parametrize("vocab_size", [30522, 99])
def test_calibration_feeds_only_ids_inside_the_vocabulary(vocab_size):
    """A 99-token vocabulary (the tiny Unigram checkpoints) once got id 100, and Engine.load failed in the backend."""
    from encoderrt.runtime.backends import Capabilities
    from encoderrt.runtime.calibration import calibrate
    from encoderrt.runtime.tokenizer import Tokens

    class Recording:
        max_batch_tokens = None
        parallel_runs = 1
        capabilities = Capabilities()
        output_names = ("embeddings",)

        def __init__(self):
            self.fed: list[np.ndarray] = []

        def run(self, batch):
            ids = batch.padded()["input_ids"]
            if not self.fed or ids is not self.fed[-1]:  # each batch once, not each of its timed runs
                self.fed.append(ids)
            return {"embeddings": np.zeros((len(batch.rows), 4), dtype=np.float32)}

    def pad(rows: list[Tokens]) -> dict[str, np.ndarray]:
        return {"input_ids": np.array([row.ids for row in rows])}

    backend = Recording()
    result = calibrate(backend, pad, max_length=64, vocab_size=vocab_size, latency_cap_ms=1e9)
    assert result.max_batch_tokens >= 64 and backend.fed
    assert all(0 <= ids.min() and ids.max() < vocab_size for ids in backend.fed)
    assert len(np.unique(backend.fed[0])) > 3  # still varied text, not one repeated id


def test_an_engine_left_open_with_a_batch_running_lets_the_interpreter_exit(minilm_fp32):
    """A script that ends (an exception, Ctrl-C) while its engine runs a batch: the engine stops at exit once the
    batch is done, and the process exits with its own status; onnxruntime aborted it (SIGABRT) mid-teardown before."""
    script = textwrap.dedent("""
        import sys, threading, time
        from encoderrt import Engine
        engine = Engine.load(sys.argv[1])
        texts = [f"passage {i} " + "word " * 200 for i in range(400)]
        threading.Thread(target=lambda: engine.embed(texts), daemon=True).start()
        while engine.stats.snapshot()["items"] == 0:
            time.sleep(0.01)
        time.sleep(0.5)
        raise SystemExit("leaving with work in flight")
    """)
    done = subprocess.run([sys.executable, "-c", script, str(minilm_fp32.path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "leaving with work in flight" in done.stderr and "terminate called" not in done.stderr
