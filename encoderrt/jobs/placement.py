"""Where a Ray job's engines run (kept apart from jobs/on_ray.py, so naming it imports no Ray)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RayPlacement:
    actors: int | None = None
    """Engines at once; None: the cluster's CPUs / cpus_per_actor."""
    cpus_per_actor: int = 1
    address: str | None = None
    """The cluster to join; None: RAY_ADDRESS's, else a new local one."""

    def __post_init__(self) -> None:
        if (self.actors is not None and self.actors < 1) or self.cpus_per_actor < 1:
            raise ValueError("--ray-actors and --ray-cpus-per-actor must be positive")
