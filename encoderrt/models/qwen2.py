"""Qwen2 (gte-Qwen2 exported with transformers' classes, Qwen2-based embedders): a decoder (models/decoder.py) with
biases on q, k and v."""

from encoderrt.models.decoder import decoder

ARCHITECTURE = decoder("qwen2")
