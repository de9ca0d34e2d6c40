"""encoderrt replicas on Ray Serve, on a local Ray cluster this module starts and stops (loopback only): the same
answers as sentence-transformers through the real OpenAI and Cohere SDKs, a replica killed under load loses no
request, and the replica count follows the config (deployments that would restart replicas only where the
config changes)."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import cohere
import numpy as np
import openai
import pytest
import ray
from ray import serve

from encoderrt import Engine
from encoderrt.bench import workloads
from encoderrt.deploy.ray import RayAppArgs, app, compiled_artifacts, scaling
from encoderrt.runtime import EngineConfig
from server_helpers import free_port, wait_for

APP = "encoderrt"
TEXTS = workloads.passages(24, seed=15)


class _Cluster:
    """The module's Serve instance and the app it runs. Serve restarts every replica on each `serve.run` of a
    built app (it versions code it did not read from a config file), so deploying what already runs is skipped."""

    def __init__(self, url: str):
        self.url, self._running = url, None

    def deploy(self, args: dict, **scaling) -> None:
        wanted = {**args, **scaling}
        if wanted == self._running and _running_replicas() == scaling.get("replicas"):
            return
        self._running = None
        serve.run(app(wanted), name=APP, route_prefix="/")
        if "replicas" in scaling:
            _wait_for_replicas(scaling["replicas"])
        self._running = wanted


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield _Cluster(f"http://127.0.0.1:{port}")
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def models(minilm_fp32, tiny_artifacts):
    # max_client_batch_size: every request the tests send fits; one text more is refused by the replica
    return {"models": [str(minilm_fp32.path), str(tiny_artifacts["bert-cross-encoder"])],
            "served_model_name": ["minilm", "reranker"], "cpus_per_replica": 1, "max_client_batch_size": len(TEXTS)}


@pytest.fixture(scope="module")
def references(minilm_dir, tiny_models):
    from sentence_transformers import CrossEncoder, SentenceTransformer

    embeddings = SentenceTransformer(str(minilm_dir), device="cpu").encode(TEXTS, normalize_embeddings=True)
    scores = CrossEncoder(str(tiny_models["bert-cross-encoder"]), device="cpu", max_length=64).predict(
        [("which fox is quick", text) for text in TEXTS[:8]])
    return embeddings, scores


def _running_replicas() -> int:
    status = serve.status().applications[APP].deployments["EncoderReplica"]
    return status.replica_states.get("RUNNING", 0)


def _wait_for_replicas(count: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while _running_replicas() != count:
        assert time.monotonic() < deadline, serve.status()
        time.sleep(0.5)


def test_two_replicas_answer_as_sentence_transformers_through_the_sdks(cluster, models, references):
    cluster.deploy(models, replicas=2)
    embeddings, scores = references
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused")
    reply = client.embeddings.create(model="minilm", input=TEXTS)
    served = np.array([item.embedding for item in reply.data], dtype=np.float32)
    assert (served * embeddings).sum(1).min() >= 0.99999
    ranked = cohere.ClientV2(base_url=cluster.url, api_key="unused").rerank(
        model="reranker", query="which fox is quick", documents=TEXTS[:8])
    by_index = {result.index: result.relevance_score for result in ranked.results}
    np.testing.assert_allclose([by_index[i] for i in range(8)], scores, atol=1e-5)
    assert [r.index for r in ranked.results] == list(np.argsort(-scores, kind="stable"))


class _Load:
    """Four clients embedding random picks of TEXTS until the block ends; answers and API errors kept apart."""

    def __init__(self, client: openai.OpenAI):
        self.client, self.results, self.failures = client, [], []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, args=(seed,)) for seed in range(4)]

    def _send(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not self._stop.is_set():
            picked = rng.choice(len(TEXTS), size=4, replace=False)
            try:
                reply = self.client.embeddings.create(model="minilm", input=[TEXTS[i] for i in picked])
            except openai.APIError as error:
                self.failures.append(error)
                continue
            self.results.append((picked, np.array([item.embedding for item in reply.data], dtype=np.float32)))

    def answered(self, more: int, timeout: float = 60) -> int:
        """Waits for `more` answers beyond those already in (requests are flowing), and returns the count then."""
        target = len(self.results) + more
        wait_for(lambda: len(self.results) >= target, timeout,
                 lambda: f"{len(self.results)} of {target} answers after {timeout} s; failures: {self.failures[:3]}")
        return len(self.results)

    def wrong(self, embeddings: np.ndarray) -> list:
        return [picked for picked, vectors in self.results if (vectors * embeddings[picked]).sum(1).min() < 0.99999]

    def __enter__(self) -> "_Load":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


def test_a_replica_killed_under_load_loses_no_request(cluster, models, references):
    cluster.deploy(models, replicas=2)
    embeddings, _ = references
    with _Load(openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=5, timeout=60)) as load:
        load.answered(8)
        replica = next(actor for actor in ray.util.list_named_actors(all_namespaces=True)
                       if actor["name"].startswith("SERVE_REPLICA::") and "EncoderReplica" in actor["name"])
        ray.kill(ray.get_actor(replica["name"], namespace=replica["namespace"]), no_restart=True)
        load.answered(1)  # served on after the kill (requests held by the dead replica are retried meanwhile)
    wrong, failures = load.wrong(embeddings), load.failures
    print(f"replica killed under load: {len(load.results)} answers, {len(wrong)} wrong, {len(failures)} retryable errors")
    assert load.results and not wrong, f"{len(wrong)} of {len(load.results)} answers had wrong vectors"
    # a clean, retryable error is allowed; a wrong vector is not
    assert all(isinstance(error, openai.APIStatusError) and error.status_code in (502, 503) for error in failures), failures
    _wait_for_replicas(2)  # Ray replaced the dead replica


def test_scaling_down_under_load_finishes_every_request(cluster, models, references):
    """2 -> 1 replicas through the config while 4 clients keep sending: the replica Ray stops drains what it holds
    (graceful shutdown), new requests go to the other, and no request fails or comes back wrong. The app's limits
    reach the replicas too: a request over max_client_batch_size gets the replica's own 413."""
    cluster.deploy(models, replicas=2)
    embeddings, _ = references
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="unused", max_retries=0, timeout=60)
    with _Load(client) as load:
        before = load.answered(8)
        cluster.deploy(models, replicas=1)
        load.answered(4)  # served on by the one replica left
    wrong, failures = load.wrong(embeddings), load.failures
    print(f"scaled 2 -> 1 under load: {len(load.results)} answers ({len(load.results) - before} during and after), "
          f"{len(wrong)} wrong, {len(failures)} failed")
    assert len(load.results) > before and not wrong and not failures, failures[:3]
    with pytest.raises(openai.APIStatusError) as refused:
        client.embeddings.create(model="minilm", input=[*TEXTS, "one text too many"])
    assert refused.value.status_code == 413 and "--max-client-batch-size" in str(refused.value)


def test_a_default_prompt_the_model_lacks_fails_on_the_driver(models):
    options = RayAppArgs.model_validate({**models, "default_prompt_name": "query"})
    with pytest.raises(ValueError, match="default prompt name 'query' is not one of this model's prompts: none"):
        compiled_artifacts(options)
    kept = RayAppArgs.model_validate({**models, "default_prompt_name": ",,"})
    assert kept.default_prompt_name == ["", "", ""]  # "" (no prompt) is a value, not a gap
    # the plural spelling of earlier releases' Serve configs still works
    assert RayAppArgs.model_validate({**models, "default_prompt_names": "query"}).default_prompt_name == ["query"]


def test_serve_ray_refuses_connection_flags_it_cannot_apply(minilm_fp32):
    run = subprocess.run([sys.executable, "-m", "encoderrt.cli", "serve", "--ray", "--max-connections", "10",
                          str(minilm_fp32.path), "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    said = " ".join((run.stdout + run.stderr).split())  # the console wraps long lines
    assert run.returncode == 2 and "--max-connections" in said and "do not apply" in said, said


def test_an_autoscaling_app_runs_within_its_bounds(cluster, models):
    """(A fixed count following the config is the scaling-down test above.)"""
    cluster.deploy(models, autoscale="1:2")
    assert 1 <= _running_replicas() <= 2
    deployment = serve.status().applications[APP].deployments["EncoderReplica"]
    assert deployment.status == "HEALTHY", deployment


def test_the_autoscaling_target_is_what_one_replica_keeps_busy(models, minilm_fp32):
    options = RayAppArgs.model_validate({**models, "autoscale": "1:4", "request_tokens": 512, "max_batch_tokens": 1024})
    config = scaling(options, compiled_artifacts(options), EngineConfig(max_batch_tokens=1024))["autoscaling_config"]
    with Engine.load(minilm_fp32.path, max_batch_tokens=1024) as engine:
        streams = engine.info.parallel_runs
    # two full 1,024-token batches per stream, of 512-token requests
    assert config["target_ongoing_requests"] == 4 * streams
    assert (config["min_replicas"], config["max_replicas"]) == (1, 4)
    assert config["downscale_delay_s"] > config["upscale_delay_s"]


@pytest.mark.parametrize(("args", "message"), [
    ({"autoscale": "2"}, "MIN:MAX"),
    ({"autoscale": "3:1"}, "MIN <= MAX"),
    ({"replicas": 0}, "at least 1"),
    # each was ignored: a fixed count took no request size, autoscaling no count
    ({"request_tokens": 512}, "request_tokens sizes autoscaling's target and applies with autoscale"),
    ({"autoscale": "1:4", "replicas": 3}, r"replicas \(3\) and autoscale \(1:4\) both set the replica count"),
    ({"autoscale": "1:4", "request_tokens": 0}, "request_tokens must be at least 1, got 0"),
])
def test_bad_scaling_arguments_name_the_problem(models, args, message):
    options = RayAppArgs.model_validate({**models, **args})
    with pytest.raises(ValueError, match=message):
        scaling(options, [], EngineConfig())


def test_unknown_arguments_are_refused():
    with pytest.raises(ValueError, match="replica_count"):
        RayAppArgs.model_validate({"models": "a,b", "replica_count": 2})
    assert RayAppArgs.model_validate({"models": "a,b"}).models == ["a", "b"]


@pytest.mark.parametrize("document", ["serve-config.yaml", "kuberay-rayservice.yaml"])
def test_the_shipped_serve_configs_are_valid_for_ray_and_for_the_builder(document):
    import yaml
    from ray.serve.schema import ServeDeploySchema

    loaded = yaml.safe_load((Path(__file__).parents[2] / "deploy" / document).read_text())
    config = yaml.safe_load(loaded["spec"]["serveConfigV2"]) if loaded.get("kind") == "RayService" else loaded
    schema = ServeDeploySchema.model_validate(config) if hasattr(ServeDeploySchema, "model_validate") else \
        ServeDeploySchema.parse_obj(config)
    (application,) = schema.applications
    assert application.import_path == "encoderrt.deploy.ray:app"
    options = RayAppArgs.model_validate(application.args)
    assert options.models and len(options.served_model_name) == len(options.models) and options.autoscale


def test_serve_ray_refuses_bad_scaling_before_starting_anything(minilm_fp32):
    run = subprocess.run([sys.executable, "-m", "encoderrt.cli", "serve", "--ray", "--autoscale", "3:1",
                          str(minilm_fp32.path), "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "MIN <= MAX" in run.stdout + run.stderr, run.stdout + run.stderr


def test_a_replica_whose_every_batch_fails_is_unhealthy_until_one_succeeds(controlled, tiny_artifacts):
    from encoderrt.runtime.errors import InferenceFailed
    from encoderrt.server.health import ServingHealth
    from server_helpers import ready_registry

    engine = Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=256)
    health = ServingHealth(ready_registry(st=engine))
    health.check()  # no traffic: healthy
    engine.embed(["works"])
    health.check()
    for attempt in range(3):
        controlled[0].fail_next = True
        with pytest.raises(InferenceFailed):
            engine.embed([f"fails {attempt}"])
    with pytest.raises(RuntimeError, match="every batch since the last success failed \\(3 of them\\)"):
        health.check()
    with pytest.raises(RuntimeError, match="\\(3 of them\\)"):  # no traffic since: still not serving
        health.check()
    controlled[0].fail_next = True
    with pytest.raises(InferenceFailed):
        engine.embed(["one more failure"])
    with pytest.raises(RuntimeError, match="\\(4 of them\\)"):
        health.check()
    engine.embed(["and a success"])
    health.check()  # some batch succeeded since: the backend serves
    engine.close()


def test_replica_metrics_reach_ray_as_increments_of_the_engines_totals(tiny_artifacts):
    from encoderrt.deploy.ray import ReplicaMetrics
    from encoderrt.server.metrics import ENGINE_FIGURES
    from server_helpers import ready_registry

    class Recorded:
        def __init__(self, name, description, tag_keys):
            self.name, self.tag_keys, self.values = name, tag_keys, []

        def set(self, value, tags):
            self.values.append(("set", value, tags))

        def inc(self, value, tags):
            self.values.append(("inc", value, tags))

    created = {}

    def factory(name, description, tag_keys):
        created[name] = Recorded(name, description, tag_keys)
        return created[name]

    with Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=256) as engine:
        published = ReplicaMetrics(ready_registry(st=engine), gauge=factory, counter=factory)
        engine.embed(["one", "two"])
        published.publish()
        engine.embed(["three"])
        published.publish()
        published.publish()  # nothing new: no increment
        stats = engine.stats.snapshot()
    assert set(created) == {figure.name for figure in ENGINE_FIGURES}  # what /metrics says of an engine
    tokens = created["encoderrt_tokens_processed"].values
    assert [kind for kind, _, _ in tokens] == ["inc", "inc"] and sum(v for _, v, _ in tokens) == stats["real_tokens"]
    assert all(tags == {"model": "st"} for _, _, tags in tokens)
    assert created["encoderrt_queue_depth"].values[-1] == ("set", 0, {"model": "st"})
