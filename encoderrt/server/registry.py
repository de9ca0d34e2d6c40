"""The served models, by name, and which one answers a request.

Built at start-up (possibly in the background while models compile) and handed to the routes
through app.state; nothing here is global.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from encoderrt.runtime import Engine
from encoderrt.runtime.errors import InvalidRequest
from encoderrt.server.errors import NotReady, UnknownModel

# which model tasks can answer each verb, best first (an embedding model scores by its similarity)
VERB_TASKS: dict[str, tuple[str, ...]] = {
    "embed": ("embed", "hybrid"),
    "score": ("score", "multi_vector", "hybrid", "embed", "sparse"),
    "rerank": ("score", "multi_vector", "hybrid", "embed", "sparse"),
    "classify": ("classify", "score"),
    "embed_sparse": ("sparse", "hybrid"),
    "embed_all": ("embed", "hybrid", "multi_vector"),
    "pooling": ("embed", "hybrid", "classify", "score", "multi_vector"),
    "tokenize": ("embed", "score", "classify", "sparse", "multi_vector", "hybrid"),
}


class LoadCancelled(Exception):
    """The server is stopping: the model being compiled stops at its next step."""


@dataclass(frozen=True)
class ServedModel:
    name: str
    engine: Engine


class ModelRegistry:
    def __init__(self) -> None:
        self._models: dict[str, ServedModel] = {}
        self._ready = threading.Event()
        self.failure: str | None = None
        self.status = "loading"
        self.steps: dict[str, str] = {}
        """Each model's step while loading ("waiting", "compiling: export", "loading", "ready"), for /health."""
        self._cancelled = threading.Event()
        self._when_ready: list[Callable[[], None]] = []

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def add(self, name: str, engine: Engine) -> None:
        if name in self._models:
            raise ValueError(f"two models are served as '{name}': give each a distinct --served-model-name")
        self._models[name] = ServedModel(name, engine)

    def set_step(self, name: str, step: str) -> None:
        if self._cancelled.is_set():
            raise LoadCancelled(f"stopped while {name} was at: {self.steps.get(name, step)}")
        self.steps[name] = step

    def cancel(self) -> None:
        """Stop loading at the next step (a compile step in progress finishes first)."""
        self._cancelled.set()

    def mark_ready(self) -> None:
        self.status = "ready"
        self._ready.set()
        for callback in self._when_ready:
            callback()

    def when_ready(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the models are ready (now, if they are), in the thread that readied them."""
        self._when_ready.append(callback)
        if self.ready:
            callback()

    def mark_failed(self, message: str) -> None:
        self.status = "failed"
        self.failure = message

    def models(self) -> list[ServedModel]:
        return list(self._models.values())

    def resolve(self, name: str | None, verb: str) -> ServedModel:
        if not self.ready:
            raise NotReady(f"the server is not ready: {self.failure or 'models are still loading'}")
        if name:
            served = self._models.get(name)
            if served is None:
                raise UnknownModel(f"model '{name}' is not served here; served models: {', '.join(self._models)}")
            task = served.engine.info.task
            if task not in VERB_TASKS[verb]:
                answers = ", ".join(v for v, tasks in VERB_TASKS.items() if task in tasks)
                article = "an" if task[0] in "aeiou" else "a"
                raise InvalidRequest(f"model '{name}' is {article} {task} model and cannot answer {verb} (it answers {answers})")
            return served
        for task in VERB_TASKS[verb]:
            candidates = [m for m in self._models.values() if m.engine.info.task == task]
            if len(candidates) == 1:
                return candidates[0]
            if candidates:
                names = ", ".join(m.name for m in candidates)
                raise InvalidRequest(f"several models can answer {verb} ({names}): name one in the 'model' field")
        raise InvalidRequest(f"no served model can answer {verb}; served models: "
                             + ", ".join(f"{m.name} ({m.engine.info.task})" for m in self._models.values()))

    def close(self) -> None:
        for served in self._models.values():
            served.engine.close()
