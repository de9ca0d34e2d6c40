"""Mistral (e5-mistral-7b-instruct, SFR-Embedding-Mistral, Linq-Embed-Mistral): a decoder (models/decoder.py); a
`sliding_window` in its config keeps transformers' windowed causal mask in the graph."""

from encoderrt.models.decoder import decoder

ARCHITECTURE = decoder("mistral")
