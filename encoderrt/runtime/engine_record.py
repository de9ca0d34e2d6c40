"""The record of a TensorRT engine in the manifest: what it was built for, and its profiles.

Written by compile, read by the TensorRT backend; an engine built for another TensorRT version or
GPU generation is refused at load rather than run blindly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from encoderrt.runtime.errors import BackendUnavailable


class EngineMismatch(BackendUnavailable):
    """The engine was built for another TensorRT version or GPU generation."""


@dataclass(frozen=True)
class Profile:
    """One TensorRT optimisation profile: sequences of min_length..max_length tokens, up to max_batch rows."""

    min_length: int
    max_length: int
    max_batch: int
    opt_batch: int

    def shapes(self) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        return (1, self.min_length), (self.opt_batch, self.max_length), (self.max_batch, self.max_length)

    def covers(self, rows: int, width: int) -> bool:
        return self.min_length <= width <= self.max_length and rows <= self.max_batch


Shapes = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
"""An input's (minimum, optimum, maximum) shape in an optimisation profile."""


@dataclass(frozen=True)
class PackedShapes:
    """The packed engine's one profile: up to max_tokens real tokens in up to max_sequences sequences.

    A batch with more rows runs in several engine calls; max_sequences also bounds the [sequences x
    tokens] membership matrix that mean pooling multiplies by.
    """

    max_tokens: int
    max_sequences: int

    def shapes(self, name: str) -> Shapes:
        if name == "cu_seqlens":
            return (2,), (min(64, self.max_sequences) + 1,), (self.max_sequences + 1,)
        return (1,), (max(1, self.max_tokens // 2),), (self.max_tokens,)


@dataclass(frozen=True)
class EngineRecord:
    """What an engine was built for; the runtime refuses an engine that does not match its machine."""

    tensorrt_version: str
    compute_capability: str
    precision: str
    profiles: tuple[Profile, ...]
    fused_attention_layers: int | None = None
    """Layers TensorRT reports as fused attention (or the packed attention plugin), where its inspector says."""
    packed: PackedShapes | None = None
    """Set for a packed graph, whose one profile this is; `profiles` is then empty."""

    @property
    def max_batch_tokens(self) -> int:
        """The token budget the engine was built for: any batch of rows x width within it fits a profile."""
        if self.packed:
            return self.packed.max_tokens
        return max(p.max_batch * p.min_length for p in self.profiles)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EngineRecord":
        packed = data.get("packed")
        return cls(**{**data, "profiles": tuple(Profile(**p) for p in data["profiles"]),
                      "packed": PackedShapes(**packed) if packed else None})


def pick_profile(profiles: tuple[Profile, ...], rows: int, width: int) -> int:
    for index, profile in enumerate(profiles):
        if profile.covers(rows, width):
            return index
    raise ValueError(f"no optimisation profile covers a batch of {rows} rows x {width} tokens")


def check_engine_compatibility(record: EngineRecord, tensorrt_version: str, compute_capability: str) -> None:
    """An engine runs only on the TensorRT version and GPU generation it was built for."""
    problems = []
    if record.tensorrt_version != tensorrt_version:
        problems.append(f"TensorRT {record.tensorrt_version} (this machine has {tensorrt_version})")
    if record.compute_capability != compute_capability:
        problems.append(f"compute capability {record.compute_capability} (this GPU is {compute_capability})")
    if problems:
        raise EngineMismatch("the TensorRT engine was built for " + " and ".join(problems)
                           + "; rebuild it here with compile-model --target tensorrt")


