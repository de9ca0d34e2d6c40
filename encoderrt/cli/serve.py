"""`encoderrt serve`: artifact or model folders over HTTP in every dialect."""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

from encoderrt.cli import common
from encoderrt.compile.cache import BUNDLED_NAME
from encoderrt.deploy.settings import RaySettings
from encoderrt.runtime import settings
from encoderrt.runtime.config import EngineConfig
from encoderrt.server.loading import ModelSpec, model_path
from encoderrt.server.settings import ConnectionLimits, ServerSettings

HELP = "serve models over HTTP (OpenAI, vLLM, Cohere/Jina, TEI APIs)"
MODELS_ENV = settings.ENV_PREFIX + "MODELS"
"""MODEL where a command line is awkward (a container): the flags' variables are generated (runtime/settings.py)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag but MODEL and --ray is generated from a settings declaration (runtime/settings.py)."""
    models = os.environ.get(MODELS_ENV)
    parser.add_argument("models", nargs="*", type=Path, metavar="MODEL",
                        default=[Path(m) for m in models.split(",")] if models else [],
                        help=f"artifact or model folders (default: the bundled all-MiniLM-L6-v2; env {MODELS_ENV}, "
                             "comma-separated)")
    settings.add_arguments(parser.add_argument_group("server"), ServerSettings)
    settings.add_arguments(parser.add_argument_group("per model (repeat, in the order of the MODELs)"), ModelSpec)
    settings.add_arguments(parser.add_argument_group("engine (per model)"), EngineConfig)
    settings.add_arguments(parser.add_argument_group("connections"), ConnectionLimits)
    ray = parser.add_argument_group("scale-out on Ray Serve")
    ray.add_argument("--ray", action="store_true",
                     help="serve replicas on Ray Serve (pip install 'encoderrt[ray]'); see --replicas, --autoscale")
    settings.add_arguments(ray, RaySettings)


def run(args: argparse.Namespace) -> int:
    from encoderrt.server.loading import plan_models
    from encoderrt.server.runner import run_server

    console = common.console()
    paths = [model_path(p) for p in args.models] or [None]
    per_model = {item.name: getattr(args, item.name) for item in settings.declared(ModelSpec)}
    try:
        specs = ModelSpec.each(paths, per_model)
        server = settings.from_arguments(ServerSettings, args, engine=settings.from_arguments(EngineConfig, args),
                                         connections=settings.from_arguments(ConnectionLimits, args))
        if args.ray:
            return _serve_on_ray(args, server, per_model, console)
        if ray_only := [item.given_as() for item in settings.changed(settings.from_arguments(RaySettings, args))]:
            raise ValueError(common.applies_to(ray_only, "serving on Ray Serve (--ray)"))
        # every path, name and the port are checked before anything compiles or binds
        models = plan_models(specs)
        _check_port(server.host, server.port)
        common.offline_and_quiet()
        return run_server(server, models)
    except ValueError as exc:
        common.error(console, str(exc))
        return 2
    except KeyboardInterrupt:
        console.print("[red]interrupted[/]")
        return 130


def _serve_on_ray(args: argparse.Namespace, server: ServerSettings, per_model: dict[str, list], console) -> int:
    """Ray's proxy holds the connections and drains the replicas, so the process settings (other than where to
    listen) do not apply; every app setting travels to the replicas as the Serve config's arguments would."""
    try:
        from encoderrt.deploy import ray as on_ray
        from encoderrt.deploy.stale_proxy import clear_stale_proxy
    except ImportError as exc:
        common.error(console, f"--ray needs Ray Serve: pip install 'encoderrt[ray]' ({exc})")
        return 2
    ignored = [item.flag for item in (*settings.changed(server, in_app=False), *settings.changed(server.connections))
               if item.name not in ("host", "port")]
    if ignored:
        raise ValueError(f"with --ray, Ray's proxy holds the connections and drains the replicas: {', '.join(ignored)} "
                         "do not apply (configure Ray Serve's proxy instead)")
    ray_settings = settings.from_arguments(RaySettings, args)
    options = on_ray.RayAppArgs.from_settings([str(p) for p in args.models] or [BUNDLED_NAME], per_model,
                                              server.engine, server, ray_settings)
    on_ray.check_scaling(options)  # before the proxy's ports: another cluster holding them is not the problem
    if ray_settings.ray_address is None and not os.environ.get("RAY_ADDRESS"):
        on_ray.use_haproxy()  # a new local cluster: its proxy's ports must be free
        for cleared in clear_stale_proxy(server.port):
            console.print(cleared)
    _check_port(server.host, server.port)
    common.offline_and_quiet()
    return on_ray.run(options, server.host, server.port, ray_settings.ray_address)


def _check_port(host: str, port: int) -> None:
    """A taken port found now, not after the first model has compiled (uvicorn binds after start-up)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"--host {host}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
