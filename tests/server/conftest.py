import httpx
import pytest

from encoderrt.server import ServerSettings, create_app
from server_helpers import retrieval_models, running_server


@pytest.fixture(scope="session")
def served(minilm_fp32, tiny_artifacts):
    """One server with the retrieval stack's models."""
    registry = retrieval_models(minilm_fp32, tiny_artifacts)
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
