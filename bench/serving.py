"""Serving load test: Triton Inference Server (Python and C++ backends) and Ray Serve, batching on and off.

In: samples (samples/registry.py), optimized once each. Out: a markdown table of throughput and p50 /
p99 latency per engine and batching mode (printed), bench/results/serving.json and serving.png.

Each configuration gets the same load: `--clients` threads on this machine, each sending its share
of `--requests` requests back to back (closed loop, loopback only), every request at a shape drawn
from a small mixed set (batch 1-2; for a sample with a sequence dim, three lengths: only requests of
equal length may merge, Note [Serving batches]). Triton runs the Python backend (the torch-free
loader) and the C++ backend (libtriton_bladepack.so, from the release build of cpp_runtime/) in one
server, and is driven over HTTP with binary tensors
(tritonclient); Ray Serve through its Python handle (its native API; its HTTP route takes JSON). For
Triton, "requests per execution" comes from the server's own metrics (nv_inference_request_success /
nv_inference_exec_count), and "in the server per request" is Triton's own request duration (queue,
backend, responses: nv_inference_request_duration_us per request), free of the clients' cost. Every response is checked against the Python loader (to float32 rounding:
a merged call may sum in another order).

    python -m bench.serving [--samples mlp,encoder] [--clients 8] [--requests 400] [--engines triton,ray]

`--workload mixed` is the ragged-traffic test (Note [Padded merging] in bladepack/serving/batching.py):
a BERT-style encoder and a LLaMA-style decoder's prefill built from transformers configs (hidden 256,
4 layers, sequences up to 512), one sequence per request with its length drawn from a log-normal
(median 48 tokens, clipped to 8-512), 16 clients, Triton's two backends with merging off, merging of
equal shapes only, and padded merging at three pad budgets; bench/results/serving_mixed.{md,json}.

    python -m bench.serving --workload mixed [--clients 16] [--requests 400]

`--workload packed` runs the same traffic on both backends (CPU instances) three ways: merging off and
padded merging (budget 1.5) on the plan without its packed form, and packed merging (Note [Packed
merging]) with it; bench/results/serving_packed.{md,json}.

    python -m bench.serving --workload packed [--models encoder,decoder] [--clients 16] [--requests 400]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import bladepack
from bladepack.serving.v2_json import V2_DATATYPES
from samples.registry import SAMPLES
from tests.helpers import free_ports

RESULTS = Path(__file__).resolve().parent / "results"
QUEUE_DELAY_US = 0  # batch what is already queued when the instance frees: no idle wait under load


def _workload(name: str, count: int, seed: int = 0) -> list[list[np.ndarray]]:
    s = SAMPLES[name]
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    seqs = [5, 9, 16] if "seq" in s.base_dims else [None]
    cases = []
    for _ in range(count):
        dims = {**s.base_dims, "batch": int(rng.integers(1, 3))}
        seq = seqs[int(rng.integers(0, len(seqs)))]
        if seq is not None:
            dims["seq"] = seq
        cases.append([t.numpy() for t in s.make_inputs(g, **dims)])
    return cases


def _drive(call: Callable[[list[np.ndarray]], list[np.ndarray]], cases: list[list[np.ndarray]], clients: int) -> Any:
    """Closed-loop load: per request its latency (ms) and outputs; the wall time of the whole run."""
    lat: list[float] = [0.0] * len(cases)
    outs: list[Any] = [None] * len(cases)

    def worker(k0: int) -> None:
        for k in range(k0, len(cases), clients):
            t = time.perf_counter()
            outs[k] = call(cases[k])
            lat[k] = (time.perf_counter() - t) * 1e3

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lat, outs, time.perf_counter() - t0


def _row(
    engine: str, batching: str, lat: list[float], wall: float, per_exec: float | None, server_us: float | None = None
) -> dict[str, Any]:
    q = statistics.quantiles(lat, n=100)
    return {
        "engine": engine,
        "batching": batching,
        "requests": len(lat),
        "throughput_rps": len(lat) / wall,
        "p50_ms": q[49],
        "p99_ms": q[98],
        "requests_per_exec": per_exec,
        "server_us_per_request": server_us,
    }


def _check(outs: list[Any], cases: list[list[np.ndarray]], loader: Any) -> None:
    for got, arrays in zip(outs, cases):
        for g, w in zip(got, loader.run(arrays)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


# (label, dynamic batching, padding, pad budget: None for the device's): the default workload's modes,
# and the mixed-length one's
MODES: tuple[tuple[str, bool, bool, float | None], ...] = (("on", True, True, None), ("off", False, True, None))
MIXED_MODES: tuple[tuple[str, bool, bool, float | None], ...] = (
    ("off", False, True, None),
    ("equal shapes", True, False, None),
    ("padded, budget 1.1", True, True, 1.1),
    ("padded, budget 1.25", True, True, 1.25),
    ("padded, budget 1.5", True, True, 1.5),
)


def bench_triton(
    name: str,
    path: Path,
    cases: list[list[np.ndarray]],
    clients: int,
    modes: tuple[tuple[str, bool, bool, float | None], ...] = MODES,
    backends: tuple[str, ...] = ("python", "cpp"),
) -> list[dict[str, Any]]:
    import tritonclient.http as th

    from bladepack.serving.triton_repo import write_repository
    from bladepack.serving.triton_server import TritonServer
    from tests import cpp_build

    loader = bladepack.load(path)
    rows = []
    configs = [(f"{b}_{k}", b, m) for b in backends for k, m in enumerate(modes)]
    with tempfile.TemporaryDirectory() as repo:
        for model, backend, (_, batching, padding, budget) in configs:
            write_repository(
                path,
                repo,
                model,
                max_queue_delay_us=QUEUE_DELAY_US,
                dynamic_batching=batching,
                backend=backend,
                padding=padding,
                pad_budget=budget,
            )
        names = [t.name for t in loader.signature.inputs]
        cpp = cpp_build.build("release") / "libtriton_bladepack.so"
        with TritonServer(repo, *free_ports(3), cpp_backend=cpp) as server:
            local = threading.local()

            def infer(model: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
                client = getattr(local, "client", None)
                if client is None:
                    client = local.client = th.InferenceServerClient(server.http_url)
                ins = []
                for n, a in zip(names, arrays):
                    t = th.InferInput(n, list(a.shape), V2_DATATYPES[a.dtype.name])
                    t.set_data_from_numpy(a)
                    ins.append(t)
                r = client.infer(model, ins)
                return [r.as_numpy(o.name) for o in loader.signature.outputs]

            for model, backend, mode in configs:
                _drive(lambda a, m=model: infer(m, a), cases[:clients], clients)  # warm
                before = _counts(server.metrics_url, model)
                lat, outs, wall = _drive(lambda a, m=model: infer(m, a), cases, clients)
                after = _counts(server.metrics_url, model)
                _check(outs, cases, loader)
                served = max(after[0] - before[0], 1)
                per_exec = served / max(after[1] - before[1], 1)
                rows.append(
                    _row(f"triton ({backend} backend)", mode[0], lat, wall, per_exec, (after[2] - before[2]) / served)
                )
    return rows


def _counts(url: str, model: str) -> tuple[float, float, float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()

    def get(metric: str) -> float:
        m = re.search(rf'^{metric}{{model="{model}",version="1"}} (\S+)$', text, re.M)
        return float(m.group(1)) if m else 0.0

    return get("nv_inference_request_success"), get("nv_inference_exec_count"), get("nv_inference_request_duration_us")


def bench_ray(name: str, path: Path, cases: list[list[np.ndarray]], clients: int) -> list[dict[str, Any]]:
    import ray
    from ray import serve

    from bladepack.serving.ray import deployment

    loader = bladepack.load(path)
    rows = []
    ray.init(include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": free_ports(1)[0]})
        for mode, top in (("on", None), ("off", 1)):
            handle = serve.run(
                deployment(path, name=f"{name}_{mode}", max_batch_size=top, batch_wait_timeout_s=0.0005),
                name=f"{name}_{mode}",
                route_prefix=f"/{name}_{mode}",
            )

            def call(arrays: list[np.ndarray], h: Any = handle) -> list[np.ndarray]:
                return list(h.infer.remote(arrays).result(timeout_s=120))

            _drive(call, cases[:clients], clients)
            lat, outs, wall = _drive(call, cases, clients)
            _check(outs, cases, loader)
            rows.append(_row("ray serve (handle)", mode, lat, wall, None))
            serve.delete(f"{name}_{mode}")
    finally:
        serve.shutdown()
        ray.shutdown()
    return rows


def _mixed_model(kind: str) -> torch.nn.Module:
    import transformers as tf

    size = dict(vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
    if kind == "encoder":
        net: Any = tf.BertModel(tf.BertConfig(**size, max_position_embeddings=512), add_pooling_layer=False)
    else:
        net = tf.LlamaModel(tf.LlamaConfig(**size, num_key_value_heads=2, max_position_embeddings=512, use_cache=False))

    class Field(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net.eval()

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return self.net(input_ids=ids, attention_mask=mask).last_hidden_state  # type: ignore[no-any-return]

    return Field().eval()


def _mixed_lengths(count: int, seed: int = 0) -> list[int]:
    """Long-tailed request lengths: log-normal, median 48 tokens, clipped to 8-512."""
    rng = np.random.default_rng(seed)
    return [int(np.clip(round(float(rng.lognormal(np.log(48), 0.9))), 8, 512)) for _ in range(count)]


def _mixed_workload(args: argparse.Namespace) -> tuple[dict[str, Any], list[list[np.ndarray]]]:
    """The results record (machine, load, length percentiles) and one one-sequence request per length."""
    lengths = _mixed_lengths(args.requests)
    q = np.percentile(lengths, [50, 90, 99])
    from bench.cpp_runtime import machine

    results: dict[str, Any] = {
        "machine": machine(),
        "clients": args.clients,
        "requests": args.requests,
        "lengths": {"p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]), "max": max(lengths)},
        "samples": {},
    }
    g = torch.Generator().manual_seed(0)
    cases = [[torch.randint(3, 1000, (1, n), generator=g).numpy(), np.ones((1, n), np.int64)] for n in lengths]
    return results, cases


def mixed(args: argparse.Namespace) -> None:
    results, cases = _mixed_workload(args)
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("encoder", "decoder"):
            model = _mixed_model(kind)
            batch, seq = bladepack.Dim("batch", 1, 16), bladepack.Dim("seq", 1, 512)
            samples = [
                (torch.randint(3, 1000, (b, t)), torch.ones(b, t, dtype=torch.int64)) for b, t in ((2, 9), (3, 17))
            ]
            path = Path(tmp) / f"{kind}.bpk"
            t0 = time.perf_counter()
            art = bladepack.optimize(
                model, samples, {"ids": {0: batch, 1: seq}, "mask": {0: batch, 1: seq}}, reference_cases=False
            )
            print(f"{kind}: optimized in {time.perf_counter() - t0:.0f} s", flush=True)
            art.save(path)
            rows = bench_triton(kind, path, cases, args.clients, MIXED_MODES)
            off = {r["engine"]: r["throughput_rps"] for r in rows if r["batching"] == "off"}
            for r in rows:  # throughput over the same engine's with merging off
                r["vs_off"] = r["throughput_rps"] / off[r["engine"]]
                r["engine"] += f" ({r['vs_off']:.2f}x off)"
            results["samples"][kind] = rows
            print(f"\n{kind}\n{_table(rows)}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "serving_mixed.json").write_text(json.dumps(results, indent=1) + "\n")
    lq = results["lengths"]
    head = (
        f"{results['clients']} closed-loop clients, {results['requests']} requests per configuration, one sequence "
        f"each, lengths log-normal (p50 {lq['p50']:.0f}, p90 {lq['p90']:.0f}, p99 {lq['p99']:.0f}, max {lq['max']})"
    )
    out = [
        "# Mixed-length serving (`python -m bench.serving --workload mixed`)",
        "",
        f"Machine: {results['machine']}; {head}.",
        "",
    ]
    out += [
        "Each engine's throughput is also given over its own with merging off. Requests per execution is",
        "Triton's count per backend execute: the C++ backend reports each merged call, the Python backend",
        "one execute, whose requests it then groups by the pad budget itself.",
        "",
    ]
    for name, rows in results["samples"].items():
        out += [f"## {name} (hidden 256, 4 layers)", "", _table(rows), ""]
    (RESULTS / "serving_mixed.md").write_text("\n".join(out))


PACKED_MODES: tuple[tuple[str, bool, bool, float | None], ...] = (
    ("off", False, True, None),
    ("padded, budget 1.5", True, True, 1.5),
)


def packed_serving(args: argparse.Namespace) -> None:
    """The mixed workload on Triton's two backends (CPU instances): merging off and padded merging on the
    plain artifact, packed merging (Note [Packed merging]) on the same model optimized with packed=True;
    written to serving_packed.{json,md}."""
    results, cases = _mixed_workload(args)
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.models.split(","):
            model = _mixed_model(kind)
            batch, seq = bladepack.Dim("batch", 1, 16), bladepack.Dim("seq", 1, 512)
            samples = [
                (torch.randint(3, 1000, (b, t)), torch.ones(b, t, dtype=torch.int64)) for b, t in ((2, 9), (3, 17))
            ]
            dims = {"ids": {0: batch, 1: seq}, "mask": {0: batch, 1: seq}}
            path = Path(tmp) / f"{kind}.bpk"
            art = bladepack.optimize(model, samples, dims, reference_cases=False, packed=True)
            art.save(path)
            plain = Path(tmp) / f"{kind}_plain.bpk"
            art.packed = None  # the same plan without its packed form: merging as before
            art.save(plain)
            rows = bench_triton(kind, plain, cases, args.clients, PACKED_MODES)
            rows += bench_triton(kind, path, cases, args.clients, (("packed", True, True, None),))
            off = {r["engine"]: r["throughput_rps"] for r in rows if r["batching"] == "off"}
            for r in rows:  # throughput over the same backend's with merging off
                r["vs_off"] = r["throughput_rps"] / off[r["engine"]]
                r["engine"] += f" ({r['vs_off']:.2f}x off)"
            results["samples"][kind] = rows
            print(f"\n{kind}\n{_table(rows)}", flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "serving_packed.json").write_text(json.dumps(results, indent=1) + "\n")
    lq = results["lengths"]
    out = [
        "# Packed merging in Triton's backends (`python -m bench.serving --workload packed`)",
        "",
        f"Machine: {results['machine']}; {results['clients']} closed-loop clients, {results['requests']} requests per "
        f"configuration, one sequence each, lengths log-normal (p50 {lq['p50']:.0f}, p90 {lq['p90']:.0f}, "
        f"p99 {lq['p99']:.0f}, max {lq['max']}). Off and padded merging run the plan without its packed form; packed "
        "runs the same plan with it (Note [Packed merging]).",
        "",
    ]
    for name, rows in results["samples"].items():
        out += [f"## {name} (hidden 256, 4 layers)", "", _table(rows), ""]
    (RESULTS / "serving_packed.md").write_text("\n".join(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--samples", default="mlp,encoder")
    p.add_argument("--clients", type=int, default=None)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--engines", default="triton,ray")
    p.add_argument("--workload", choices=("samples", "mixed", "packed"), default="samples")
    p.add_argument("--models", default="encoder,decoder", help="--workload packed: which mixed models")
    args = p.parse_args()
    if args.workload == "packed":
        args.clients = args.clients or 16
        packed_serving(args)
        return
    if args.workload == "mixed":
        args.clients = args.clients or 16
        mixed(args)
        return
    args.clients = args.clients or 8
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads",
        "clients": args.clients,
        "requests": args.requests,
        "samples": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.samples.split(","):
            s = SAMPLES[name]
            path = Path(tmp) / f"{name}.bpk"
            bladepack.optimize(s.build().eval(), s.export_samples(), s.dynamic_shapes).save(path)
            cases = _workload(name, args.requests)
            rows: list[dict[str, Any]] = []
            if "triton" in args.engines:
                rows += bench_triton(name, path, cases, args.clients)
            if "ray" in args.engines:
                rows += bench_ray(name, path, cases, args.clients)
            results["samples"][name] = rows
            print(f"\n{name}")
            print(_table(rows))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "serving.json").write_text(json.dumps(results, indent=1) + "\n")
    (RESULTS / "serving.md").write_text(_markdown(results))
    _chart(results, RESULTS / "serving.png")


def _table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| engine | merging | throughput (req/s) | p50 (ms) | p99 (ms) | requests per execution "
        "| in the server per request (µs) |"
    )
    lines = [head, "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        per = "" if r["requests_per_exec"] is None else f"{r['requests_per_exec']:.2f}"
        inside = "" if r.get("server_us_per_request") is None else f"{r['server_us_per_request']:.0f}"
        lines.append(
            f"| {r['engine']} | {r['batching']} | {r['throughput_rps']:.0f} | {r['p50_ms']:.2f} | "
            f"{r['p99_ms']:.2f} | {per} | {inside} |"
        )
    return "\n".join(lines)


def _markdown(results: dict[str, Any]) -> str:
    out = [
        "# Serving load test (`python -m bench.serving`)",
        "",
        f"Machine: {results['machine']}; {results['clients']} closed-loop clients on the same machine, "
        f"{results['requests']} requests per configuration, batch 1-2 per request, loopback.",
        "",
    ]
    for name, rows in results["samples"].items():
        out += [f"## {name}", "", _table(rows), ""]
    return "\n".join(out)


def _chart(results: dict[str, Any], path: Path) -> None:
    try:  # the chart is optional: matplotlib is not among the dev dependencies
        import matplotlib
    except ImportError:
        print("no chart: matplotlib is not installed")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["samples"])
    fig, axes = plt.subplots(1, len(names), figsize=(8 * len(names), 4.5), squeeze=False)
    for ax, name in zip(axes[0], names):
        rows = results["samples"][name]
        labels = [
            f"{r['engine'].replace(' backend', '').replace(' (handle)', '')}\nbatching {r['batching']}" for r in rows
        ]
        colors = ["#4c72b0", "#9bb0d6", "#55a868", "#a8d5b5", "#dd8452", "#f0c0a0"]
        ax.bar(labels, [r["throughput_rps"] for r in rows], color=colors[: len(rows)])
        for k, r in enumerate(rows):
            ax.text(
                k,
                r["throughput_rps"],
                f"p50 {r['p50_ms']:.1f} ms\np99 {r['p99_ms']:.1f} ms",
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_title(f"{name}: throughput, {results['clients']} clients")
        ax.set_ylabel("requests / s")
        ax.margins(y=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
