"""`serve --ray` says aloud what Ray would do silently: replicas the cluster cannot place are refused (or warned
about) with the numbers, and an HAProxy left behind by a killed cluster is cleared, or its port named."""

import socket
import subprocess
import sys

import pytest

from encoderrt.deploy.ray import check_placement
from encoderrt.deploy.settings import RayAppArgs
from encoderrt.deploy.stale_proxy import METRICS_PORT_VARIABLE, STATS_PORT_VARIABLE, clear_stale_proxy, listeners
from server_helpers import free_port


def _options(**args):
    return RayAppArgs.model_validate({"models": "m", **args})


def test_more_replicas_than_the_cluster_can_place_are_refused_with_the_numbers():
    with pytest.raises(ValueError) as refused:
        check_placement(_options(replicas=2), cluster_cpus=2)  # 2 replicas x 2 CPUs each (the default) on 2 CPUs
    said = str(refused.value)
    assert "--replicas 2: 2 replicas x 2 CPUs each (--cpus-per-replica) need 4 CPUs" in said
    assert "this Ray cluster has 2" in said and "1 of them pending" in said
    assert check_placement(_options(replicas=2, cpus_per_replica=1), cluster_cpus=2) == []
    with pytest.raises(ValueError, match="autoscaling's minimum of 3: 3 replicas"):
        check_placement(_options(autoscale="3:4", cpus_per_replica=1), cluster_cpus=2)
    (warning,) = check_placement(_options(autoscale="1:4", cpus_per_replica=1), cluster_cpus=2)
    assert "maximum of 4: 4 replicas" in warning and "need 4 CPUs" in warning and "past 2 replicas" in warning
    with pytest.raises(ValueError, match="cpus_per_replica must be above 0"):
        check_placement(_options(cpus_per_replica=0), cluster_cpus=2)


def _listener(name: str, port: int) -> subprocess.Popen:
    """A process whose argv[0] is `name`, listening on `port` in a session of its own (as Ray starts HAProxy)."""
    code = ("import socket, sys, time\n"
            "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            f"s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True); time.sleep(600)\n")
    process = subprocess.Popen(["bash", "-c", f'exec -a {name} "{sys.executable}" -c "$0"', code],
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert process.stdout.readline().strip() == "up"
    return process


@pytest.fixture
def proxy_ports(monkeypatch):
    stats, metrics = free_port(), free_port()
    monkeypatch.setenv(STATS_PORT_VARIABLE, str(stats))
    monkeypatch.setenv(METRICS_PORT_VARIABLE, str(metrics))
    return stats, metrics


def test_an_haproxy_no_cluster_owns_is_cleared(proxy_ports, monkeypatch):
    monkeypatch.setattr("encoderrt.deploy.stale_proxy.ray_cluster_running", lambda proc=None: False)
    stats, _ = proxy_ports
    stale = _listener("haproxy", stats)
    try:
        assert listeners({stats}) == {stats: stale.pid}
        (said,) = clear_stale_proxy(free_port())
        assert f"PID {stale.pid}" in said and f"port {stats}" in said
        assert stale.wait(10) is not None
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", stats))  # free again
    finally:
        stale.kill()


@pytest.mark.parametrize(("program", "cluster_running", "owner"), [
    ("some-daemon", False, "another program"),
    ("haproxy", True, "a Ray cluster that is still running"),
])
def test_a_holder_that_is_no_stale_proxy_is_named_not_killed(proxy_ports, monkeypatch, program, cluster_running, owner):
    monkeypatch.setattr("encoderrt.deploy.stale_proxy.ray_cluster_running", lambda proc=None: cluster_running)
    _, metrics = proxy_ports
    holder = _listener(program, metrics)
    try:
        with pytest.raises(ValueError) as refused:
            clear_stale_proxy(free_port())
        said = str(refused.value)
        assert f"port {metrics}" in said and f"PID {holder.pid} ({program}, {owner})" in said
        assert METRICS_PORT_VARIABLE in said and holder.poll() is None
    finally:
        holder.kill()
