"""`bladepack triton-repo` and `bladepack serve`: the command-line side of serving.

In: parsed arguments. Out: a model repository on disk, or a running server (Triton Inference Server
or a local Ray Serve) that prints its endpoints and stops cleanly on SIGINT / SIGTERM (exit 0). A
Triton server that dies is restarted (Note [Supervised server] in serving/triton_server.py: a line on
stderr names how it ended); exit 1 when it dies too often or cannot be restarted, with its log's last
lines. `--sha256` / `--trusted-key` say which artifacts the server may load (serving/trust.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bladepack.errors import BladepackError


def add_commands(sub: Any) -> None:
    pt = sub.add_parser("triton-repo", help="write a Triton Inference Server model repository for an artifact")
    pt.add_argument("model", help="the .bpk artifact")
    pt.add_argument("out_dir", help="the model repository (created; other models in it are kept)")
    _model_options(pt)
    pt.add_argument("--force", action="store_true", help="replace OUT_DIR/NAME if it exists")
    pt.set_defaults(fn=_triton_repo)
    ps = sub.add_parser("serve", help="serve an artifact over HTTP / gRPC (Triton) or HTTP (Ray Serve)")
    ps.add_argument("model", help="the .bpk artifact")
    ps.add_argument("--engine", choices=("triton", "ray"), default="triton")
    _model_options(ps)
    ps.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: loopback only)")
    ps.add_argument("--http-port", type=int, default=8000)
    ps.add_argument("--grpc-port", type=int, default=8001, help="Triton only")
    ps.add_argument("--metrics-port", type=int, default=8002, help="Triton only")
    ps.add_argument("--tritonserver", help="the tritonserver binary (default: BLADEPACK_TRITONSERVER, PATH, the wheel)")
    ps.add_argument(
        "--cpp-backend", help="libtriton_bladepack.so for --backend cpp (default: BLADEPACK_TRITON_BACKEND)"
    )
    ps.add_argument("--replicas", type=int, default=1, help="Ray Serve replicas (default 1)")
    ps.set_defaults(fn=_serve)


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", help="the model's name (default: the artifact's file name without .bpk)")
    p.add_argument("--sha256", help="serve the file only if its SHA-256 is this (hex); every instance checks it")
    p.add_argument(
        "--trusted-key",
        action="append",
        default=[],
        metavar="KEY",
        help="serve it only if signed by this Ed25519 public key (hex, PEM or a .pub file); may repeat",
    )
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--instances", type=int, default=1, help="Triton model instances (default 1)")
    p.add_argument("--max-queue-delay-us", type=int, default=100, help="dynamic batching's queue delay")
    p.add_argument("--max-batch-size", type=int, help="cap the server's batch (default: the batch dim's maximum)")
    p.add_argument("--no-batching", action="store_true", help="no dynamic batching: each request runs alone")
    p.add_argument(
        "--pad-budget",
        type=float,
        help="how far a merged group of requests of different lengths may be padded: its padded size over "
        "its real size, at least 1 (default 1.5 on a GPU, 1 on a CPU: Note [Padded merging])",
    )
    p.add_argument(
        "--no-padding",
        action="store_true",
        help="merge requests only when their shapes agree (no padding to the longest along a proven paddable dim)",
    )
    p.add_argument(
        "--backend",
        choices=("python", "cpp"),
        default="python",
        help="Triton backend: python (the torch-free loader; CPU or GPU) or cpp (libtriton_bladepack.so on the C++ runtime, no Python in the server; CPU or GPU)",
    )


def _triton_repo(args: argparse.Namespace) -> int:
    from bladepack.serving.triton_repo import write_repository

    config = write_repository(
        args.model,
        args.out_dir,
        args.name,
        args.device,
        args.instances,
        args.max_queue_delay_us,
        args.max_batch_size,
        overwrite=args.force,
        dynamic_batching=not args.no_batching,
        backend=args.backend,
        trust=_trust(args),
        padding=not args.no_padding,
        pad_budget=args.pad_budget,
    )
    print(f"wrote {Path(args.out_dir) / config.name}: {_batching(config)}")
    return 0


def _trust(args: argparse.Namespace) -> Any:
    from bladepack.serving.trust import ServingTrust

    return ServingTrust.of(args.sha256, args.trusted_key)


def _batching(config: Any) -> str:
    if config.dynamic_batching:
        padded = "".join(f"; requests of different {d.dim!r} padded to the longest" for d in config.layout.padded)
        return f"dynamic batching along {config.layout.dim!r}, up to {config.max_batch_size}{padded}"
    if config.max_batch_size:
        return "dynamic batching off (--no-batching)"
    return f"no server-side batching ({config.layout.reason})"


def _stop_on_signal() -> threading.Event:
    """An event SIGINT / SIGTERM set from now on (installed before the server starts, so a signal
    during start-up stops it cleanly too)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _wait(stop: threading.Event, alive: Callable[[], bool]) -> bool:
    """Block until `stop` is set (True) or `alive()` turns False (False)."""
    while not stop.is_set():
        if not alive():
            return False
        stop.wait(0.5)
    return True


def _serve(args: argparse.Namespace) -> int:
    if args.engine == "ray" and args.backend != "python":  # wrong whatever is installed: said first
        raise BladepackError("--backend chooses Triton's backend; Ray Serve replicas run the Python loader")
    need = ("ray", "ray") if args.engine == "ray" else ("tritonclient", "serve")
    if importlib.util.find_spec(need[0]) is None:
        raise BladepackError(f"serving with {args.engine} needs {need[0]}: pip install 'bladepack[{need[1]}]'")
    return _serve_ray(args) if args.engine == "ray" else _serve_triton(args)


def _serve_triton(args: argparse.Namespace) -> int:
    from bladepack.options import ServeOptions
    from bladepack.serving.triton_repo import write_repository
    from bladepack.serving.triton_server import TritonServer, find_cpp_backend

    found = ServeOptions.from_env()
    stop = _stop_on_signal()
    with tempfile.TemporaryDirectory(prefix="bladepack-repo-") as repo:
        config = write_repository(
            args.model,
            repo,
            args.name,
            args.device,
            args.instances,
            args.max_queue_delay_us,
            args.max_batch_size,
            dynamic_batching=not args.no_batching,
            backend=args.backend,
            trust=_trust(args),
            padding=not args.no_padding,
            pad_budget=args.pad_budget,
        )
        cpp = find_cpp_backend(args.cpp_backend or found.cpp_backend) if args.backend == "cpp" else None
        binary = args.tritonserver or found.tritonserver
        server = TritonServer(
            repo, args.http_port, args.grpc_port, args.metrics_port, args.host, binary, cpp_backend=cpp
        )
        try:
            server.start()
            name = config.name
            backend = "C++ backend" if args.backend == "cpp" else "Python backend"
            print(f"serving {name} with Triton Inference Server, {backend} ({server.install.where})", flush=True)
            print(f"  {_batching(config)}")
            print(f"  HTTP     http://{server.http_url}/v2/models/{name}/infer")
            print(f"  gRPC     {server.grpc_url} (model {name!r})")
            print(f"  metrics  {server.metrics_url}")
            print("  stop with Ctrl-C or SIGTERM", flush=True)
            if not server.supervise(stop, lambda line: print(f"bladepack: {line}", file=sys.stderr, flush=True)):
                print(server.log_tail(), file=sys.stderr)
                return 1
            print("stopping", flush=True)
            return 0
        finally:
            server.stop()
            server.cleanup()


def _serve_ray(args: argparse.Namespace) -> int:
    import ray
    from ray import serve

    from bladepack.serving.ray import deployment

    app = deployment(
        args.model,
        name=args.name,
        num_replicas=args.replicas,
        device=args.device,
        max_batch_size=1 if args.no_batching else args.max_batch_size,
        padding=not args.no_padding,
        pad_budget=args.pad_budget,
        batch_wait_timeout_s=args.max_queue_delay_us / 1e6,
        sha256=args.sha256,
        trusted_keys=args.trusted_key or None,
    )
    name = args.name or Path(args.model).stem
    stop = _stop_on_signal()
    ray.init(include_dashboard=False)
    try:
        serve.start(http_options={"host": args.host, "port": args.http_port})
        serve.run(app, name=name, route_prefix=f"/{name}")
        print(f"serving {name} with Ray Serve ({args.replicas} replica(s))", flush=True)
        print(f"  HTTP     http://{args.host}:{args.http_port}/{name} (KServe v2 JSON body)")
        print("  stop with Ctrl-C or SIGTERM", flush=True)
        _wait(stop, lambda: True)
        print("stopping", flush=True)
        return 0
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
