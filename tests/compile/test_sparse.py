"""SPLADE-style sparse embeddings from a SparseEncoder folder: the same non-zero tokens and weights as
SparseEncoder.encode, on onnxruntime and OpenVINO, through the engine and TEI's /embed_sparse."""

import httpx
import numpy as np
import pytest

import tiny_models as tm
from encoderrt import Engine
from encoderrt.runtime.errors import InvalidRequest
from encoderrt.server import ServerSettings, create_app
from server_helpers import free_port, ready_registry, running_server

TEXTS = ["search query", "the quick brown fox jumps over a lazy dog", "привет мир", "x", " ".join(["rank score"] * 80)]


def _reference(folder, texts):
    from sentence_transformers import SparseEncoder

    return SparseEncoder(str(folder), device="cpu").encode(texts, convert_to_tensor=True).to_dense().numpy()


@pytest.fixture(scope="module", params=[("max", "relu"), ("sum", "relu"), ("max", "log1p_relu")],
                ids=["max", "sum", "max-log1p_relu"])
def folder(request, tiny_dir):
    strategy, activation = request.param  # log1p_relu: OpenSearch's models, log1p applied twice
    return tm.sparse_encoder_folder(tiny_dir / f"splade-{strategy}-{activation}", pooling_strategy=strategy,
                                    activation=activation)


@pytest.mark.parametrize("target", ["cpu", "openvino"])
def test_sparse_vectors_match_sparse_encoder(folder, target, compile_artifact, tmp_path):
    result = compile_artifact(folder, tmp_path / "artifact", target=target)
    manifest = result.manifest
    assert manifest.task == "sparse" and manifest.shape.output_dim == manifest.shape.vocab_size
    assert manifest.parity["reference"] == "sentence-transformers SparseEncoder.encode"
    reference = _reference(folder, TEXTS)
    with Engine.load(result.path) as engine:
        vectors = engine.embed_sparse(TEXTS)
        top = engine.embed_sparse(TEXTS, top_k=3)
    for row, expected, best in zip(vectors, reference, top):
        ids = np.array([i for i, _ in row])
        weights = np.array([w for _, w in row])
        assert set(ids.tolist()) == set(np.flatnonzero(expected > 0).tolist())
        # fp32 GEMMs sum in another order on AVX2 than on AVX-512, and log1p(relu(x)) near zero turns that ~2e-6 into
        # a large relative difference on the smallest weights: those are held to 1e-5 of the row's largest instead
        np.testing.assert_allclose(weights, expected[ids], rtol=1e-4, atol=1e-5 * expected.max())
        assert list(weights) == sorted(weights, reverse=True)  # heaviest first
        assert best == row[:3]


def _embed_sparse_stream(target: str, texts: list[str], **fields) -> list:
    import grpc

    from encoderrt import proto

    request, reply = proto.message("EmbedSparseRequest"), proto.message("EmbedSparseResponse")
    with grpc.insecure_channel(target) as channel:
        stream = channel.stream_stream("/tei.v1.Embed/EmbedSparseStream", request_serializer=request.SerializeToString,
                                       response_deserializer=reply.FromString)
        return list(stream(iter(request(inputs=text, truncate=True, **fields) for text in texts), timeout=60))


def test_sparse_routes_and_refusals(folder, compile_artifact, tmp_path):
    result = compile_artifact(folder, tmp_path / "artifact")
    with Engine.load(result.path) as engine:
        with pytest.raises(InvalidRequest, match="embed is not available for this sparse model.*use embed_sparse"):
            engine.embed(TEXTS)
        with pytest.raises(InvalidRequest, match="top_k must be a positive integer"):
            engine.embed_sparse(TEXTS, top_k=0)
        expected, every = engine.embed_sparse(TEXTS[:2]), engine.embed_sparse(TEXTS)
        settings = ServerSettings(grpc_port=free_port())
        with running_server(create_app(settings, ready_registry(splade=engine)), settings) as url, \
                httpx.Client(base_url=url, timeout=60) as http:  # the server closes the engine when it stops
            sparse = http.post("/embed_sparse", json={"inputs": TEXTS[:2]})
            openai = http.post("/v1/embeddings", json={"input": "x", "model": "splade"})
            info = http.get("/info").json()
            streamed = _embed_sparse_stream(f"127.0.0.1:{settings.grpc_port}", TEXTS * 3)
    assert info["model_type"] == {"embedding": {"pooling": "splade"}}  # as TEI describes a SPLADE model
    assert sparse.status_code == 200
    assert [[(item["index"], item["value"]) for item in row] for row in sparse.json()] == expected
    assert len(streamed) == len(TEXTS) * 3  # TEI's EmbedSparseStream: each message's weights, in order
    for reply, row in zip(streamed, every * 3):  # batched with other rows than in `every`: equal to float error
        weights = {item.index: item.value for item in reply.sparse_embeddings}
        assert sorted(weights) == sorted(index for index, _ in row)
        np.testing.assert_allclose([weights[index] for index, _ in row], [value for _, value in row], rtol=1e-5)
    assert openai.status_code == 400
    assert "sparse model and cannot answer embed (it answers score, rerank, embed_sparse" in openai.text


@pytest.mark.parametrize(("default_route", "target"), [("document", "cpu"), ("query", "openvino")])
def test_an_inference_free_model_embeds_queries_from_weights_and_documents_through_the_model(
        default_route, target, tiny_dir, compile_artifact, tmp_path):
    """OpenSearch's doc-v3 kind (a Router): encode_document's vectors from the graph, encode_query's from the
    artifact's token weights (no special tokens, each token once, cut at the query tokenizer's limit) with no row
    run; a request names its side or takes the Router's default; TEI's /embed_sparse takes `side`."""
    from sentence_transformers import SparseEncoder

    from encoderrt.runtime.tasks import SparseEmbedRequest

    folder = tm.inference_free_sparse_folder(tiny_dir / f"inference-free-{default_route}", default_route=default_route)
    result = compile_artifact(folder, tmp_path / "artifact", target=target)
    static = result.manifest.static_queries
    assert result.manifest.task == "sparse" and (static.max_length, static.default_side) == (24, default_route)
    model = SparseEncoder(str(folder), device="cpu")
    long_query = " ".join(tm.CORPUS_WORDS)  # distinct words past the query side's 24 tokens
    texts = [*TEXTS, "fox fox fox the the", long_query, ""]
    queries = model.encode_query(texts, convert_to_tensor=True).to_dense().numpy()
    documents = model.encode_document(texts, convert_to_tensor=True).to_dense().numpy()
    query_tokenizer = model[0].sub_modules["query"][0].tokenizer
    read = [query_tokenizer(text, add_special_tokens=False, truncation=True)["input_ids"] for text in texts]
    whole = query_tokenizer(long_query, add_special_tokens=False)["input_ids"]
    assert len(read[-2]) == 24 < len(whole) and len(set(read[-2])) < len(set(whole))  # the cut changes the query
    with Engine.load(result.path) as engine:
        asked = {side: engine.embed_sparse(texts, side=side) for side in ("query", "document")}
        unasked = engine.embed_sparse(texts)
        queried = engine.run(SparseEmbedRequest(texts, side="query"))
        with pytest.raises(InvalidRequest, match="above the query side's limit of 24 tokens"):
            engine.embed_sparse(texts, side="query", truncate=False)
        with pytest.raises(InvalidRequest, match="side must be 'query' or 'document'"):
            engine.embed_sparse(texts, side="passage")
        settings = ServerSettings()
        with running_server(create_app(settings, ready_registry(sparse=engine)), settings) as url, \
                httpx.Client(base_url=url, timeout=60) as http:
            served = http.post("/embed_sparse", json={"inputs": texts[:3], "side": "query"}).json()
    _assert_sparse(asked["query"], queries, rtol=1e-6)
    _assert_sparse(asked["document"], documents, rtol=1e-4)
    assert unasked == asked[default_route] and asked["query"][-1] == []
    assert queried.row_tokens == tuple(map(len, read)) and queried.prompt_tokens == sum(map(len, read))
    assert [[(item["index"], item["value"]) for item in row] for row in served] == asked["query"][:3]


def _assert_sparse(rows, expected: np.ndarray, rtol: float) -> None:
    """The same non-zero tokens as sentence-transformers' dense rows, their weights close, heaviest first."""
    assert len(rows) == len(expected)
    for row, reference in zip(rows, expected):
        ids, weights = [i for i, _ in row], [w for _, w in row]
        assert sorted(ids) == np.flatnonzero(reference > 0).tolist()
        np.testing.assert_allclose(weights, reference[ids], rtol=rtol, atol=1e-5 * max(reference.max(), 1.0))
        assert weights == sorted(weights, reverse=True)


def test_routers_other_than_the_inference_free_layout_are_refused_by_name(tiny_dir, compile_artifact, tmp_path):
    """A Router whose routes are not query: SparseStaticEmbedding and document: MLM -> SpladePooling (an asymmetric
    dense model, say), or whose query tokenizer is not the documents': refused, with nothing written."""
    import json
    import shutil

    from encoderrt.compile import InputError

    source = tm.inference_free_sparse_folder(tiny_dir / "inference-free-document")
    folder = shutil.copytree(source, tmp_path / "documents-unpooled")
    config = json.loads((folder / "router_config.json").read_text())
    config["structure"]["document"] = config["structure"]["document"][:1]
    (folder / "router_config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="routes query: SparseStaticEmbedding; document: MLMTransformer; encoderrt"):
        compile_artifact(folder, tmp_path / "artifact")
    folder = shutil.copytree(source, tmp_path / "other-vocabulary")
    tokenizer_path = folder / "query_0_SparseStaticEmbedding" / "tokenizer.json"
    tokenizer = json.loads(tokenizer_path.read_text())
    tokenizer["model"]["vocab"]["fox"] += 1000
    tokenizer_path.write_text(json.dumps(tokenizer))
    with pytest.raises(InputError, match="query tokenizer .* is not the documents'"):
        compile_artifact(folder, tmp_path / "artifact")
    assert not (tmp_path / "artifact").exists()


def _dense(vectors) -> np.ndarray:
    return vectors.to_dense().numpy()


def test_prompts_sides_and_max_active_dims_as_sparse_encoder_applies_them(tiny_dir, compile_artifact, tmp_path):
    """A SparseEncoder folder's prompts and max_active_dims, as encode, encode_query and encode_document apply them:
    a side's own prompt, else the default one; a request's prompt_name or prompt over both; the folder's
    max_active_dims unless top_k asks for more. TEI's /embed_sparse and gRPC EmbedSparse take prompt_name and
    truncation_direction as TEI does."""
    from sentence_transformers import SparseEncoder

    prompts = {"query": "search query: ", "passage": "a passage about ", "topic": "the topic is "}
    folder = tm.sparse_encoder_folder(tiny_dir / "splade-prompted", prompts=prompts, default_prompt_name="topic",
                                      max_active_dims=7)
    model = SparseEncoder(str(folder), device="cpu")
    assert (model.max_active_dims, model.default_prompt_name) == (7, "topic")
    long_text = " ".join(tm.CORPUS_WORDS)  # past the 48-token limit, its start and end different words
    texts = [*TEXTS, long_text]
    expected = {"encode": _dense(model.encode(texts)), "query": _dense(model.encode_query(texts)),
                "document": _dense(model.encode_document(texts)), "plain": _dense(model.encode(texts, prompt="")),
                "named": _dense(model.encode_query(texts, prompt_name="topic")),
                "wide": _dense(model.encode(texts, max_active_dims=30))}
    model[0].tokenizer.truncation_side = "left"
    left = _dense(model.encode_query(texts))
    assert not np.array_equal(left[-1] > 0, expected["query"][-1] > 0)  # the end kept is not the start
    assert max(np.count_nonzero(row) for row in expected["encode"]) == 7 < np.count_nonzero(expected["wide"][-1])
    for name in ("query", "document", "plain"):  # each prompt changes the weights
        assert not np.array_equal(expected[name] > 0, expected["encode"] > 0), name
    result = compile_artifact(folder, tmp_path / "artifact")
    assert result.manifest.max_active_dims == 7 and result.manifest.prompts == model.prompts
    with Engine.load(result.path) as engine:
        got = {"encode": engine.embed_sparse(texts), "query": engine.embed_sparse(texts, side="query"),
               "document": engine.embed_sparse(texts, side="document"), "plain": engine.embed_sparse(texts, prompt=""),
               "named": engine.embed_sparse(texts, side="query", prompt_name="topic"),
               "wide": engine.embed_sparse(texts, top_k=30)}
        with pytest.raises(InvalidRequest, match="unknown prompt_name 'title'; this model's prompts are: document, pa"):
            engine.embed_sparse(texts, prompt_name="title")
        settings = ServerSettings(grpc_port=free_port())
        with running_server(create_app(settings, ready_registry(splade=engine)), settings) as url, \
                httpx.Client(base_url=url, timeout=60) as http:
            served = http.post("/embed_sparse", json={"inputs": texts, "prompt_name": "query",
                                                      "truncation_direction": "Left"})
            streamed = _embed_sparse_stream(f"127.0.0.1:{settings.grpc_port}", texts, prompt_name="query",
                                            truncation_direction=1)
    for name, rows in got.items():
        _assert_sparse(rows, expected[name], rtol=1e-4)
    assert served.status_code == 200, served.text
    _assert_sparse([[(item["index"], item["value"]) for item in row] for row in served.json()], left, rtol=1e-4)
    _assert_sparse([[(item.index, item.value) for item in reply.sparse_embeddings] for reply in streamed], left,
                   rtol=1e-4)


def test_an_inference_free_models_prompts_reach_its_query_weights(tiny_dir, compile_artifact, tmp_path):
    """encode_query puts the query prompt in front of the text the token weights read; encode_document the document
    prompt in front of the text the model runs; encode, the default prompt, on the Router's default route."""
    from sentence_transformers import SparseEncoder

    folder = tm.inference_free_sparse_folder(tiny_dir / "inference-free-prompted", prompts={
        "query": "nations search ", "document": "über das "}, default_prompt_name="query", max_active_dims=5)
    result = compile_artifact(folder, tmp_path / "artifact", target="openvino")
    model = SparseEncoder(str(folder), device="cpu")
    texts = TEXTS[:4]
    with Engine.load(result.path) as engine:
        for side, encode in (("query", model.encode_query), ("document", model.encode_document), (None, model.encode)):
            expected = _dense(encode(texts))
            assert not np.array_equal(expected > 0, _dense(encode(texts, prompt="")) > 0), side
            _assert_sparse(engine.embed_sparse(texts, side=side), expected, rtol=1e-4)


@pytest.mark.parametrize(("kind", "target"), [("splade", "cpu"), ("inference-free-cosine", "openvino")])
def test_a_sparse_model_scores_and_reranks_as_sparse_encoder_similarity_does(kind, target, tiny_dir, compile_artifact,
                                                                             tmp_path):
    """score and rerank of a sparse model: SparseEncoder.similarity of encode_query's vectors against
    encode_document's (the side prompts, max_active_dims, an inference-free model's query weights; dot, or the
    folder's similarity), on the engine and TEI's /rerank."""
    from sentence_transformers import SparseEncoder

    from encoderrt.runtime.tasks import ScoreRequest

    if kind == "splade":
        folder = tm.sparse_encoder_folder(tiny_dir / "splade-prompted-scores", prompts={"query": "search query: "},
                                          max_active_dims=12)
    else:
        folder = tm.inference_free_sparse_folder(tiny_dir / "inference-free-cosine", similarity_fn_name="cosine")
    model = SparseEncoder(str(folder), device="cpu")
    query, documents = "the quick brown fox", [*TEXTS[1:], "fox and dog", "a lazy dog"]
    expected = model.similarity(model.encode_query([query]), model.encode_document(documents)).to_dense().numpy()[0]
    pairwise = model.similarity_pairwise(model.encode_query(TEXTS[:3]), model.encode_document(documents[:3]))
    assert np.unique(np.round(expected, 4)).size == len(documents)  # the order below means something
    result = compile_artifact(folder, tmp_path / "artifact", target=target)
    assert result.manifest.similarity == ("dot" if kind == "splade" else "cosine")
    with Engine.load(result.path) as engine:
        scores = engine.score(query, documents)
        paired = engine.score(TEXTS[:3], documents[:3])
        ranked = engine.rerank(query, documents, top_n=3)
        usage = engine.run(ScoreRequest(query, documents)).prompt_tokens
        settings = ServerSettings()
        with running_server(create_app(settings, ready_registry(sparse=engine)), settings) as url, \
                httpx.Client(base_url=url, timeout=60) as http:
            served = http.post("/rerank", json={"query": query, "texts": documents}).json()
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(paired, pairwise.to_dense().numpy() if pairwise.is_sparse else pairwise.numpy(),
                               rtol=1e-4, atol=1e-5)
    assert [index for index, _ in ranked] == np.argsort(-expected)[:3].tolist()
    assert [item["index"] for item in served] == np.argsort(-expected).tolist()
    assert usage > len(documents)  # the query's tokens and the documents' are counted
