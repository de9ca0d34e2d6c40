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


def _embed_sparse_stream(target: str, texts: list[str]) -> list:
    import grpc

    from encoderrt import proto

    request, reply = proto.message("EmbedSparseRequest"), proto.message("EmbedSparseResponse")
    with grpc.insecure_channel(target) as channel:
        stream = channel.stream_stream("/tei.v1.Embed/EmbedSparseStream", request_serializer=request.SerializeToString,
                                       response_deserializer=reply.FromString)
        return list(stream(iter(request(inputs=text, truncate=True) for text in texts), timeout=60))


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
    assert openai.status_code == 400 and "sparse model and cannot answer embed (it answers embed_sparse" in openai.text
