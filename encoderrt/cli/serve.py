"""`encoderrt serve`: artifact or model folders over HTTP in every dialect."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from encoderrt.cli import common
from encoderrt.compile.cache import BUNDLED_NAME

HELP = "serve models over HTTP (OpenAI, vLLM, Cohere/Jina, TEI APIs)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="*", type=Path, metavar="MODEL",
                        help="artifact or model folders (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", action="append", default=[], metavar="NAME",
                        help="name of each MODEL in requests' `model` field, in order (repeat per model)")
    parser.add_argument("--default-prompt-name", action="append", default=[], metavar="NAME",
                        help="prompt each MODEL applies by default, in order (repeat per model; '' for none)")
    parser.add_argument("--long-inputs", choices=["truncate", "chunk"], default="truncate",
                        help="embedding inputs past the model's limit: cut (default) or embed in chunks and average")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every API route")
    parser.add_argument("--max-batch-tokens", type=int, default=None, metavar="N", help="token budget (default: calibrated)")
    parser.add_argument("--max-queue", type=int, default=8192, metavar="N", help="items waiting per model before 429")
    parser.add_argument("--max-queue-seconds", type=float, default=5.0, metavar="S",
                        help="work waiting per model, in seconds at the measured throughput, before 429 ('inf': no limit)")
    parser.add_argument("--max-client-batch-size", type=int, default=512, metavar="N", help="most items per request")
    parser.add_argument("--max-token-embeddings", type=int, default=8192, metavar="N",
                        help="most token vectors one /embed_all request returns; above it, 413")
    parser.add_argument("--max-body-bytes", type=int, default=2 * 1024 * 1024, metavar="N")
    parser.add_argument("--max-header-bytes", type=int, default=32 * 1024, metavar="N",
                        help="largest request head (request line and headers); above it, 431")
    parser.add_argument("--max-connections", type=int, default=512, metavar="N",
                        help="open connections at most; a request on one above it gets 503 with Retry-After")
    parser.add_argument("--request-read-timeout", type=float, default=30.0, metavar="S",
                        help="a request's head, then its body, must each arrive within S seconds; otherwise 408")
    parser.add_argument("--keep-alive-timeout", type=float, default=5.0, metavar="S",
                        help="idle keep-alive connections close after S seconds (set it above a load balancer's)")
    parser.add_argument("--ray", action="store_true",
                        help="serve replicas on Ray Serve (pip install 'encoderrt[ray]'); see --replicas, --autoscale")
    parser.add_argument("--replicas", type=int, default=1, metavar="N", help="with --ray: replicas to run")
    parser.add_argument("--autoscale", default=None, metavar="MIN:MAX",
                        help="with --ray: scale between MIN and MAX replicas on ongoing requests")
    parser.add_argument("--ray-address", default=None, metavar="ADDR",
                        help="with --ray: the cluster to join (default: RAY_ADDRESS's, or a new local one)")
    parser.add_argument("--shutdown-timeout", type=float, default=30.0, metavar="S",
                        help="on SIGTERM, how long in-flight requests may finish; those still running get a 503")


if TYPE_CHECKING:
    from encoderrt.server.settings import ServerSettings


def run(args: argparse.Namespace) -> int:
    from encoderrt.runtime.config import EngineConfig
    from encoderrt.server.loading import ModelSpec, plan_models
    from encoderrt.server.runner import run_server
    from encoderrt.server.settings import ConnectionLimits, ServerSettings

    console = common.console()
    # the bundled model by its name, unless a folder of that name is here
    paths = [None if str(p) == BUNDLED_NAME and not p.exists() else p for p in args.models] or [None]
    names = args.served_model_name
    if len(names) > len(paths):
        common.error(console, f"{len(names)} --served-model-name values for {len(paths)} models")
        return 2
    prompts = args.default_prompt_name
    if len(prompts) > len(paths):
        common.error(console, f"{len(prompts)} --default-prompt-name values for {len(paths)} models")
        return 2
    try:
        engine = EngineConfig(max_batch_tokens=args.max_batch_tokens, max_queue_items=args.max_queue,
                              max_queue_seconds=args.max_queue_seconds, max_token_embeddings=args.max_token_embeddings,
                              long_inputs=args.long_inputs)
        connections = ConnectionLimits(max_header_bytes=args.max_header_bytes, max_connections=args.max_connections,
                                       read_timeout_s=args.request_read_timeout, keep_alive_s=args.keep_alive_timeout)
        settings = ServerSettings(host=args.host, port=args.port, api_key=args.api_key, max_body_bytes=args.max_body_bytes,
                                  max_client_batch_size=args.max_client_batch_size, engine=engine,
                                  connections=connections, graceful_shutdown_s=args.shutdown_timeout)
    except ValueError as exc:
        common.error(console, str(exc))
        return 2
    specs = [ModelSpec(path, names[i] if i < len(names) else None, prompts[i] if i < len(prompts) else None)
             for i, path in enumerate(paths)]
    if args.ray:
        return _serve_on_ray(args, settings, console)
    try:  # every path, name and the port are checked before anything compiles or binds
        models = plan_models(specs)
        _check_port(settings.host, settings.port)
        common.offline_and_quiet()
        return run_server(settings, models)
    except ValueError as exc:
        common.error(console, str(exc))
        return 2
    except KeyboardInterrupt:
        console.print("[red]interrupted[/]")
        return 130


def _serve_on_ray(args: argparse.Namespace, settings: ServerSettings, console) -> int:
    from encoderrt.server.settings import ConnectionLimits, ServerSettings

    try:
        from encoderrt.deploy import ray as on_ray
    except ImportError as exc:
        common.error(console, f"--ray needs Ray Serve: pip install 'encoderrt[ray]' ({exc})")
        return 2
    if settings.connections != ConnectionLimits() or settings.graceful_shutdown_s != ServerSettings().graceful_shutdown_s:
        common.error(console, "with --ray, Ray's proxy holds the connections and drains the replicas: "
                            "--max-header-bytes, --max-connections, --request-read-timeout, --keep-alive-timeout and "
                            "--shutdown-timeout do not apply (configure Ray Serve's proxy instead)")
        return 2
    try:
        engine = settings.engine
        options = on_ray.RayAppArgs(models=[str(p) for p in args.models] or [BUNDLED_NAME],
                                    served_model_names=args.served_model_name, replicas=args.replicas,
                                    autoscale=args.autoscale, api_key=args.api_key,
                                    default_prompt_names=args.default_prompt_name,
                                    max_batch_tokens=engine.max_batch_tokens, max_queue=engine.max_queue_items,
                                    max_queue_seconds=engine.max_queue_seconds, long_inputs=engine.long_inputs,
                                    max_token_embeddings=engine.max_token_embeddings,
                                    max_client_batch_size=settings.max_client_batch_size,
                                    max_body_bytes=settings.max_body_bytes)
        _check_port(args.host, args.port)
        common.offline_and_quiet()
        return on_ray.run(options, args.host, args.port, args.ray_address)
    except ValueError as exc:
        common.error(console, str(exc))
        return 2


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
