import httpx
import pytest

from encoderrt import Engine
from encoderrt.server import ServerSettings, create_app
from server_helpers import ready_registry, running_server


@pytest.fixture(scope="session")
def served(minilm_fp32, tiny_artifacts):
    """One server with an embedding model, a cross-encoder and a classifier, as a retrieval stack runs them."""
    registry = ready_registry(
        minilm=Engine.load(minilm_fp32.path, max_batch_tokens=1024),
        reranker=Engine.load(tiny_artifacts["bert-cross-encoder"], max_batch_tokens=512),
        classifier=Engine.load(tiny_artifacts["bert-classifier"], max_batch_tokens=512),
    )
    with running_server(create_app(ServerSettings(max_client_batch_size=64), registry)) as url:
        yield url, registry


@pytest.fixture(scope="session")
def url(served):
    return served[0]


@pytest.fixture(scope="session")
def client(url):
    with httpx.Client(base_url=url, timeout=60) as http:
        yield http


@pytest.fixture(scope="session")
def engines(served):
    return {m.name: m.engine for m in served[1].models()}
