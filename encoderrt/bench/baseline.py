"""Regression checks on ratios, never on absolute times: shared CI machines are noisy, but a ratio
measured against a reference in the same run travels between machines."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Comparison:
    name: str
    baseline: float
    current: float | None
    floor: float

    @property
    def passed(self) -> bool:
        return self.current is not None and self.current >= self.floor


def read_baseline(path: Path, tier: str | None = None) -> dict[str, float]:
    """The ratios to hold: the file's floor for every CPU, overridden by those recorded for this CPU's tier."""
    data = _load(path)
    ratios = dict(_ratios(data, path))
    recorded = data.get("by_cpu", {})
    if tier is not None and isinstance(recorded, dict) and isinstance(recorded.get(tier), dict):
        ratios.update(_ratios(recorded[tier], path))
    return ratios


def recorded_tiers(path: Path) -> list[str]:
    recorded = _load(path).get("by_cpu", {})
    return sorted(recorded) if isinstance(recorded, dict) else []


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read baseline {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"baseline {path} has no 'ratios' object of numbers")
    return data


def _ratios(data: dict, path: Path) -> dict[str, float]:
    ratios = data.get("ratios")
    if not isinstance(ratios, dict) or not all(isinstance(v, (int, float)) for v in ratios.values()):
        raise ValueError(f"baseline {path} has no 'ratios' object of numbers")
    return {str(k): float(v) for k, v in ratios.items()}


def write_baseline(path: Path, ratios: dict[str, float], note: str, tier: str | None = None) -> None:
    """Record `ratios` for CPUs of `tier` (the floor too, in a new file); other tiers' records are kept."""
    data = _load(path) if path.is_file() else {"note": note, "ratios": ratios}
    if tier is not None:
        data.setdefault("by_cpu", {})[tier] = {"note": note, "ratios": ratios}
    else:
        data.update(note=note, ratios=ratios)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def compare(baseline: dict[str, float], current: dict[str, float], tolerance: float) -> list[Comparison]:
    """A figure regresses when it falls more than `tolerance` (relative) below its baseline; faster always passes."""
    return [Comparison(name, value, current.get(name), value * (1 - tolerance)) for name, value in sorted(baseline.items())]


def format_comparisons(comparisons: list[Comparison], tolerance: float) -> str:
    lines = [f"{'figure':<40} {'baseline':>9} {'current':>9} {'floor':>9}  (tolerance {tolerance:.0%})"]
    for c in comparisons:
        current = "missing" if c.current is None else f"{c.current:.3f}"
        lines.append(f"{c.name:<40} {c.baseline:>9.3f} {current:>9} {c.floor:>9.3f}  {'ok' if c.passed else 'REGRESSION'}")
    return "\n".join(lines)
