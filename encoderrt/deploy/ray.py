"""encoderrt on Ray Serve: replicas of the server `encoderrt serve` runs, behind Ray's proxy.

Ray Serve does what a home-made balancer would do badly: routing, health checks, replacing a dead replica,
autoscaling, draining on scale-down, and the same config on a laptop, a cluster or KubeRay. Each replica
loads compiled artifacts (a replica never compiles: `app` compiles model folders into the cache on the driver
first, and replicas read the artifacts from that path, so it must be one every node sees), builds the same
FastAPI app (every dialect, the limits, /metrics) and batches inside itself under its own token budget.

    serve run encoderrt.deploy.ray:app models=/shared/minilm,/shared/reranker replicas=2
    encoderrt serve --ray --replicas 2 MODEL...          # the same, started by encoderrt
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator
from ray import serve
from ray.serve import metrics

from encoderrt.runtime import Engine, EngineConfig
from encoderrt.runtime.manifest import read_manifest
from encoderrt.runtime.prompts import default_prompt
from encoderrt.server.app import create_app
from encoderrt.server.registry import ModelRegistry
from encoderrt.server.settings import ServerSettings

log = logging.getLogger("encoderrt.deploy")
HEALTH_CHECK_PERIOD_S = 10.0
METRICS_PERIOD_S = 5.0
UPSCALE_DELAY_S = 10.0
DOWNSCALE_DELAY_S = 120.0
"""Scale up within seconds of a sustained rise; scale down only after two quiet minutes (a replica takes seconds
to load, and traffic to a retrieval service comes in waves)."""


class ServedArtifact(BaseModel):
    name: str
    path: str
    default_prompt_name: str | None = None
    """Overrides the folder's default prompt for this model ("" for none), as `serve --default-prompt-name` does."""


class RayAppArgs(BaseModel):
    """`serve run encoderrt.deploy.ray:app key=value ...`, or a Serve config file's `args:` (comma-separated lists)."""

    model_config = ConfigDict(extra="forbid")

    models: list[str]
    """Artifact or model folders (model folders compile on the driver, once, into the compile cache); the bundled
    model by its name, all-MiniLM-L6-v2."""
    served_model_names: list[str] = []
    replicas: int = 1
    autoscale: str | None = None
    """MIN:MAX replicas, scaled on ongoing requests against a target from the engine's measured capacity."""
    cpus_per_replica: float = 2.0
    request_tokens: int = 1024
    """Tokens of a typical request of your traffic (eight 128-token passages by default): with the engine's measured
    budget it sets the autoscaling target."""
    default_prompt_names: list[str] = []
    """Per model, in order, the default prompt replacing the folder's ("" for none): "query,,passage"."""
    api_key: str | None = None
    # the engine's and the app's limits, as `encoderrt serve` takes them (the connection limits are Ray's proxy's)
    max_batch_tokens: int | None = EngineConfig.max_batch_tokens
    max_queue: int = EngineConfig.max_queue_items
    max_queue_seconds: float = EngineConfig.max_queue_seconds
    long_inputs: Literal["truncate", "chunk"] = EngineConfig.long_inputs
    max_token_embeddings: int = EngineConfig.max_token_embeddings
    max_client_batch_size: int = ServerSettings.max_client_batch_size
    max_body_bytes: int = ServerSettings.max_body_bytes

    @field_validator("models", "served_model_names", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return [part for part in value.split(",") if part] if isinstance(value, str) else value

    @field_validator("default_prompt_names", mode="before")
    @classmethod
    def _comma_separated_keeping_empty(cls, value: object) -> object:
        return value.split(",") if isinstance(value, str) else value

    def engine_config(self) -> EngineConfig:
        return EngineConfig(max_batch_tokens=self.max_batch_tokens, max_queue_items=self.max_queue,
                            max_queue_seconds=self.max_queue_seconds, long_inputs=self.long_inputs,
                            max_token_embeddings=self.max_token_embeddings)


@serve.deployment(health_check_period_s=HEALTH_CHECK_PERIOD_S, graceful_shutdown_timeout_s=30)
@serve.ingress()
class EncoderReplica:
    """One replica: the artifacts loaded (hashes checked, as Engine.load always does) and the app built on them."""

    def __init__(self, artifacts: list[ServedArtifact], settings: ServerSettings):
        self.settings = settings
        self.registry = ModelRegistry()
        for artifact in artifacts:
            config = replace(settings.engine, default_prompt_name=artifact.default_prompt_name)
            self.registry.add(artifact.name, Engine.load(artifact.path, config))
        self.registry.mark_ready()
        self.health = BatchHealth(self.registry)
        self.metrics = ReplicaMetrics(self.registry)
        threading.Thread(target=self.metrics.publish_every, args=(METRICS_PERIOD_S,), daemon=True,
                         name="encoderrt-ray-metrics").start()

    def __serve_build_asgi_app__(self):
        return create_app(self.settings, self.registry)

    def check_health(self) -> None:
        """Ray replaces a replica whose check raises."""
        self.health.check()


EXPORTED_STATS = {
    # engine stat -> (Ray metric kind, name, description); Ray adds the deployment, replica and application tags
    "queue_depth": ("gauge", "encoderrt_queue_depth", "Items waiting in the engine queue"),
    "real_tokens": ("counter", "encoderrt_tokens_processed", "Real tokens processed"),
    "batches": ("counter", "encoderrt_batches", "Backend runs"),
    "failed_batches": ("counter", "encoderrt_failed_batches", "Backend runs that failed"),
    "cancelled_items": ("counter", "encoderrt_cancelled_items", "Items dropped before they ran: their client left"),
    "overloaded": ("counter", "encoderrt_overloaded", "Requests refused with 429: the queue was full"),
}


class ReplicaMetrics:
    """The engines' figures as Ray metrics, which Ray labels by replica and exports to Prometheus with the
    cluster's own; a replica's /metrics answers for whichever replica the proxy picked."""

    def __init__(self, registry: ModelRegistry, gauge: type = metrics.Gauge, counter: type = metrics.Counter):
        self._registry = registry
        self._metrics = {stat: (kind, (gauge if kind == "gauge" else counter)(name, description=text, tag_keys=("model",)))
                         for stat, (kind, name, text) in EXPORTED_STATS.items()}
        self._published: dict[tuple[str, str], float] = {}

    def publish(self) -> None:
        for served in self._registry.models():
            stats, tags = served.engine.stats.snapshot(), {"model": served.name}
            for stat, (kind, metric) in self._metrics.items():
                if kind == "gauge":
                    metric.set(stats[stat], tags=tags)
                    continue
                delta = stats[stat] - self._published.get((served.name, stat), 0)
                if delta > 0:  # Ray counters take increments; the engine keeps totals
                    metric.inc(delta, tags=tags)
                    self._published[(served.name, stat)] = stats[stat]

    def publish_every(self, seconds: float) -> None:
        while True:
            time.sleep(seconds)
            try:
                self.publish()
            except Exception:  # noqa: BLE001 - metrics must never take the replica down
                log.exception("publishing engine metrics to Ray failed")


class BatchHealth:
    """A replica is unhealthy when some model ran batches since the last check and every one of them failed: its
    backend is not serving (a replica that merely had no traffic stays healthy)."""

    def __init__(self, registry: ModelRegistry):
        self._registry = registry
        self._seen = {m.name: (0, 0) for m in registry.models()}

    def check(self) -> None:
        for served in self._registry.models():
            stats = served.engine.stats.snapshot()
            batches, failed = stats["batches"], stats["failed_batches"]
            last_batches, last_failed = self._seen.get(served.name, (0, 0))
            self._seen[served.name] = (batches, failed)
            if failed > last_failed and batches == last_batches:
                raise RuntimeError(f"model '{served.name}': every batch since the last health check failed "
                                   f"({failed - last_failed} of them); the backend is not serving")


def app(args: dict) -> serve.Application:
    """The application builder `serve run` calls with its key=value arguments."""
    return build(RayAppArgs.model_validate(args))


def build(options: RayAppArgs) -> serve.Application:
    artifacts = compiled_artifacts(options)
    engine = options.engine_config()
    deployment = EncoderReplica.options(ray_actor_options={"num_cpus": options.cpus_per_replica},
                                        **scaling(options, artifacts, engine))
    # each replica's backend threads match the cores Ray gives it, not every core of the node
    replica_engine = replace(engine, intra_op_threads=math.ceil(options.cpus_per_replica))
    return deployment.bind(artifacts, ServerSettings(api_key=options.api_key, engine=replica_engine,
                                                     max_client_batch_size=options.max_client_batch_size,
                                                     max_body_bytes=options.max_body_bytes))


def run(options: RayAppArgs, host: str, port: int, address: str | None) -> int:
    """`encoderrt serve --ray`: join the cluster at `address` (or RAY_ADDRESS's, or start a local one), serve
    until Ctrl-C."""
    import os

    import ray

    application = build(options)  # compiles here, before Ray starts, so a bad model fails in a second
    # HAProxy forwarding straight to each replica's own HTTP port, rather than Ray's Python proxy in between: on
    # 2 cores the Python proxy takes the CPU the backend needs (0.62x of `encoderrt serve` against ~0.8x); set
    # both when you start a cluster yourself
    os.environ.setdefault("RAY_SERVE_ENABLE_HA_PROXY", "1")
    os.environ.setdefault("RAY_SERVE_ENABLE_DIRECT_INGRESS", "1")
    ray.init(address=address)
    serve.start(http_options={"host": host, "port": port})
    _stop_on_signals()
    try:
        serve.run(application, name="encoderrt", route_prefix="/", blocking=True)
    except KeyboardInterrupt:
        return 130
    finally:
        serve.shutdown()
    return 0


def _stop_on_signals() -> None:
    """Ctrl-C and SIGTERM (docker stop, systemd, Kubernetes) both end `serve.run` as KeyboardInterrupt, so that Serve
    is shut down. Set explicitly: a process started in a script's background inherits SIGINT ignored, Python then
    installs no Ctrl-C handler, and SIGINT left `serve --ray` running (SIGTERM killed it without a shutdown)."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, interrupt)


def compiled_artifacts(options: RayAppArgs) -> list[ServedArtifact]:
    """Every MODEL as an artifact path, compiled here (the driver) when it is a model folder, named as `serve` names."""
    from encoderrt.compile.cache import BUNDLED_NAME, artifact_for
    from encoderrt.compile.progress import StepReporter
    from encoderrt.server.loading import ModelSpec, plan_models

    names, prompts = options.served_model_names, options.default_prompt_names
    for given, field in ((names, "served_model_names"), (prompts, "default_prompt_names")):
        if len(given) > len(options.models):
            raise ValueError(f"{len(given)} {field} for {len(options.models)} models")
    paths = [None if path == BUNDLED_NAME and not Path(path).exists() else Path(path) for path in options.models]
    specs = [ModelSpec(path, names[i] if i < len(names) else None, prompts[i] if i < len(prompts) else None)
             for i, path in enumerate(paths)]
    artifacts = []
    for planned in plan_models(specs):
        path, _ = artifact_for(planned.spec.path, StepReporter(logger=log, prefix=f"{planned.name}: "))
        prompt = planned.spec.default_prompt_name
        # an unknown prompt fails here, not in every replica's start-up (which checks the files' hashes itself)
        default_prompt(read_manifest(path, verify_files=False), prompt)
        artifacts.append(ServedArtifact(name=planned.name, path=str(Path(path).absolute()), default_prompt_name=prompt))
    return artifacts


def scaling(options: RayAppArgs, artifacts: list[ServedArtifact], config: EngineConfig) -> dict:
    """Fixed replicas, or autoscaling whose target is what one replica's engine keeps busy."""
    if options.autoscale is None:
        if options.replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {options.replicas}")
        return {"num_replicas": options.replicas}
    low, _, high = options.autoscale.partition(":")
    try:
        minimum, maximum = int(low), int(high)
    except ValueError:
        raise ValueError(f"autoscale takes MIN:MAX replicas, got {options.autoscale!r}") from None
    if not 0 <= minimum <= maximum or maximum < 1:
        raise ValueError(f"autoscale MIN:MAX needs 0 <= MIN <= MAX and MAX >= 1, got {options.autoscale!r}")
    return {"autoscaling_config": {"min_replicas": minimum, "max_replicas": maximum,
                                   "target_ongoing_requests": target_ongoing_requests(artifacts[0].path, config,
                                                                                      options.request_tokens),
                                   "upscale_delay_s": UPSCALE_DELAY_S, "downscale_delay_s": DOWNSCALE_DELAY_S}}


def target_ongoing_requests(artifact: str, config: EngineConfig, request_tokens: int) -> int:
    """Requests in flight that keep one replica's every stream running full batches with one forming behind each:
    2 x streams x token budget / tokens per request, the budget and streams as the engine calibrates them here."""
    with Engine.load(artifact, config) as engine:
        budget, streams = engine.info.max_batch_tokens, engine.info.parallel_runs
    return max(1, math.ceil(2 * streams * budget / request_tokens))
