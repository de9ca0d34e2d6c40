"""UltraBERT (UltraBERT-150M and fine-tunes): EuroBERT's Llama-style layers (RMSNorm, rotary, SwiGLU, grouped-query
attention, no segment input) with windowed attention: windowed layers see `sliding_window` tokens on each side,
inclusive, and every third layer (by default; `layer_types` says) sees the whole text, each type with its own rotary
base; up to 32,768 positions.

transformers rotates q and k before its attention function and builds each layer type's mask (padding, and the window)
with traceable ops, so models/attention.py takes it over with no code here. The classification head is ModernBERT's
without its dense + GELU + LayerNorm block: the classifier over the first token's state or the tokens' mean
(`classifier_pooling`), so no GELU anywhere to count.

The family came with transformers 5.20; an older transformers refuses its folders by name (compile/source.py).
"""

from __future__ import annotations

from dataclasses import replace

from encoderrt.models import eurobert

ARCHITECTURE = replace(eurobert.ARCHITECTURE, name="ultrabert", model_types=("ultrabert",), head_gelus=0)
