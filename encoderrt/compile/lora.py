"""The task adapters (compile/adapters.py) as torch modules, for export: each adapted Linear or Embedding adds the
low-rank update of its row's task, selected by the graph's per-row `adapter` input."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from encoderrt.compile.adapters import ADAPTER_WEIGHTS, TaskAdapter
from encoderrt.compile.errors import InputError

_PREFIX = "base_model.model."
"""PEFT names a weight by the path of its module in the wrapped model under this prefix."""
_PAIRS = {"lora_A.weight": "lora_B.weight", "lora_embedding_A": "lora_embedding_B"}


def with_task_adapters(module: torch.nn.Module, model: torch.nn.Module, adapters: tuple[TaskAdapter, ...]) -> torch.nn.Module:
    """`module` taking an `adapter` input per row, every task's LoRA added to the layers of `model` (the
    transformers model inside it, whose module paths PEFT's weight names give)."""
    per_module: dict[str, list[tuple[int, torch.Tensor, torch.Tensor]]] = {}
    for index, adapter in enumerate(adapters, start=1):
        weights = load_file(adapter.folder / ADAPTER_WEIGHTS)
        for key in weights:
            path, down, up = _split(key, adapter.folder)
            if key.endswith(down):
                a, b = weights[key], weights.get(key[: -len(down)] + up)
                if b is None:
                    raise InputError(f"{adapter.folder / ADAPTER_WEIGHTS} has {key!r} without its {up}")
                per_module.setdefault(path, []).append((index, a.float(), b.float() * adapter.scaling))
    modules = dict(model.named_modules())
    selection = _Selection()
    for path, stacks in per_module.items():
        target = modules.get(path)
        if not isinstance(target, (torch.nn.Linear, torch.nn.Embedding)):
            described = "no module" if target is None else f"a {type(target).__name__}"
            raise InputError(f"the task adapters' weights name {path!r}, which is {described} of the model; encoderrt "
                             "adapts its Linear and Embedding layers")
        parent, _, name = path.rpartition(".")
        setattr(modules[parent] if parent else model, name, _Adapted(target, stacks, len(adapters), selection))
    return _WithAdapters(module, selection)


def _split(key: str, folder: Path) -> tuple[str, str, str]:
    """PEFT's weight name as the adapted module's path and the names of its down and up matrices."""
    for down, up in _PAIRS.items():
        for suffix in (down, up):
            if key.startswith(_PREFIX) and key.endswith("." + suffix):
                return key[len(_PREFIX): -len(suffix) - 1], down, up
    raise InputError(f"{folder / ADAPTER_WEIGHTS} holds {key!r}, which is not a LoRA matrix as PEFT names them")


class _Selection:
    """The rows' adapter indexes, set for the span of one forward call."""

    rows: torch.Tensor | None = None


class _Adapted(torch.nn.Module):
    """A Linear or Embedding plus the low-rank update of each row's task, x A_t B_t, scaled (none for index 0).

    A smaller rank than the largest is zero-padded: its extra columns add nothing."""

    def __init__(self, base: torch.nn.Module, stacks: list[tuple[int, torch.Tensor, torch.Tensor]], count: int,
                 selection: _Selection):
        super().__init__()
        self.base = base
        self.selection = selection
        self.embedding = isinstance(base, torch.nn.Embedding)
        rank = max(a.shape[0] for _, a, _ in stacks)
        width_in, width_out = ((base.num_embeddings, base.embedding_dim) if self.embedding
                               else (base.in_features, base.out_features))
        down = torch.zeros(count + 1, width_in, rank)
        up = torch.zeros(count + 1, rank, width_out)
        for index, a, b in stacks:  # PEFT's A is [r, in], B [out, r]
            down[index, :, : a.shape[0]] = a.T
            up[index, : a.shape[0]] = b.T
        # an embedding's tables flattened, so that row t's token i is entry t * vocab + i of one lookup
        self.down = torch.nn.Parameter(down.reshape(-1, rank) if self.embedding else down, requires_grad=False)
        self.up = torch.nn.Parameter(up, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        rows = self.selection.rows
        if rows is None:
            return out
        if self.embedding:
            offsets = (rows * self.base.num_embeddings).view(-1, *[1] * (x.dim() - 1))
            return out + torch.matmul(torch.nn.functional.embedding(x + offsets, self.down), self.up[rows])
        tokens = x if x.dim() == 3 else x.unsqueeze(1)
        delta = torch.matmul(torch.matmul(tokens, self.down[rows]), self.up[rows])
        return out + (delta if x.dim() == 3 else delta.squeeze(1))


class _WithAdapters(torch.nn.Module):
    def __init__(self, module: torch.nn.Module, selection: _Selection):
        super().__init__()
        self.module = module
        self.selection = selection

    def forward(self, *args, adapter: torch.Tensor | None = None, **inputs):
        self.selection.rows = adapter
        try:
            return self.module(*args, **inputs)
        finally:
            self.selection.rows = None
