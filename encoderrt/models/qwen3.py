"""Qwen3 (Qwen3-Embedding-0.6B/4B/8B, Qwen3-Reranker): a decoder (models/decoder.py) with RMSNorm on q and k,
32,768 positions."""

from encoderrt.models.decoder import decoder

ARCHITECTURE = decoder("qwen3")
