"""Ray Serve's HAProxy left behind by a cluster that died.

HAProxy runs in a process group of its own, so a `serve --ray` killed outright (SIGKILL, the OOM killer) leaves
it holding its stats and metrics ports (8404 and 9101) and the HTTP port. The next `serve --ray` then never
becomes healthy: its HAProxy cannot bind ("Address already in use") and nothing says so. Before a new local
cluster starts, a listener on those ports is cleared if it is an HAProxy and no Ray cluster runs on this machine
(it can belong to no one); anything else holding them is refused in one line naming the PID and the port.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

STATS_PORT_VARIABLE = "RAY_SERVE_HAPROXY_STATS_PORT"
METRICS_PORT_VARIABLE = "RAY_SERVE_HAPROXY_METRICS_PORT"
EXIT_WAIT_S = 10.0
"""How long a stale HAProxy may take to exit after SIGTERM before it is killed."""


def haproxy_ports(http_port: int) -> dict[int, str]:
    """The ports a local Serve's HAProxy binds, each with the setting that moves it."""
    return {http_port: "--port", int(os.environ.get(STATS_PORT_VARIABLE, "8404")): STATS_PORT_VARIABLE,
            int(os.environ.get(METRICS_PORT_VARIABLE, "9101")): METRICS_PORT_VARIABLE}


def listeners(ports: set[int], proc: Path = Path("/proc")) -> dict[int, int]:
    """port -> PID of the process listening on it (TCP, IPv4 or IPv6), for the ports that have one."""
    inodes: dict[str, int] = {}
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (proc / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if fields[3] == "0A" and port in ports:  # 0A: LISTEN
                inodes[f"socket:[{fields[9]}]"] = port
    found: dict[int, int] = {}
    if not inodes:
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                port = inodes.get(os.readlink(fd))
                if port is not None:
                    found.setdefault(port, int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def program(pid: int, proc: Path = Path("/proc")) -> str:
    """The name a process runs under: its argv[0]'s base name, else its comm."""
    try:
        argv0 = (proc / str(pid) / "cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        return Path(argv0).name or (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        return "?"


def ray_cluster_running(proc: Path = Path("/proc")) -> bool:
    """Whether a Ray cluster's head (its GCS server) runs on this machine."""
    return any(program(int(entry.name), proc) == "gcs_server" for entry in proc.iterdir() if entry.name.isdigit())


def clear_stale_proxy(http_port: int, proc: Path = Path("/proc")) -> list[str]:
    """Stop an HAProxy that no Ray cluster owns on the ports a new local Serve needs; what was cleared, in words.
    A ValueError names any other holder of those ports (its PID, its program and the port)."""
    ports = haproxy_ports(http_port)
    held = listeners(set(ports), proc)
    cleared = []
    names = {pid: program(pid, proc) for pid in held.values()}
    owned = "haproxy" in names.values() and ray_cluster_running(proc)  # one scan of /proc, and only if it matters
    for port, pid in sorted(held.items()):
        name = names[pid]
        if name != "haproxy" or owned:
            owner = "a Ray cluster that is still running" if name == "haproxy" else "another program"
            raise ValueError(f"port {port}, which Ray Serve's HAProxy needs, is held by PID {pid} ({name}, "
                             f"{owner}): stop it, or move the port ({ports[port]})")
        _stop(pid, proc)
        cleared.append(f"stopped HAProxy PID {pid}, left behind by a Ray cluster that is gone, which held port {port}")
    return cleared


def _stop(pid: int, proc: Path = Path("/proc")) -> None:
    """SIGTERM, then SIGKILL if it has not exited within EXIT_WAIT_S (an exited child not yet reaped counts as
    exited: its sockets are closed)."""
    deadline = time.monotonic() + EXIT_WAIT_S
    try:
        os.kill(pid, signal.SIGTERM)
        while _alive(pid, proc):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.05)
    except ProcessLookupError:
        return


def _alive(pid: int, proc: Path) -> bool:
    try:
        state = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
