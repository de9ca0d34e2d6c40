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
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

from pydantic import BaseModel
from ray import serve
from ray.serve import metrics

from encoderrt.deploy.settings import RayAppArgs, RaySettings
from encoderrt.runtime import Engine, EngineConfig
from encoderrt.runtime.heap import freeze_startup_heap
from encoderrt.runtime.manifest import read_manifest
from encoderrt.runtime.prompts import default_prompt
from encoderrt.server.app import create_app
from encoderrt.server.health import ServingHealth
from encoderrt.server.metrics import ENGINE_FIGURES
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
        freeze_startup_heap()  # the replica's process is its own: its full collections need not walk the weights' side
        self.registry.mark_ready()
        self.health = ServingHealth(self.registry)
        self.metrics = ReplicaMetrics(self.registry)
        threading.Thread(target=self.metrics.publish_every, args=(METRICS_PERIOD_S,), daemon=True,
                         name="encoderrt-ray-metrics").start()

    def __serve_build_asgi_app__(self):
        return create_app(self.settings, self.registry)

    def check_health(self) -> None:
        """Ray replaces a replica whose check raises."""
        self.health.check()


class ReplicaMetrics:
    """The engines' figures (server/metrics.py's ENGINE_FIGURES, what /metrics says of them) as Ray metrics, which
    Ray labels by deployment and replica and exports to Prometheus with the cluster's own; a replica's /metrics
    answers for whichever replica the proxy picked."""

    def __init__(self, registry: ModelRegistry, gauge: type = metrics.Gauge, counter: type = metrics.Counter):
        self._registry = registry
        self._metrics = [(figure, (gauge if figure.kind == "gauge" else counter)(
                              figure.name, description=figure.description, tag_keys=("model",)))
                         for figure in ENGINE_FIGURES]
        self._published: dict[tuple[str, str], float] = {}

    def publish(self) -> None:
        for served in self._registry.models():
            stats, tags = served.engine.stats.snapshot(), {"model": served.name}
            for figure, metric in self._metrics:
                value = figure.read(served.engine, stats)
                if value is None:
                    continue
                if figure.kind == "gauge":
                    metric.set(value, tags=tags)
                    continue
                delta = value - self._published.get((served.name, figure.name), 0)
                if delta > 0:  # Ray counters take increments; the engine keeps totals
                    metric.inc(delta, tags=tags)
                    self._published[(served.name, figure.name)] = value

    def publish_every(self, seconds: float) -> None:
        while True:
            time.sleep(seconds)
            try:
                self.publish()
            except Exception:  # noqa: BLE001 - metrics must never take the replica down
                log.exception("publishing engine metrics to Ray failed")


def app(args: dict) -> serve.Application:
    """The application builder `serve run` calls with its key=value arguments."""
    return build(RayAppArgs.model_validate(args))


def build(options: RayAppArgs) -> serve.Application:
    artifacts = compiled_artifacts(options)
    engine = options.layer(EngineConfig)
    deployment = EncoderReplica.options(ray_actor_options={"num_cpus": options.cpus_per_replica},
                                        **scaling(options, artifacts, engine))
    # each replica's backend threads match the cores Ray gives it, not every core of the node
    replica_engine = engine if engine.intra_op_threads else replace(engine,
                                                                    intra_op_threads=math.ceil(options.cpus_per_replica))
    return deployment.bind(artifacts, options.layer(ServerSettings, engine=replica_engine))


HAPROXY_DEREGISTRATION_S = 5
"""How long a stopping replica stays reachable before it refuses new connections. Ray's default (30 s) is sized
for cloud load balancers that poll; the HAProxy on each node reloads within a second of the controller's update,
and retries a refused connection on another replica. 30 s made every Ctrl-C and every scale-down wait 30 s."""


def use_haproxy() -> None:
    """HAProxy forwarding straight to each replica's own HTTP port, rather than Ray's Python proxy in between: on
    2 cores the Python proxy takes the CPU the backend needs (0.62x of `encoderrt serve` against ~0.8x); set these
    when you start a cluster yourself."""
    os.environ.setdefault("RAY_SERVE_ENABLE_HA_PROXY", "1")
    os.environ.setdefault("RAY_SERVE_ENABLE_DIRECT_INGRESS", "1")
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", str(HAPROXY_DEREGISTRATION_S))


def run(options: RayAppArgs, host: str, port: int, address: str | None) -> int:
    """`encoderrt serve --ray`: join the cluster at `address` (or RAY_ADDRESS's, or start a local one), serve
    until Ctrl-C. Replicas the cluster cannot place are refused before Serve starts."""
    import ray

    application = build(options)  # compiles here, before Ray starts, so a bad model fails in a second
    use_haproxy()
    ray.init(address=address)
    try:
        for warning in check_placement(options, ray.cluster_resources().get("CPU", 0.0)):
            log.warning("%s", warning)
    except ValueError:
        ray.shutdown()
        raise
    serve.start(http_options={"host": host, "port": port})
    _stop_on_signals()
    try:
        serve.run(application, name="encoderrt", route_prefix="/", blocking=True)
    except KeyboardInterrupt:
        return 130
    finally:
        serve.shutdown()
    return 0


def check_placement(options: RayAppArgs, cluster_cpus: float) -> list[str]:
    """Ray leaves a replica it cannot place pending, without a word, and Serve never becomes healthy: the replicas
    that must run (a fixed count, or autoscaling's minimum) x CPUs each past the cluster's CPUs is a ValueError
    naming the numbers; an autoscaling maximum past them is a warning (the cluster may grow)."""
    each = options.cpus_per_replica
    if not each > 0:
        raise ValueError(f"cpus_per_replica must be above 0, got {each:g}")
    low, high = autoscale_bounds(options.autoscale) if options.autoscale else (options.replicas, options.replicas)
    def need(count: int) -> str:
        return (f"{count} replicas x {each:g} CPUs each (--cpus-per-replica) need {count * each:g} CPUs; this Ray "
                f"cluster has {cluster_cpus:g}")

    if low * each > cluster_cpus:
        what = f"autoscaling's minimum of {low}" if options.autoscale else f"--replicas {low}"
        raise ValueError(f"{what}: {need(low)}, so Ray would leave {low - int(cluster_cpus // each)} of them pending; "
                         "lower --replicas or --cpus-per-replica, or add nodes")
    if high * each > cluster_cpus:
        return [f"autoscaling's maximum of {high}: {need(high)}, so past {int(cluster_cpus // each)} replicas new ones "
                "wait for the cluster to grow"]
    return []


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
    from encoderrt.compile.cache import artifact_for
    from encoderrt.compile.progress import StepReporter
    from encoderrt.server.loading import plan_models

    artifacts = []
    for planned in plan_models(options.specs()):
        path, _ = artifact_for(planned.spec.path, StepReporter(logger=log, prefix=f"{planned.name}: "),
                               planned.spec.compile_precision)
        prompt = planned.spec.default_prompt_name
        # an unknown prompt fails here, not in every replica's start-up (which checks the files' hashes itself)
        default_prompt(read_manifest(path, verify_files=False), prompt)
        artifacts.append(ServedArtifact(name=planned.name, path=str(Path(path).absolute()), default_prompt_name=prompt))
    return artifacts


def check_scaling(options: RayAppArgs) -> None:
    """The scaling arguments, checked before anything compiles or starts: a fixed replica count or MIN:MAX, and a
    setting of the other way refused, not ignored."""
    default = RaySettings()
    if options.request_tokens < 1:
        raise ValueError(f"request_tokens must be at least 1, got {options.request_tokens}")
    if options.autoscale is None:
        if options.replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {options.replicas}")
        if options.request_tokens != default.request_tokens:
            raise ValueError("request_tokens sizes autoscaling's target and applies with autoscale (MIN:MAX); "
                             f"a fixed count of {options.replicas} replicas would ignore it")
        return
    if options.replicas != default.replicas:
        raise ValueError(f"replicas ({options.replicas}) and autoscale ({options.autoscale}) both set the replica "
                         "count: give one")
    autoscale_bounds(options.autoscale)


def scaling(options: RayAppArgs, artifacts: list[ServedArtifact], config: EngineConfig) -> dict:
    """Fixed replicas, or autoscaling whose target is what one replica's engine keeps busy."""
    check_scaling(options)
    if options.autoscale is None:
        return {"num_replicas": options.replicas}
    minimum, maximum = autoscale_bounds(options.autoscale)
    return {"autoscaling_config": {"min_replicas": minimum, "max_replicas": maximum,
                                   "target_ongoing_requests": target_ongoing_requests(artifacts[0].path, config,
                                                                                      options.request_tokens),
                                   "upscale_delay_s": UPSCALE_DELAY_S, "downscale_delay_s": DOWNSCALE_DELAY_S}}


def autoscale_bounds(autoscale: str) -> tuple[int, int]:
    """MIN:MAX replicas, checked."""
    low, _, high = autoscale.partition(":")
    try:
        minimum, maximum = int(low), int(high)
    except ValueError:
        raise ValueError(f"autoscale takes MIN:MAX replicas, got {autoscale!r}") from None
    if not 0 <= minimum <= maximum or maximum < 1:
        raise ValueError(f"autoscale MIN:MAX needs 0 <= MIN <= MAX and MAX >= 1, got {autoscale!r}")
    return minimum, maximum


def target_ongoing_requests(artifact: str, config: EngineConfig, request_tokens: int) -> int:
    """Requests in flight that keep one replica's every stream running full batches with one forming behind each:
    2 x streams x token budget / tokens per request, the budget and streams as the engine calibrates them here."""
    with Engine.load(artifact, config) as engine:
        budget, streams = engine.info.max_batch_tokens, engine.info.parallel_runs
    return max(1, math.ceil(2 * streams * budget / request_tokens))
