"""TEI's gRPC API: a TEI client's own stubs (compiled from tei.proto by grpcio-tools), and a call encoded by hand
from TEI's field numbers, against sentence-transformers and the HTTP routes."""

import importlib
import struct
import sys
import time

import grpc
import httpx
import numpy as np
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from encoderrt import Engine, proto
from encoderrt.proto.__main__ import compile_descriptors
from encoderrt.server import ServerSettings, create_app
from encoderrt.server.registry import ModelRegistry
from server_helpers import free_port, ready_registry, retrieval_models, running_server

KEY = "grpc-secret"
AUTH = (("authorization", f"Bearer {KEY}"),)
TEXTS = ["how do I bake bread", "the weather in Lisbon", "a b c", "gRPC streams amortise a request's cost",
         "ünïcödé and emoji 🚀", "x " * 40]


@pytest.fixture(scope="module")
def tei(tmp_path_factory):
    """TEI's Python client as its users make it: stubs compiled from tei.proto."""
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("tei-client")
    assert protoc.main(["protoc", f"-I{proto.PROTO.parent}", f"--python_out={out}", f"--grpc_python_out={out}",
                        proto.PROTO.name]) == 0
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module("tei_pb2"), importlib.import_module("tei_pb2_grpc")
    finally:
        sys.path.remove(str(out))


@pytest.fixture(scope="module")
def grpc_served(minilm_fp32, tiny_artifacts):
    settings = ServerSettings(max_client_batch_size=64, grpc_port=free_port(), api_key=KEY)
    with running_server(create_app(settings, retrieval_models(minilm_fp32, tiny_artifacts)), settings) as url:
        with grpc.insecure_channel(f"127.0.0.1:{settings.grpc_port}") as channel:
            yield url, channel


@pytest.fixture(scope="module")
def channel(grpc_served):
    return grpc_served[1]


@pytest.fixture(scope="module")
def http(grpc_served):
    with httpx.Client(base_url=grpc_served[0], timeout=60, headers={"Authorization": f"Bearer {KEY}"}) as client:
        yield client


@pytest.fixture(scope="module")
def minilm_reference(minilm_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")


def test_the_shipped_descriptors_are_the_proto_compiled(tmp_path):
    compile_descriptors(str(tmp_path / "tei.binpb"))
    fresh = descriptor_pb2.FileDescriptorSet.FromString((tmp_path / "tei.binpb").read_bytes())
    assert fresh == descriptor_pb2.FileDescriptorSet.FromString(proto.DESCRIPTORS.read_bytes()), \
        "tei.proto changed: run python -m encoderrt.proto"


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def test_a_call_encoded_by_hand_from_teis_field_numbers_is_answered(channel, minilm_reference):
    """TEI's EmbedRequest: inputs = 1 (string), truncate = 2, normalize = 3 (bools); EmbedResponse: embeddings = 1
    (packed floats), metadata = 2 (compute_tokens = 2)."""
    text = "hello world".encode()
    request = b"\x0a" + bytes([len(text)]) + text + b"\x10\x01" + b"\x18\x01"
    reply = channel.unary_unary("/tei.v1.Embed/Embed")(request, metadata=AUTH, timeout=30)
    fields, at = {}, 0
    while at < len(reply):
        key, at = _varint(reply, at)
        assert key & 7 == 2, "both of EmbedResponse's fields are length-delimited"
        length, at = _varint(reply, at)
        fields[key >> 3], at = reply[at:at + length], at + length
    vector = np.array(struct.unpack(f"<{len(fields[1]) // 4}f", fields[1]))
    expected = minilm_reference.encode("hello world", normalize_embeddings=True)
    np.testing.assert_allclose(vector, expected, atol=2e-5)
    metadata, at = {}, 0
    while at < len(fields[2]):  # every Metadata field is a varint
        key, at = _varint(fields[2], at)
        metadata[key >> 3], at = _varint(fields[2], at)
    assert (metadata[1], metadata[2]) == (11, 4)  # compute_chars; compute_tokens: [CLS] hello world [SEP]


def test_embed_and_its_stream_match_sentence_transformers_in_order(channel, tei, minilm_reference):
    pb, stubs = tei
    embed = stubs.EmbedStub(channel)
    expected = minilm_reference.encode(TEXTS, normalize_embeddings=True)
    single = embed.Embed(pb.EmbedRequest(inputs=TEXTS[0], normalize=True, truncate=True), metadata=AUTH, timeout=30)
    np.testing.assert_allclose(single.embeddings, expected[0], atol=2e-5)
    assert single.metadata.compute_chars == len(TEXTS[0]) and single.metadata.inference_time_ns > 0
    many = TEXTS * 20
    replies = list(embed.EmbedStream(iter(pb.EmbedRequest(inputs=t, normalize=True, truncate=True) for t in many),
                                     metadata=AUTH, timeout=60))
    assert len(replies) == len(many)
    np.testing.assert_allclose(np.array([r.embeddings for r in replies]), np.tile(expected, (20, 1)), atol=2e-5)
    raw = np.array(embed.Embed(pb.EmbedRequest(inputs=TEXTS[1], normalize=False, truncate=True), metadata=AUTH,
                               timeout=30).embeddings)
    assert np.linalg.norm(raw) > 1.5  # the mean-pooled vector, before the model's Normalize module
    np.testing.assert_allclose(raw / np.linalg.norm(raw), expected[1], atol=2e-5)


def test_a_stream_of_mixed_settings_answers_each_message_as_embed_does(channel, tei):
    """Messages run in groups of one setting; each reply is the one a unary Embed gives, its own token count too."""
    pb, stubs = tei
    embed = stubs.EmbedStub(channel)
    messages = [pb.EmbedRequest(inputs=text, normalize=i % 3 != 0, truncate=True,
                                truncation_direction=pb.TRUNCATION_DIRECTION_LEFT if i % 5 == 0 else 0)
                for i, text in enumerate(TEXTS * 8)]
    streamed = list(embed.EmbedStream(iter(messages), metadata=AUTH, timeout=60))
    assert len(streamed) == len(messages)
    for message, reply in zip(messages, streamed):
        alone = embed.Embed(message, metadata=AUTH, timeout=30)
        np.testing.assert_allclose(reply.embeddings, alone.embeddings, atol=2e-5)
        assert reply.metadata.compute_tokens == alone.metadata.compute_tokens
        assert reply.metadata.compute_chars == len(message.inputs)


def _stream_through(key, fail_on=None, messages=20, backlogged=lambda: True):
    """The replies `_stream` gives for messages 0..messages-1, and the calls it made (message lists), with the
    engine `backlogged` as the function says (by default always: the messages group)."""
    import asyncio

    calls = []

    async def run(group):
        calls.append(list(group))
        await asyncio.sleep(0)
        if fail_on in group:
            raise ValueError(f"message {fail_on} is bad")
        return [message * 10 for message in group]

    return _replies(run, messages, key, backlogged, ValueError), calls


def _replies(run, messages, key, backlogged, error_type):
    """What `_stream` answers to messages 0..messages-1 through `run`, and the `error_type` error that ended it."""
    import asyncio

    from encoderrt.server.tei_grpc import _stream

    async def source():
        for message in range(messages):
            yield message

    async def main():
        replies = []
        try:
            async for reply in _stream(run, source(), key, backlogged):
                replies.append(reply)
        except error_type as error:
            replies.append(error)
        return replies

    return asyncio.run(asyncio.wait_for(main(), timeout=30))  # a stream that hangs fails its test


def test_a_stream_groups_the_messages_that_arrive_while_its_engine_is_backlogged():
    """The first message runs at once (the stream has nothing running); those that arrive behind it gather, and
    each call that ends hands its place to the next group: consecutive messages of one key, at most GROUP_MESSAGES."""
    from encoderrt.server.tei_grpc import GROUP_MESSAGES

    replies, calls = _stream_through(key=lambda message: message // 8)
    assert replies == [message * 10 for message in range(20)]
    assert calls == [[0], list(range(1, 8)), list(range(8, 16)), list(range(16, 20))]
    replies, calls = _stream_through(key=lambda message: 0, messages=1 + GROUP_MESSAGES + 10)
    assert [len(call) for call in calls] == [1, GROUP_MESSAGES, 10]  # groups have a cap


def test_a_stream_sends_each_message_as_it_arrives_while_its_engine_is_not_backlogged():
    """Held back, they starved the engine's batches; each goes now, and the engine batches them."""
    replies, calls = _stream_through(key=lambda message: 0, backlogged=lambda: False)
    assert replies == [message * 10 for message in range(20)]
    assert calls == [[message] for message in range(20)]
    answers = iter([False] * 5 + [True] * 100)  # the engine backs up after the fifth message
    replies, calls = _stream_through(key=lambda message: 0, backlogged=lambda: next(answers))
    assert replies == [message * 10 for message in range(20)]
    assert calls[:6] == [[message] for message in range(6)] and sum(map(len, calls)) == 20 and len(calls) < 20


def test_a_stream_whose_backlog_cannot_be_read_runs_every_message_and_does_not_hang(caplog):
    """Whether the engine is backlogged is asked as calls end too (in a done callback, where an exception is only
    logged): one that raises there must count as not backlogged, or the messages waiting would never start. It is
    asked for every message, and logged once."""
    calls_made = []

    def backlogged():
        calls_made.append(None)
        if len(calls_made) > 3:
            raise RuntimeError("the engine went away")
        return True

    replies, calls = _stream_through(key=lambda message: 0, backlogged=backlogged)
    assert replies == [message * 10 for message in range(20)]
    assert sorted(message for call in calls for message in call) == list(range(20))
    assert len(calls_made) > 5  # it was asked, and raised, more than once, and the stream went on
    warnings = [record for record in caplog.records if "backlogged" in record.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info[1].args == ("the engine went away",)


def _stream_against_a_queue(capacity, messages=60, others_work=0, backlogged=lambda: False):
    """`_stream` over an engine whose queue admits a call while it holds at most `capacity` messages, `others_work`
    of them other clients' (which never drain); each admitted call takes a millisecond a message. Returns the
    replies (an error last, where the stream ended with one), the calls refused and the most messages queued at
    once."""
    import asyncio

    from encoderrt.runtime.errors import Overloaded

    queued, refused, most = [others_work], [], [0]

    async def run(group):
        if queued[0] + len(group) > capacity and queued[0] > 0:  # as Admission: an empty queue admits anything
            refused.append(list(group))
            raise Overloaded(f"the engine's queue holds {queued[0]} messages")
        queued[0] += len(group)
        most[0] = max(most[0], queued[0])
        await asyncio.sleep(0.001 * len(group))
        queued[0] -= len(group)
        return [message * 10 for message in group]

    return _replies(run, messages, lambda message: 0, backlogged, Overloaded), refused, most[0]


def test_a_stream_is_held_back_not_failed_by_the_queue_its_own_calls_filled():
    """A client pushing a corpus through EmbedStream was failed with RESOURCE_EXHAUSTED by its own read-ahead."""
    replies, refused, most = _stream_against_a_queue(capacity=8)  # a call a message, as they arrive
    assert replies == [message * 10 for message in range(60)]
    assert len(refused) >= 10 and most == 8  # refused calls ran again once the stream's own had left the queue
    replies, refused, most = _stream_against_a_queue(capacity=8, messages=200, backlogged=lambda: True)
    assert replies == [message * 10 for message in range(200)] and most <= 64  # groups, one call at a time


def test_a_stream_refused_for_other_clients_work_gets_the_error_and_does_not_hang():
    replies, refused, _ = _stream_against_a_queue(capacity=8, others_work=8)
    assert isinstance(replies[-1], Exception) and "holds 8 messages" in str(replies[-1])
    assert replies[:-1] == [message * 10 for message in range(len(replies) - 1)]
    # with room beside the others' work, a refused group runs message by message, each held back, none failed
    replies, refused, most = _stream_against_a_queue(capacity=8, others_work=5, backlogged=lambda: True)
    assert replies == [message * 10 for message in range(60)] and refused and most <= 8


def test_a_corpus_pushed_through_embed_stream_is_answered_whole_by_a_server_with_a_short_queue(minilm_fp32, tei):
    """The server's own queue limit (--max-queue-seconds, here 0.2 s: a few passages' worth) holds the stream back;
    the reference is the same engine's answer over HTTP."""
    pb, stubs = tei
    passages = [f"passage {i}: " + "rivers carry water and sediment downhill to the sea " * 20 for i in range(120)]
    engine = Engine.load(minilm_fp32.path, max_batch_tokens=1024, max_queue_seconds=0.2)
    settings = ServerSettings(grpc_port=free_port())
    with running_server(create_app(settings, ready_registry(minilm=engine)), settings) as url:
        with grpc.insecure_channel(f"127.0.0.1:{settings.grpc_port}") as channel:
            messages = (pb.EmbedRequest(inputs=text, truncate=True, normalize=True) for text in passages)
            replies = list(stubs.EmbedStub(channel).EmbedStream(messages, timeout=120))
        expected = httpx.post(f"{url}/embed", json={"inputs": passages[:8], "truncate": True}, timeout=60).json()
    assert len(replies) == len(passages)
    np.testing.assert_allclose([list(r.embeddings) for r in replies[:8]], expected, atol=1e-5)
    assert engine.stats.snapshot()["overloaded"] > 0  # the queue did refuse the stream's calls, which ran again


def test_a_failed_group_runs_again_message_by_message():
    replies, calls = _stream_through(key=lambda message: message // 8, fail_on=13)
    assert replies[:13] == [message * 10 for message in range(13)]
    assert isinstance(replies[13], ValueError) and len(replies) == 14  # the stream ends at the bad message
    assert list(range(8, 16)) in calls and all([message] in calls for message in range(8, 16))


def test_a_message_whose_key_fails_ends_the_stream_there_and_does_not_hang_it():
    def key(message):
        if message == 5:
            raise ValueError("message 5 has no settings")
        return 0

    replies, calls = _stream_through(key=key)
    assert replies[:5] == [message * 10 for message in range(5)]
    assert isinstance(replies[5], ValueError) and len(replies) == 6
    assert all(5 not in call for call in calls)


def test_truncation_direction_keeps_the_end(channel, tei, http):
    pb, stubs = tei
    long = " ".join(f"word{i}" for i in range(400))
    left = stubs.EmbedStub(channel).Embed(pb.EmbedRequest(inputs=long, normalize=True, truncate=True,
                                                          truncation_direction=pb.TRUNCATION_DIRECTION_LEFT),
                                          metadata=AUTH, timeout=30)
    over_http = http.post("/embed", json={"inputs": long, "truncation_direction": "Left"}).json()[0]
    np.testing.assert_allclose(left.embeddings, over_http, atol=1e-6)


def test_rerank_and_its_stream_match_the_cross_encoder(channel, tei, tiny_models):
    from sentence_transformers import CrossEncoder

    pb, stubs = tei
    query, texts = "what is bread", TEXTS[:5]
    scores = CrossEncoder(str(tiny_models["bert-cross-encoder"]), device="cpu").predict([(query, t) for t in texts])
    expected = sorted(range(len(texts)), key=lambda i: -scores[i])
    rerank = stubs.RerankStub(channel)
    reply = rerank.Rerank(pb.RerankRequest(query=query, texts=texts, truncate=True, return_text=True),
                          metadata=AUTH, timeout=30)
    assert [r.index for r in reply.ranks] == expected
    np.testing.assert_allclose([r.score for r in reply.ranks], scores[expected], atol=1e-5)
    assert [r.text for r in reply.ranks] == [texts[i] for i in expected]
    streamed = rerank.RerankStream(iter(pb.RerankStreamRequest(query=query, text=t, truncate=True) for t in texts),
                                   metadata=AUTH, timeout=30)
    assert [(r.index, r.HasField("text")) for r in streamed.ranks] == [(i, False) for i in expected]
    np.testing.assert_allclose([r.score for r in streamed.ranks], scores[expected], atol=1e-5)
    queries = ["what is bread", "weather", "letters", "networking", "unicode"]
    pairs = CrossEncoder(str(tiny_models["bert-cross-encoder"]), device="cpu").predict(list(zip(queries, texts)))
    mixed = rerank.RerankStream(iter(pb.RerankStreamRequest(query=q, text=t, truncate=True)
                                     for q, t in zip(queries, texts)), metadata=AUTH, timeout=30)
    assert [r.index for r in mixed.ranks] == sorted(range(5), key=lambda i: -pairs[i])


def test_predict_answers_as_the_http_route(channel, tei, http):
    pb, stubs = tei
    predict = stubs.PredictStub(channel)
    for raw_scores in (False, True):
        reply = predict.Predict(pb.PredictRequest(inputs=TEXTS[0], truncate=True, raw_scores=raw_scores),
                                metadata=AUTH, timeout=30)
        expected = http.post("/predict", json={"inputs": TEXTS[0], "raw_scores": raw_scores}).json()
        assert [p.label for p in reply.predictions] == [p["label"] for p in expected]
        np.testing.assert_allclose([p.score for p in reply.predictions], [p["score"] for p in expected], atol=1e-6)
    streamed = list(predict.PredictStream(iter(pb.PredictRequest(inputs=t, truncate=True) for t in TEXTS),
                                          metadata=AUTH, timeout=30))
    expected = http.post("/predict", json={"inputs": [[t] for t in TEXTS]}).json()
    assert [[p.label for p in r.predictions] for r in streamed] == [[p["label"] for p in e] for e in expected]
    pair = predict.PredictPair(pb.PredictPairRequest(inputs=["a question", "an answer"], truncate=True),
                               metadata=[*AUTH, ("model", "reranker")], timeout=30)
    over_http = http.post("/predict", json={"model": "reranker", "inputs": ["a question", "an answer"]}).json()
    assert pair.predictions[0].score == pytest.approx(over_http[0]["score"], abs=1e-6)


def test_embed_all_and_predict_pair_streams_answer_as_the_http_routes(channel, tei, http):
    """Their messages run in groups too: each reply is still its own message's, in order, with its own counts."""
    pb, stubs = tei
    embed = stubs.EmbedStub(channel)
    streamed = list(embed.EmbedAllStream(iter(pb.EmbedAllRequest(inputs=t, truncate=True) for t in TEXTS * 3),
                                         metadata=AUTH, timeout=60))
    expected = http.post("/embed_all", json={"inputs": TEXTS, "truncate": True}).json()
    assert len(streamed) == len(TEXTS) * 3
    for i, reply in enumerate(streamed):
        states = np.array([token.embeddings for token in reply.token_embeddings])
        np.testing.assert_allclose(states, np.array(expected[i % len(TEXTS)]), atol=1e-5)
        text = TEXTS[i % len(TEXTS)]
        assert (reply.metadata.compute_tokens, reply.metadata.compute_chars) == (len(states), len(text))
    pairs = [(f"question {i}", text) for i, text in enumerate(TEXTS * 2)]
    predict = stubs.PredictStub(channel)
    scored = list(predict.PredictPairStream(iter(pb.PredictPairRequest(inputs=list(p), truncate=True) for p in pairs),
                                            metadata=[*AUTH, ("model", "reranker")], timeout=60))
    over_http = [http.post("/predict", json={"model": "reranker", "inputs": list(p)}).json()[0]["score"] for p in pairs]
    np.testing.assert_allclose([reply.predictions[0].score for reply in scored], over_http, atol=1e-6)
    alone = predict.PredictPair(pb.PredictPairRequest(inputs=list(pairs[3]), truncate=True),
                                metadata=[*AUTH, ("model", "reranker")], timeout=30)
    assert scored[3].metadata.compute_tokens == alone.metadata.compute_tokens > 0
    bad = [pb.PredictPairRequest(inputs=list(pairs[0]), truncate=True), pb.PredictPairRequest(inputs=["one"])]
    replies = predict.PredictPairStream(iter(bad), metadata=[*AUTH, ("model", "reranker")], timeout=30)
    assert next(replies).predictions[0].score == pytest.approx(over_http[0], abs=1e-6)  # its group-mate failed
    code, details = _code(lambda: next(replies))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "a [text, text_pair] pair, got 1 texts" in details


def test_info_describes_the_first_model(channel, tei, http):
    pb, stubs = tei
    info = stubs.InfoStub(channel).Info(pb.InfoRequest(), metadata=AUTH, timeout=30)
    over_http = http.get("/info").json()
    assert (info.model_id, info.model_type, info.max_input_length, info.max_client_batch_size) == \
        (over_http["model_id"], pb.MODEL_TYPE_EMBEDDING, over_http["max_input_length"], 64)


def test_each_grouped_method_answers_alone_as_its_stream_answers_one_message(channel, tei):
    """X and XStream share one group handler (GROUPED): the unary call is the stream's one-message group."""
    pb, stubs = tei
    embed, predict = stubs.EmbedStub(channel), stubs.PredictStub(channel)
    reranker = [*AUTH, ("model", "reranker")]
    cases = [(embed.Embed, embed.EmbedStream, pb.EmbedRequest(inputs=TEXTS[1], truncate=True, normalize=True), AUTH),
             (embed.EmbedAll, embed.EmbedAllStream, pb.EmbedAllRequest(inputs=TEXTS[1], truncate=True), AUTH),
             (predict.Predict, predict.PredictStream, pb.PredictRequest(inputs=TEXTS[1], truncate=True), AUTH),
             (predict.PredictPair, predict.PredictPairStream,
              pb.PredictPairRequest(inputs=["a question", "an answer"], truncate=True), reranker)]
    for unary, stream, message, metadata in cases:
        alone = unary(message, metadata=metadata, timeout=30)
        [streamed] = list(stream(iter([message]), metadata=metadata, timeout=30))
        alone.metadata.Clear(), streamed.metadata.Clear()  # timings differ
        assert alone == streamed, unary
    # a dense model has no sparse output: the unary call and its stream end with the same status
    unary_code = _code(lambda: embed.EmbedSparse(pb.EmbedSparseRequest(inputs="x"), metadata=AUTH, timeout=30))
    stream_code = _code(lambda: list(embed.EmbedSparseStream(iter([pb.EmbedSparseRequest(inputs="x")]),
                                                             metadata=AUTH, timeout=30)))
    assert unary_code == stream_code and unary_code[0] != grpc.StatusCode.UNIMPLEMENTED
    code, _ = _code(lambda: stubs.TokenizeStub(channel).Tokenize(pb.EncodeRequest(inputs="x"), metadata=AUTH,
                                                                 timeout=30))
    assert code == grpc.StatusCode.UNIMPLEMENTED  # TEI's, not served here (the module's docstring)


def _code(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as failed:
        call()
    return failed.value.code(), failed.value.details()


def test_errors_end_the_call_with_the_code_of_their_http_status(channel, tei):
    pb, stubs = tei
    embed, rerank = stubs.EmbedStub(channel), stubs.RerankStub(channel)
    code, details = _code(lambda: embed.Embed(pb.EmbedRequest(inputs="word " * 400, truncate=False),
                                              metadata=AUTH, timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "above the model's limit of 256 tokens" in details
    code, details = _code(lambda: rerank.Rerank(pb.RerankRequest(query="q", texts=["t"] * 65), metadata=AUTH, timeout=30))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "65 items, above this server's limit of 64" in details
    code, details = _code(lambda: embed.Embed(pb.EmbedRequest(inputs="x"), metadata=[*AUTH, ("model", "nope")],
                                              timeout=30))
    assert code == grpc.StatusCode.NOT_FOUND and "model 'nope' is not served" in details
    bad_stream = [pb.EmbedRequest(inputs="fine", truncate=True), pb.EmbedRequest(inputs="word " * 400, truncate=False)]
    replies = embed.EmbedStream(iter(bad_stream), metadata=AUTH, timeout=30)
    assert len(next(replies).embeddings) == 384
    code, details = _code(lambda: next(replies))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "above the model's limit" in details
    code, _ = _code(lambda: embed.Embed(pb.EmbedRequest(inputs="x" * (3 << 20)), metadata=AUTH, timeout=30))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED  # past --max-body-bytes, as HTTP's 413
    code, _ = _code(lambda: stubs.TokenizeStub(channel).Tokenize(pb.EncodeRequest(inputs="x"), metadata=AUTH, timeout=30))
    assert code == grpc.StatusCode.UNIMPLEMENTED
    # proto3 keeps an enum value the proto does not define, as a newer client's would be: the caller's error, named
    unknown_side = [pb.EmbedRequest(inputs="fine", truncate=True), pb.EmbedRequest(inputs="x", truncation_direction=2)]
    code, details = _code(lambda: embed.Embed(unknown_side[1], metadata=AUTH, timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "truncation_direction 2 is not one of" in details
    replies = embed.EmbedStream(iter(unknown_side), metadata=AUTH, timeout=30)
    assert len(next(replies).embeddings) == 384
    code, details = _code(lambda: next(replies))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "truncation_direction 2 is not one of" in details
    code, details = _code(lambda: embed.EmbedAll(pb.EmbedAllRequest(inputs="x", truncation_direction=-1),
                                                 metadata=AUTH, timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "truncation_direction -1 is not one of" in details
    ok = embed.Embed(pb.EmbedRequest(inputs="still serving", truncate=True), metadata=AUTH, timeout=30)
    assert len(ok.embeddings) == 384


def test_the_api_key_is_asked_of_every_call_but_health_and_reflection(channel, tei):
    pb, stubs = tei
    for metadata in ((), (("authorization", "Bearer wrong"),), (("authorization", KEY),)):
        code, details = _code(lambda: stubs.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="x"), metadata=metadata,
                                                                     timeout=30))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "Bearer <key>" in details
    code, _ = _code(lambda: list(stubs.EmbedStub(channel).EmbedStream(iter([pb.EmbedRequest(inputs="x")]), timeout=30)))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "tei.v1.Embed", "tei.v1.Rerank"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status == \
            health_pb2.HealthCheckResponse.SERVING
    listed = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
    names = {s.name for s in next(listed).list_services_response.service}
    assert {"tei.v1.Embed", "tei.v1.Predict", "tei.v1.Rerank", "tei.v1.Info", "grpc.health.v1.Health"} <= names


def test_calls_are_counted_in_the_metrics(grpc_served, channel, tei):
    pb, stubs = tei
    stubs.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="count me", truncate=True), metadata=AUTH, timeout=30)
    text = httpx.get(f"{grpc_served[0]}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    line = next(line for line in text.splitlines()
                if line.startswith("encoderrt_grpc_calls_total") and 'method="/tei.v1.Embed/Embed"' in line
                and 'code="OK"' in line)
    assert float(line.rsplit(" ", 1)[1]) >= 1


def _thread_cpu(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    return {line.split('thread="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("encoderrt_thread_cpu_seconds_total{")}


def test_the_event_loops_cpu_is_reported_each_loop_apart(grpc_served, channel, tei):
    """`encoderrt_thread_cpu_seconds`: the gRPC server's thread grows with gRPC calls, uvicorn's with HTTP requests,
    and neither by more than the whole process (this test's, which runs the server) spent meanwhile."""
    pb, stubs = tei
    url = grpc_served[0]
    before, process = _thread_cpu(url), time.process_time()
    embed = stubs.EmbedStub(channel)
    for index in range(300):
        embed.Embed(pb.EmbedRequest(inputs=f"call {index}", truncate=True), metadata=AUTH, timeout=30)
    middle, spent = _thread_cpu(url), time.process_time() - process
    assert set(before) == {"event_loop", "grpc"}
    assert 0 < middle["grpc"] - before["grpc"] <= spent + 0.02  # /proc counts 10 ms ticks
    with httpx.Client(headers={"Authorization": f"Bearer {KEY}"}) as client:
        for index in range(300):
            assert client.post(f"{url}/embed", json={"inputs": f"request {index}"}).status_code == 200
    after = _thread_cpu(url)
    assert after["event_loop"] - middle["event_loop"] > 0.01
    assert after["event_loop"] - middle["event_loop"] > after["grpc"] - middle["grpc"]


def test_whether_a_streams_engine_is_backlogged_never_raises(minilm_fp32):
    """A stream asks before each message it could hold back (tei_grpc._stream); a model that cannot answer is the
    message's own error to get, so the question answers False: were it to raise there, the message would never run
    and its stream would hang."""
    from encoderrt.server.tei_grpc import TEIService

    registry = ModelRegistry()
    service = TEIService(registry, ServerSettings())
    assert service.backlogged("embed", None) is False  # not ready
    with Engine.load(minilm_fp32.path) as engine:
        registry.add("minilm", engine)
        registry.mark_ready()
        assert service.backlogged("embed", "no-such-model") is False
        assert service.backlogged("rerank", None) is False  # no model answers it
        assert service.backlogged("embed", None) is engine.backlogged() is False


def test_health_says_not_serving_until_the_models_are_ready(minilm_fp32, tei):
    pb, stubs = tei
    registry = ModelRegistry()
    settings = ServerSettings(grpc_port=free_port())
    with running_server(create_app(settings, registry), settings), \
            grpc.insecure_channel(f"127.0.0.1:{settings.grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == \
            health_pb2.HealthCheckResponse.NOT_SERVING
        code, details = _code(lambda: stubs.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="x"), timeout=10))
        assert code == grpc.StatusCode.UNAVAILABLE and "models are still loading" in details
        streams = [(stubs.EmbedStub(channel).EmbedStream, pb.EmbedRequest(inputs="x")),
                   (stubs.EmbedStub(channel).EmbedSparseStream, pb.EmbedSparseRequest(inputs="x")),
                   (stubs.PredictStub(channel).PredictStream, pb.PredictRequest(inputs="x"))]
        for stream, message in streams:  # a stream ends with the same status, and never hangs
            code, details = _code(lambda: list(stream(iter([message] * 3), timeout=10)))
            assert code == grpc.StatusCode.UNAVAILABLE and "models are still loading" in details, stream
        registry.add("minilm", Engine.load(minilm_fp32.path))
        registry.mark_ready()
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == \
            health_pb2.HealthCheckResponse.SERVING
        assert len(stubs.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="x"), timeout=30).embeddings) == 384


def test_a_busy_grpc_port_is_a_clear_error_at_start():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        from encoderrt.server.tei_grpc import GrpcServer

        with pytest.raises(OSError, match=f"cannot listen for gRPC on 127.0.0.1:{port}"):
            GrpcServer(ModelRegistry(), ServerSettings(grpc_port=port)).start()
