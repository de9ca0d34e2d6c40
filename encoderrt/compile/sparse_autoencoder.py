"""CSR sparse models (Contrastive Sparse Representation, "Beyond Matryoshka"): a sentence-transformers
SparseEncoder whose modules are an embedding model's (Transformer, Pooling, any Dense, maybe Normalize) and, last, a
SparseAutoEncoder that maps the embedding to a wide latent and keeps its k largest values.

The graph ends in the autoencoder's encoder with its ReLU: relu(W (x - pre_bias) + latent_bias), the input first
standardised where the module says `normalize`. Keeping the k largest latents and then the positive ones, as the
module does, keeps the same weights as keeping the k heaviest positive ones, which is what the runtime does for every
sparse model (the request's top_k, else the manifest's max_active_dims: the module's k). A weight's index is a latent
dimension, not a token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from encoderrt.compile.errors import InputError

AUTOENCODER = "SparseAutoEncoder"


@dataclass(frozen=True)
class AutoEncoder:
    """A SparseAutoEncoder module in a folder, and what compile needs of it before loading it."""

    path: Path
    width: int
    """The latent width: the sparse vectors' dimension."""
    k: int
    """The latents it keeps a text: SparseEncoder's max_active_dims where the folder sets none."""
    normalize_input: bool = False
    """A Normalize module comes before it: the embedding it reads is of unit length."""


def read_autoencoder(path: Path, config: dict[str, Any], normalize_input: bool) -> AutoEncoder:
    """The module's settings from its config.json (`config`), checked; `normalize_input`: a Normalize precedes it."""
    width, k = config.get("hidden_dim", 512), config.get("k", 8)
    for name, value in (("hidden_dim", width), ("k", k), ("input_dim", config.get("input_dim"))):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"the {AUTOENCODER} module in {path} has {name} {value!r}, not a positive integer")
    if k > width:
        raise InputError(f"the {AUTOENCODER} module in {path} keeps k={k} of its hidden_dim={width} latents")
    return AutoEncoder(path, width, k, normalize_input)


class AutoEncoderHead(torch.nn.Module):
    """The embedding (normalised first where the folder has a Normalize) to the autoencoder's ReLU'd latents."""

    def __init__(self, autoencoder: AutoEncoder):
        super().__init__()
        from sentence_transformers.sparse_encoder.modules import SparseAutoEncoder

        try:
            self.module = SparseAutoEncoder.load(str(autoencoder.path), local_files_only=True).eval()
        except (OSError, ValueError, RuntimeError, KeyError) as exc:
            raise InputError(f"cannot load the {AUTOENCODER} module in {autoencoder.path}: {exc}") from None
        self.normalize_input = autoencoder.normalize_input

    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        x = features["sentence_embedding"]
        if self.normalize_input:
            x = torch.nn.functional.normalize(x, dim=-1)
        x, _ = self.module.prepare(x)
        return {"sentence_embedding": torch.relu(self.module.encode_pre_act(x))}
