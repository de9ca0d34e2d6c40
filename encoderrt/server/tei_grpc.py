"""TEI's gRPC API (tei.v1: Info, Embed, Predict, Rerank, with their streams), grpc.health.v1 and reflection, on a
port of its own (--grpc-port), answered by the same engines under the same limits as the HTTP routes.

TEI's own clients work unmodified: the messages are tei.proto's (server/proto). A stream's messages run
concurrently and come back in the order they were sent; a high-rate client sends many queries on one stream and
pays no HTTP request each. The messages that arrive while the stream's engine requests run are answered together,
as one request, when they share their settings: a query's cost on the event loop is paid once a group.
An error ends the call (a stream with it) with the gRPC code of the HTTP status the same error gets.

grpc.aio needs an asyncio loop of its own (uvicorn's is uvloop's), so the server runs in a thread with one; the
engine does not mind which loop awaits it. With --api-key, every call but health and reflection carries
`authorization: Bearer KEY` metadata, as TEI's do. Tokenize is TEI's too but not served here (UNIMPLEMENTED).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import hmac
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from typing import Any, NamedTuple

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from encoderrt import proto
from encoderrt.runtime.errors import EngineError, InvalidRequest, Overloaded
from encoderrt.runtime.requests import Completion
from encoderrt.runtime.tasks import EmbedRequest, RerankRequest, ScoreRequest, SparseEmbedRequest
from encoderrt.runtime.tasks.rerank import rank
from encoderrt.server import common, tei
from encoderrt.server.errors import INTERNAL_ERROR, APIError, status_of
from encoderrt.server.health import ServingHealth
from encoderrt.server.metrics import Metrics
from encoderrt.server.registry import ModelRegistry, ServedModel
from encoderrt.server.settings import ServerSettings

log = logging.getLogger("encoderrt.server")

CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED, 404: grpc.StatusCode.NOT_FOUND,
         413: grpc.StatusCode.RESOURCE_EXHAUSTED, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
         503: grpc.StatusCode.UNAVAILABLE}
"""HTTP status of an error (errors.status_of) -> its gRPC code; anything else is INTERNAL."""
STREAM_IN_FLIGHT = 1024
"""Messages of one stream running at once (TEI's GRPC_MAX_PARALLEL_STREAM_REQUESTS default); past it, reading the
stream waits, which holds the client back through gRPC's flow control."""
GROUP_MESSAGES = 64
"""At most this many messages a group: a request the size of a client's batch, well inside the engine's queue."""
OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
SIDES = {0: "right", 1: "left"}
"""tei.v1.TruncationDirection -> the engine's truncation side."""

Metadata = proto.message("Metadata")
Message = Any
Handler = Callable[[Any, "str | None"], Awaitable[Message]]
"""A TEIService method: (request or request stream, the model named in the call's metadata) -> reply."""


class Failed(NamedTuple):
    """A call's end with a gRPC status other than OK."""

    code: grpc.StatusCode
    details: str


class TEIService:
    """The handlers: a group handler (X_group, in GROUPED) answers a group of messages of method X at once, for
    XStream and for X itself (a group of one); the other methods have one coroutine each. TEI serves one model, so its
    messages name none: the model that answers is the one served for the method's verb, or the one named by the
    call's `model` metadata (an encoderrt extension, where several are served)."""

    def __init__(self, models: ModelRegistry, settings: ServerSettings):
        self.models = models
        self.settings = settings

    def _served(self, verb: str, model: str | None) -> ServedModel:
        return self.models.resolve(model, verb)

    async def answer_group(self, grouped: "Grouped", requests: list[Message], model: str | None) -> list[Message]:
        """The replies of `grouped`'s group handler, by the model that answers its verb."""
        return await getattr(self, grouped.handler)(requests, self._served(grouped.verb, model))

    def backlogged(self, verb: str, model: str | None) -> bool:
        """Whether the engine that answers `verb` already has a deep batch's worth waiting (Engine.backlogged); False
        where none answers, so that the messages run and get that error."""
        try:
            return self._served(verb, model).engine.backlogged()
        except (APIError, EngineError):  # what resolving the model raises: not ready, unknown, cannot answer
            return False

    def _check_items(self, count: int, field: str) -> None:
        common.check_item_count(count, field, self.settings.max_client_batch_size)

    async def Info(self, request: Message, model: str | None) -> Message:
        described = tei.describe(self.models, self.settings)
        kind = next(iter(described["model_type"]))
        return proto.message("InfoResponse")(
            version=described["version"], model_id=described["model_id"], model_dtype=described["model_dtype"],
            model_type={"embedding": 0, "classifier": 1, "reranker": 2}[kind],
            max_concurrent_requests=described["max_concurrent_requests"],
            max_input_length=described["max_input_length"], max_batch_tokens=described["max_batch_tokens"],
            max_client_batch_size=described["max_client_batch_size"],
            tokenization_workers=described["tokenization_workers"])

    async def embed_group(self, requests: list[Message], served: ServedModel) -> list[Message]:
        """Embed requests that share their settings (`_embedding_settings`) as one engine request."""
        started = time.perf_counter()
        first = requests[0]
        texts = [request.inputs for request in requests]
        completion = await served.engine.arun(EmbedRequest(
            texts, first.normalize, None, first.truncate, prompt_name=_prompt_name(first),
            truncation_side=_side(first)))
        return [proto.message("EmbedResponse")(embeddings=vector.tolist(), metadata=metadata)
                for vector, metadata in zip(completion.value, _group_metadata(served, completion, texts, started))]

    async def embed_sparse_group(self, requests: list[Message], served: ServedModel) -> list[Message]:
        started = time.perf_counter()
        first = requests[0]
        texts = [request.inputs for request in requests]
        completion = await served.engine.arun(SparseEmbedRequest(
            texts, None, first.truncate, prompt_name=_prompt_name(first),
            truncation_side=_side(first)))
        return [proto.message("EmbedSparseResponse")(sparse_embeddings=common.sparse_values(row), metadata=metadata)
                for row, metadata in zip(completion.value, _group_metadata(served, completion, texts, started))]

    async def embed_all_group(self, requests: list[Message], served: ServedModel) -> list[Message]:
        started = time.perf_counter()
        first = requests[0]
        texts = [request.inputs for request in requests]
        completion = await served.engine.arun(tei.embed_all_request(
            served, texts, first.truncate, _prompt_name(first), _side(first)))
        return [proto.message("EmbedAllResponse")(token_embeddings=[{"embeddings": row.tolist()} for row in states],
                                                  metadata=metadata)
                for states, metadata in zip(completion.value, _group_metadata(served, completion, texts, started))]

    async def predict_group(self, requests: list[Message], served: ServedModel) -> list[Message]:
        return await self._predict([(request.inputs,) for request in requests], requests[0], served)

    async def predict_pair_group(self, requests: list[Message], served: ServedModel) -> list[Message]:
        for request in requests:
            if len(request.inputs) != 2:
                raise InvalidRequest(f"inputs must be a [text, text_pair] pair, got {len(request.inputs)} texts")
        return await self._predict([tuple(request.inputs) for request in requests], requests[0], served)

    async def _predict(self, sequences: list[tuple[str, ...]], first: Message, served: ServedModel) -> list[Message]:
        started = time.perf_counter()
        if first.truncation_direction != 0:
            raise InvalidRequest("predict cuts inputs at their end: truncation_direction must be Right")
        completion = await served.engine.arun(tei.predict_request(sequences, first.truncate, first.raw_scores))
        return [proto.message("PredictResponse")(
                    predictions=[{"score": score, "label": label} for score, label in ranked], metadata=metadata)
                for ranked, metadata in zip(tei.ranked_labels(served, completion, first.raw_scores),
                                            _group_metadata(served, completion, sequences, started))]

    async def Rerank(self, request: Message, model: str | None) -> Message:
        started = time.perf_counter()
        served = self._served("rerank", model)
        self._check_items(len(request.texts), "texts")
        if request.truncation_direction != 0:
            raise InvalidRequest("rerank cuts texts at their end: truncation_direction must be Right")
        completion = await served.engine.arun(RerankRequest(request.query, list(request.texts), None,
                                                            request.truncate, activation=not request.raw_scores))
        return _ranks(completion, list(request.texts), request.return_text,
                      len(request.query) + sum(map(len, request.texts)), started)

    async def RerankStream(self, requests: AsyncIterator[Message], model: str | None) -> Message:
        """(query, text) pairs, each scored; ranked over the whole stream. The first message's raw_scores,
        return_text, truncate and truncation_direction hold for all (TEI's rule)."""
        started = time.perf_counter()
        served = self._served("rerank", model)
        first = None
        queries: list[str] = []
        texts: list[str] = []
        async for message in requests:
            first = first or message
            queries.append(message.query)
            texts.append(message.text)
            self._check_items(len(texts), "the stream's texts")
        if first is None:
            raise InvalidRequest("the stream sent no texts")
        if first.truncation_direction != 0:
            raise InvalidRequest("rerank cuts texts at their end: truncation_direction must be Right")
        activation = not first.raw_scores
        if len(set(queries)) == 1:
            completion = await served.engine.arun(RerankRequest(queries[0], texts, None, first.truncate,
                                                                activation=activation))
        else:  # a query per text: each pair scored, then ranked as Rerank ranks
            scored = await served.engine.arun(ScoreRequest(queries, texts, first.truncate, activation=activation))
            completion = Completion(rank(scored.value), scored.prompt_tokens, scored.timings, scored.row_tokens)
        return _ranks(completion, texts, first.return_text, sum(map(len, queries)) + sum(map(len, texts)), started)


def _prompt_name(request: Message) -> str | None:
    return request.prompt_name if request.HasField("prompt_name") else None


def _side(request: Message) -> str:
    """The engine's truncation side for a message's truncation_direction. proto3 keeps an enum value tei.proto does
    not define as its number: the caller's error, named, not a lookup that fails inside the server."""
    side = SIDES.get(request.truncation_direction)
    if side is None:
        raise InvalidRequest(f"truncation_direction {request.truncation_direction} is not one of tei.proto's: "
                             "TRUNCATION_DIRECTION_RIGHT (0) or TRUNCATION_DIRECTION_LEFT (1)")
    return side


def _text_settings(request: Message) -> tuple[Any, ...]:
    """What the messages of a stream of texts (EmbedSparseStream, EmbedAllStream) must share to run as one engine
    request."""
    return request.truncate, request.truncation_direction, _prompt_name(request)


def _embedding_settings(request: Message) -> tuple[Any, ...]:
    return request.normalize, *_text_settings(request)


def _predict_settings(request: Message) -> tuple[Any, ...]:
    return request.truncate, request.truncation_direction, request.raw_scores


class Grouped(NamedTuple):
    """A method whose messages run in groups: X answers one, XStream a stream of them (`_stream`)."""

    handler: str
    """The TEIService group handler, which gets the messages of a group and the model that answers them."""
    key: Callable[[Message], Hashable]
    """What the messages of one group share."""
    verb: str
    """Whose engine answers them (ModelRegistry.resolve)."""


GROUPED = {"Embed": Grouped("embed_group", _embedding_settings, "embed"),
           "EmbedSparse": Grouped("embed_sparse_group", _text_settings, "embed_sparse"),
           "EmbedAll": Grouped("embed_all_group", _text_settings, "embed_all"),
           "Predict": Grouped("predict_group", _predict_settings, "classify"),
           "PredictPair": Grouped("predict_pair_group", _predict_settings, "classify")}
STREAM = "Stream"
"""XStream is the stream of X's messages."""


def _group_metadata(served: ServedModel, completion: Completion, inputs: Sequence[str | tuple[str, ...]],
                    started: float) -> list[Message]:
    """Each message's metadata, where a group of them ran as one request: its own characters and tokens (the
    engine's row for it; where long texts ran as several chunks, the tokenizer's count, or a lone message's all)."""
    rows = completion.row_tokens if len(completion.row_tokens) == len(inputs) else None
    metadata = []
    for i, sequence in enumerate(inputs):
        parts = (sequence,) if isinstance(sequence, str) else sequence
        if rows:
            tokens = rows[i]
        elif len(inputs) == 1:
            tokens = completion.prompt_tokens
        elif len(parts) == 2:
            tokens = served.engine.count_tokens(pairs=[(parts[0], parts[1])])
        else:
            tokens = served.engine.count_tokens(list(parts))
        metadata.append(_metadata(completion, sum(map(len, parts)), started, tokens))
    return metadata


def _metadata(completion: Completion, chars: int, started: float, tokens: int | None = None) -> Message:
    """`tokens`: the message's own, where it ran in a group (default: the completion's)."""
    timings = completion.timings
    return Metadata(compute_chars=chars, compute_tokens=completion.prompt_tokens if tokens is None else tokens,
                    total_time_ns=int((time.perf_counter() - started) * 1e9),
                    tokenization_time_ns=int(timings.tokenize * 1e9), queue_time_ns=int(timings.queue * 1e9),
                    inference_time_ns=int(timings.inference * 1e9))


def _ranks(completion: Completion, texts: list[str], return_text: bool, chars: int, started: float) -> Message:
    ranks = [{"index": index, "score": score, **({"text": texts[index]} if return_text else {})}
             for index, score in completion.value]
    return proto.message("RerankResponse")(ranks=ranks, metadata=_metadata(completion, chars, started))


# -- from handlers to gRPC's method handlers ---------------------------------------------------------------------


def _model(context: grpc.aio.ServicerContext) -> str | None:
    return next((value for key, value in context.invocation_metadata() or () if key == "model"), None)


def _failure(error: BaseException) -> Failed:
    if isinstance(error, (APIError, EngineError)):
        return Failed(CODES.get(status_of(error), grpc.StatusCode.INTERNAL), str(error))
    log.error("unexpected error in a gRPC call", exc_info=error)
    return Failed(grpc.StatusCode.INTERNAL, INTERNAL_ERROR)


async def _one(answer_group: Callable[[Grouped, list[Message], str | None], Awaitable[list[Message]]],
               grouped: Grouped, request: Message, model: str | None) -> Message:
    """A method in GROUPED called alone: a group of one."""
    return (await answer_group(grouped, [request], model))[0]


async def _stream(run: Callable[[list[Message]], Awaitable[list[Message]]], requests: AsyncIterator[Message],
                  key: Callable[[Message], Hashable], backlogged: Callable[[], bool]) -> AsyncIterator[Message]:
    """Replies to a stream's messages, in the order of the messages.

    A message goes to the engine as it arrives (a call of `run`), as a request from its own client would, unless the
    engine is `backlogged` and the stream already has a call running: then the messages that arrive wait (up to
    STREAM_IN_FLIGHT), and when a call of the stream ends, the consecutive ones of one `key` run as one call (one
    engine request: one tokenising call, one submission, one reply to wait for, rather than one per message). They
    would wait for a batch in the engine anyway; held back while it is not backlogged, they starved its batches: at
    most four calls in flight served a stream of single queries, 32 in flight, at 3,455 against 3,950 tokens/s
    (batches of 7 rows; medians of 4 alternating rounds, 2-core AVX2 EPYC). A group that fails runs again message by
    message, so each gets its own reply or error. A call refused for a full queue while others of the stream are in
    the engine waits for them (`_StreamAdmission`) rather than failing the stream.
    """
    loop = asyncio.get_running_loop()
    replies: asyncio.Queue[asyncio.Future[Message] | BaseException | None] = asyncio.Queue()
    slots = asyncio.Semaphore(STREAM_IN_FLIGHT)
    waiting: deque[tuple[Message, Hashable, asyncio.Future[Message]]] = deque()
    running: set[asyncio.Task[None]] = set()
    admission = _StreamAdmission()

    unreadable_backlog_logged = False

    def engine_backlogged() -> bool:
        """An engine whose backlog cannot be read counts as not backlogged: the messages run and get its error. This is
        asked in a call's done callback too, where an exception would only be logged and the waiting never start.
        Logged once a stream: it is asked for each message."""
        nonlocal unreadable_backlog_logged
        try:
            return backlogged()
        except Exception:  # noqa: BLE001 - see above; the error itself comes back in the replies
            if not unreadable_backlog_logged:
                unreadable_backlog_logged = True
                log.warning("a gRPC stream could not tell whether its engine is backlogged; its messages run as "
                            "they come", exc_info=True)
            return False

    def start(handed_on: int = 0) -> None:
        """`handed_on`: calls that start whatever the engine holds (an ended call's place)."""
        while waiting and (handed_on > 0 or not running or not engine_backlogged()):
            handed_on -= 1
            message, shared, reply = waiting.popleft()
            group = [(message, reply)]
            while waiting and len(group) < GROUP_MESSAGES and waiting[0][1] == shared:
                message, _, reply = waiting.popleft()
                group.append((message, reply))
            task = asyncio.ensure_future(_answer(functools.partial(admission.run, run), group))
            running.add(task)
            task.add_done_callback(finished)

    def finished(task: asyncio.Task[None]) -> None:
        running.discard(task)
        start(handed_on=1)

    async def read() -> None:
        try:
            async for message in requests:
                await slots.acquire()
                reply = loop.create_future()
                replies.put_nowait(reply)
                try:
                    shared = key(message)
                except Exception as error:  # noqa: BLE001 - a message that cannot be grouped fails, as a bad one
                    reply.set_exception(error)
                    continue
                waiting.append((message, shared, reply))
                start()
        except Exception as error:  # noqa: BLE001 - the client's stream broke: the replies end with its error
            replies.put_nowait(error)
        finally:
            replies.put_nowait(None)

    reader = asyncio.ensure_future(read())
    try:
        while (reply := await replies.get()) is not None:
            if isinstance(reply, BaseException):
                raise reply
            value = await reply
            slots.release()
            yield value
    finally:
        reader.cancel()
        for task in list(running):  # the stream ended early: the engine drops what its requests still wait for
            task.cancel()
        while not replies.empty():
            left = replies.get_nowait()
            if isinstance(left, asyncio.Future) and left.done() and not left.cancelled():
                left.exception()  # seen: an error after the one that ended the stream is not logged as lost
            elif isinstance(left, asyncio.Future):
                left.cancel()


class _StreamAdmission:
    """A stream's calls against the engine's admission. A stream reads ahead (STREAM_IN_FLIGHT) and runs what it read
    as it can, so its own calls can fill the engine's queue past --max-queue-seconds: a client pushing a corpus of
    passages through EmbedStream was failed with RESOURCE_EXHAUSTED after 40 of 200 messages, by its own work. A call
    refused as Overloaded while other calls of the stream are in the engine waits until one of them leaves it and
    runs again, the longest-waiting first, one a departure: the stream is held back, and gRPC's flow control holds
    its client back. Refused with none of its stream's in the engine, the refusal stands: the queue is other
    clients' work, and the stream's error says when to retry, as HTTP's 503 does."""

    def __init__(self) -> None:
        self._in_engine = 0
        self._waiting: deque[asyncio.Future[None]] = deque()

    async def run(self, run: Callable[[list[Message]], Awaitable[list[Message]]],
                  messages: list[Message]) -> list[Message]:
        while True:
            self._in_engine += 1
            refused = False
            try:
                return await run(messages)
            except Overloaded:
                refused = True
                if self._in_engine == 1:  # none of the stream's calls is in the engine but this one
                    raise
            finally:
                self._in_engine -= 1
                if not refused or not self._in_engine:  # a departure (or none left to wait for): the next one's turn
                    self._wake_one()
            turn = asyncio.get_running_loop().create_future()
            self._waiting.append(turn)
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():  # woken, then cancelled: the turn goes to the next
                    self._wake_one()
                raise

    def _wake_one(self) -> None:
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return


async def _answer(run: Callable[[list[Message]], Awaitable[list[Message]]],
                  group: list[tuple[Message, asyncio.Future[Message]]]) -> None:
    messages = [message for message, _ in group]
    results: list[Message | BaseException]
    try:
        results = list(await run(messages))
    except Exception as error:  # noqa: BLE001 - the error goes to the message's reply; a group's, to each message
        if len(messages) == 1:
            results = [error]
        else:  # which message failed, and how, is each one's own
            alone = await asyncio.gather(*(run([message]) for message in messages), return_exceptions=True)
            results = [outcome if isinstance(outcome, BaseException) else outcome[0] for outcome in alone]
    for (_, reply), result in zip(group, results):
        if reply.done():
            continue
        if isinstance(result, BaseException):
            reply.set_exception(result)
        else:
            reply.set_result(result)


class _Calls:
    """Wraps handlers into grpc's method handlers: errors become statuses, every call is counted in the metrics."""

    def __init__(self, metrics: Metrics | None):
        self.metrics = metrics

    def _observe(self, method: str, code: grpc.StatusCode, started: float) -> None:
        if self.metrics is not None:
            self.metrics.observe_grpc(method, code.name, time.perf_counter() - started)

    def unary(self, method: str, handler: Handler) -> Callable[..., Awaitable[Message]]:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Message:
            started = time.perf_counter()
            try:
                reply = await handler(request, _model(context))
            except asyncio.CancelledError:
                self._observe(method, grpc.StatusCode.CANCELLED, started)
                raise
            except Exception as error:  # noqa: BLE001 - every failure becomes a status; _failure logs our bugs
                failed = _failure(error)
                self._observe(method, failed.code, started)
                await context.abort(failed.code, failed.details)
            self._observe(method, grpc.StatusCode.OK, started)
            return reply

        return call

    def streaming(self, method: str, group_handler: Handler, key: Callable[[Message], Hashable],
                  backlogged: Callable[[str | None], bool]) -> Callable[..., Any]:
        """`group_handler` answers a group of messages of one `key` (`_stream`) while `backlogged(model)` says whether
        the model's engine is (TEIService.backlogged)."""

        async def call(requests: AsyncIterator[Message], context: grpc.aio.ServicerContext) -> AsyncIterator[Message]:
            started = time.perf_counter()
            model = _model(context)
            try:
                async for reply in _stream(lambda messages: group_handler(messages, model), requests, key,
                                           lambda: backlogged(model)):
                    yield reply
            except asyncio.CancelledError:
                self._observe(method, grpc.StatusCode.CANCELLED, started)
                raise
            except Exception as error:  # noqa: BLE001 - as unary's
                failed = _failure(error)
                self._observe(method, failed.code, started)
                await context.abort(failed.code, failed.details)
            self._observe(method, grpc.StatusCode.OK, started)

        return call


def method_handlers(service: TEIService, metrics: Metrics | None) -> list[grpc.GenericRpcHandler]:
    """grpc's handlers for every method tei.proto declares that TEIService answers: a unary method by its handler,
    a method in GROUPED and its stream by its group handler, RerankStream by its own."""
    calls = _Calls(metrics)
    generic = []
    for name, descriptor in proto.file.services_by_name.items():
        handlers = {}
        for method in descriptor.methods:
            request_type = proto.message(method.input_type.name)
            reply_type = proto.message(method.output_type.name)
            path = f"/{descriptor.full_name}/{method.name}"
            io = {"request_deserializer": request_type.FromString, "response_serializer": reply_type.SerializeToString}
            if method.client_streaming and method.server_streaming:
                grouped = GROUPED.get(method.name.removesuffix(STREAM)) if method.name.endswith(STREAM) else None
                if grouped is not None:
                    handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                        calls.streaming(path, functools.partial(service.answer_group, grouped), grouped.key,
                                        functools.partial(service.backlogged, grouped.verb)), **io)
            elif method.name in GROUPED:
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                    calls.unary(path, functools.partial(_one, service.answer_group, GROUPED[method.name])), **io)
            elif method.client_streaming:
                gathered = getattr(service, method.name, None)
                if gathered is not None:
                    handlers[method.name] = grpc.stream_unary_rpc_method_handler(calls.unary(path, gathered), **io)
            elif hasattr(service, method.name):
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                    calls.unary(path, getattr(service, method.name)), **io)
        if handlers:
            generic.append(grpc.method_handlers_generic_handler(descriptor.full_name, handlers))
    return generic


class _ApiKey(grpc.aio.ServerInterceptor):
    """`authorization: Bearer KEY` metadata on every call but health and reflection, as the HTTP routes' header."""

    def __init__(self, api_key: str):
        self.api_key = api_key.encode()

    async def intercept_service(self, continuation: Callable[..., Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        if details.method.startswith(OPEN_SERVICES):
            return await continuation(details)
        values = [value for key, value in details.invocation_metadata or () if key == "authorization"]
        scheme, _, token = (values[0] if len(values) == 1 else "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key):
            return await continuation(details)
        message = ("missing or wrong API key: send 'authorization: Bearer <key>' metadata" if len(values) < 2
                   else f"{len(values)} authorization metadata entries: send one")

        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        handler = await continuation(details)
        if handler is None:
            return None
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(refuse) if not handler.response_streaming else \
                grpc.stream_stream_rpc_method_handler(refuse)
        return grpc.unary_unary_rpc_method_handler(refuse)


class _Health(health.aio.HealthServicer):
    """grpc.health.v1 as set at load (NOT_SERVING until every model is ready), and NOT_SERVING while a model stops
    serving (server/health.py), as HTTP's /health says it."""

    def __init__(self, serving: ServingHealth):
        super().__init__()
        self._serving = serving

    async def Check(self, request: Message, context: grpc.aio.ServicerContext) -> Message:
        reply = await super().Check(request, context)
        if reply.status == health_pb2.HealthCheckResponse.SERVING and self._serving.problems():
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.NOT_SERVING)
        return reply


class GrpcServer:
    """The gRPC server in a thread with its own loop: `start` returns once it listens (or raises why it cannot),
    `stop` ends the calls in flight within a grace period and returns once the thread has."""

    def __init__(self, models: ModelRegistry, settings: ServerSettings, metrics: Metrics | None = None):
        self.models = models
        self.settings = settings
        self.metrics = metrics
        self.port: int | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="encoderrt-grpc", daemon=True)
        self._listening: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._stopping: asyncio.Event | None = None
        self._grace = 0.0
        self._health = _Health(ServingHealth(models))

    def start(self) -> int:
        self._thread.start()
        self.port = self._listening.result()
        return self.port

    def stop(self, grace_s: float) -> None:
        if not self._thread.is_alive():
            return
        self._grace = grace_s
        self._loop.call_soon_threadsafe(self._stop_soon)
        self._thread.join()

    def mark_serving(self, serving: bool) -> None:
        """grpc.health.v1's status of the server ("") and of each TEI service; callable from any thread."""
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._set_health(serving), self._loop)

    def _stop_soon(self) -> None:
        assert self._stopping is not None
        self._stopping.set()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        if self.metrics is not None:
            self.metrics.watch_thread("grpc")
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as error:  # noqa: BLE001 - handed to start(), which raises it in the caller
            if not self._listening.done():
                self._listening.set_exception(error)
            else:
                log.error("the gRPC server stopped: %s", error)
        finally:
            self._loop.close()

    async def _set_health(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *(s.full_name for s in proto.file.services_by_name.values() if s.name != "Tokenize")):
            await self._health.set(name, status)

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        limit = self.settings.max_body_bytes
        server = grpc.aio.server(
            interceptors=[_ApiKey(self.settings.api_key)] if self.settings.api_key else None,
            options=[("grpc.max_receive_message_length", limit), ("grpc.so_reuseport", 0)],
            maximum_concurrent_rpcs=self.settings.connections.max_connections)
        server.add_generic_rpc_handlers(method_handlers(TEIService(self.models, self.settings), self.metrics))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        await self._set_health(self.models.ready)
        names = [s.full_name for s in proto.file.services_by_name.values() if s.name != "Tokenize"]
        reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server,
                                            pool=proto.pool)
        address = f"{self.settings.host}:{self.settings.grpc_port}"
        try:
            port = server.add_insecure_port(address)
        except RuntimeError as error:
            raise OSError(f"cannot listen for gRPC on {address} (--grpc-port): {error}") from None
        await server.start()
        self._listening.set_result(port)
        await self._stopping.wait()
        await self._set_health(False)
        await server.stop(self._grace)

