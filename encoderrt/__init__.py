"""encoderrt: a compiled serving stack for encoder models (embeddings and cross-encoders)."""

__version__ = "0.1.0"
