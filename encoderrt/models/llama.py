"""Llama (Llama-based embedders and causal-LM rerankers): a decoder (models/decoder.py)."""

from encoderrt.models.decoder import decoder

ARCHITECTURE = decoder("llama")
