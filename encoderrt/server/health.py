"""Whether each loaded model serves, as /health and Ray's replica check report it.

A model does not serve when a batching worker of its engine has stopped, or when every batch it ran since its last
success failed: its backend is not answering. That holds until a batch succeeds, so a poller that keeps asking while
a balancer sends no traffic (Kubernetes' liveness probe) sees it every time; a model that merely had no traffic
stays healthy. TEI probes a failed backend with a test batch; here the traffic is the probe, so a check costs no
inference."""

from __future__ import annotations

from encoderrt.server.registry import ModelRegistry


class ServingHealth:
    def __init__(self, registry: ModelRegistry):
        self._registry = registry
        self._seen: dict[str, tuple[int, int]] = {}
        """Each model's (batches, failed batches) at the last check."""
        self._failing: dict[str, int] = {}
        """The models whose batches have all failed since their last success, and how many."""

    def problems(self) -> dict[str, str]:
        """What stops each model that does not serve, by name; empty where all do. Each call is a check: the next
        one reads the batches since."""
        found = {}
        for served in self._registry.models():
            stats = served.engine.stats.snapshot()
            batches, failed = stats["batches"], stats["failed_batches"]
            last_batches, last_failed = self._seen.get(served.name, (0, 0))
            self._seen[served.name] = (batches, failed)
            if batches > last_batches:  # a batch succeeded since: the backend runs
                self._failing.pop(served.name, None)
            elif failed > last_failed:
                self._failing[served.name] = self._failing.get(served.name, 0) + failed - last_failed
            if stopped := served.engine.stopped_workers():
                found[served.name] = (f"batching worker{'s' if len(stopped) > 1 else ''} {', '.join(stopped)} "
                                      "stopped; restart the server")
            elif served.name in self._failing:
                found[served.name] = (f"every batch since the last success failed ({self._failing[served.name]} of "
                                      "them); the backend is not serving")
        return found

    def check(self) -> None:
        """Raise naming what stops the models that do not serve (Ray replaces a replica whose check raises)."""
        if problems := self.problems():
            raise RuntimeError("; ".join(f"model '{name}': {problem}" for name, problem in problems.items()))
