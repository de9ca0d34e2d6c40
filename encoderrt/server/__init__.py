"""HTTP API over Engine: OpenAI embeddings, vLLM score/classify, Cohere/Jina rerank and TEI dialects."""

from encoderrt.server.app import create_app
from encoderrt.server.settings import ServerSettings

__all__ = ["ServerSettings", "create_app"]
