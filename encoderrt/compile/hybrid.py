"""Hybrid (bge-m3) folders: an embedding model whose folder also holds FlagEmbedding's two heads on the encoder's
last hidden states, `colbert_linear.pt` (a vector per token) and `sparse_linear.pt` (a lexical weight per token).

One graph computes all three from one pass (HybridEncoder): the pooled dense row as the folder's sentence-transformers
modules make it, every token's relu(sparse_linear(h)) and every token's colbert_linear(h). What bge-m3 does with them
afterwards is the runtime's, by the manifest's rules (runtime/tasks/hybrid.py): dense and colbert vectors normalised,
the first token's colbert vector dropped, lexical weights max-pooled per token id with the special tokens left out,
and the three scores weighted.
"""

from __future__ import annotations

from pathlib import Path

import torch

from encoderrt.compile.errors import InputError
from encoderrt.runtime.manifest import Hybrid, MultiVector

HEAD_FILES = ("colbert_linear.pt", "sparse_linear.pt")


def find_heads(weights_folder: Path) -> tuple[Path, Path] | None:
    """The folder's (colbert, sparse) head files, or None where it has neither; one without the other is an error."""
    paths = tuple(weights_folder / name for name in HEAD_FILES)
    present = [path.is_file() for path in paths]
    if not any(present):
        return None
    if not all(present):
        missing = [path.name for path, there in zip(paths, present) if not there]
        raise InputError(f"{weights_folder} has {' and '.join(p.name for p, t in zip(paths, present) if t)} but not "
                         f"{', '.join(missing)}: a bge-m3 folder has both heads")
    return paths[0], paths[1]


def load_head(path: Path, hidden_size: int, out_features: int | None = None) -> torch.nn.Linear:
    """A head saved as a torch Linear's state dict (weight [out, hidden], bias [out]), loaded without unpickling
    code (weights_only)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError) as exc:
        raise InputError(f"cannot read the head in {path}: {exc}") from None
    weight = state.get("weight") if isinstance(state, dict) else None
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != hidden_size:
        raise InputError(f"{path} is not a Linear head on the encoder's {hidden_size}-wide states (its weight is "
                         f"{tuple(weight.shape) if isinstance(weight, torch.Tensor) else 'missing'})")
    if out_features is not None and weight.shape[0] != out_features:
        raise InputError(f"{path} has {weight.shape[0]} outputs; it must have {out_features}")
    bias = state.get("bias")
    head = torch.nn.Linear(hidden_size, weight.shape[0], bias=bias is not None)
    head.weight.data = weight.float()
    if bias is not None:
        head.bias.data = bias.float()
    return head.eval()


def read_rules(weights_folder: Path) -> tuple[MultiVector, Hybrid]:
    """bge-m3's rules, with the special token ids of the folder's tokenizer."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(weights_folder, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot load the tokenizer from {weights_folder}: {exc}") from None
    special = (tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id)
    skip = tuple(sorted({int(token) for token in special if token is not None}))
    return (MultiVector(similarity="meanmaxsim", normalize=True, skip_first=True, skip_sides=("query", "document")),
            Hybrid(lexical_skip_ids=skip))


class HybridEncoder(torch.nn.Module):
    """The pooled dense row (the sentence-transformers modules' pooling and Dense layers), every token's hidden
    state, every token's lexical weight and every token's colbert vector, from one pass of the encoder."""

    def __init__(self, pooled: torch.nn.Module, colbert: torch.nn.Linear, sparse: torch.nn.Linear):
        super().__init__()
        self.pooled = pooled
        self.colbert = colbert
        self.sparse = sparse

    def forward(self, input_ids, attention_mask, token_type_ids=None, pooling_start=None):
        dense, hidden = self.pooled(input_ids, attention_mask, token_type_ids, pooling_start, with_token_embeddings=True)
        return dense, hidden, torch.relu(self.sparse(hidden)).squeeze(-1), self.colbert(hidden)
