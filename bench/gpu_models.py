"""GPU benchmark of real-size models: bladepack against eager, torch.compile (three modes) and AOTInductor.

Needs a CUDA GPU (H100 / H200). Every model is built on the GPU machine from a transformers config (or,
for the decode step, this file's own LLaMA-style stack) with random weights, so nothing downloads and
nothing travels; all run in float16:
- bert: BERT-base (12 layers, 768 wide, 110M parameters), batch 1-32 x sequence 16-512, padding mask;
- vit: ViT-B/16 (86M) at 224 x 224 and 384 x 384 (position embeddings interpolated), batch 1-32;
- resnet50: ResNet-50 (25.6M, transformers' ResNetModel), batch 1-64 at 224 x 224;
- llama: a 1.1B LLaMA-style decoder (TinyLlama's shape: 22 layers, 2048 wide, 32 heads over 4 KV heads,
  5632-wide MLP), prefill of 128-2048 tokens;
- llama-decode: one decode step of the same shape with its KV caches (128-4096 positions, batch 1-32)
  as inputs, returning the hidden state and the step's new keys and values.
Peers in this one process: eager, torch.compile(dynamic=True) ("compile"), mode="reduce-overhead"
("reduce-overhead"), mode="max-autotune-no-cudagraphs" ("max-autotune"), AOTInductor with the same
dynamic dims ("aoti"). Per shape: our time (CUDA events around back-to-back calls, best of three rounds
with the order rotated), each peer's time over ours, our host time per call (the wall time of enqueueing
one call: above the GPU time, the GPU waits for the host), and the error against float32 eager on the
GPU; per runner its build or compile time. A peer that fails or would not fit the time left is reported
with its reason, never dropped silently. Out: bench/results/gpu_models_<device>.{md,json}.

    python -m bench.gpu_models [--models bert,llama-decode] [--peers eager,compile] [--budget 480]
    python -m bench.gpu_models --dry-run     # no GPU: build miniature versions for a CUDA target
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import bladepack
from bench.cuda_samples import _time_us, save_results
from samples.zoo import ZooModel, _field

ROUNDS = 3
PEERS = ("eager", "compile", "reduce-overhead", "max-autotune", "aoti")
DTYPE = torch.float16
Inputs = tuple[torch.Tensor, ...]


def _tf() -> Any:
    import transformers

    return transformers


@dataclass(frozen=True)
class Size:
    """The full model's config and a miniature one for --dry-run."""

    full: dict[str, Any]
    tiny: dict[str, Any]


# --------------------------------------------------------------------------- models


def _text(vocab: int) -> Callable[[torch.Generator, tuple[int, ...]], Inputs]:
    def make(g: torch.Generator, size: tuple[int, ...]) -> Inputs:
        b, t = size
        ids = torch.randint(3, vocab, (b, t), generator=g)
        mask = torch.ones(b, t, dtype=torch.int64)
        if b > 1:
            mask[0, (t + 1) // 2 :] = 0  # a right-padded first row
        return ids, mask

    return make


def _images(g: torch.Generator, size: tuple[int, ...]) -> Inputs:
    b, h, w = size if len(size) == 3 else (size[0], 224, 224)
    return (torch.randn(b, 3, h, w, generator=g),)


BERT = Size({}, dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128))
VIT = Size({}, dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128))
RESNET = Size({}, dict(embedding_size=16, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1]))
LLAMA = Size(
    dict(
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=32000,
        max_position_embeddings=4352,
    ),
    dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=96,
        max_position_embeddings=4352,
    ),
)


def _bert(tiny: bool) -> nn.Module:
    model = _tf().BertModel(_tf().BertConfig(**(BERT.tiny if tiny else BERT.full)), add_pooling_layer=False)
    return _field(model.eval(), ("input_ids", "attention_mask"), "last_hidden_state")


def _vit(tiny: bool) -> nn.Module:
    model = _tf().ViTModel(_tf().ViTConfig(**(VIT.tiny if tiny else VIT.full)), add_pooling_layer=False)
    return _field(model.eval(), ("pixel_values",), "last_hidden_state", interpolate_pos_encoding=True)


def _resnet(tiny: bool) -> nn.Module:
    model = _tf().ResNetModel(_tf().ResNetConfig(**(RESNET.tiny if tiny else RESNET.full)))
    return _field(model.eval(), ("pixel_values",), "pooler_output")


def _llama(tiny: bool) -> nn.Module:
    cfg = _tf().LlamaConfig(**(LLAMA.tiny if tiny else LLAMA.full), use_cache=False)
    return _field(_tf().LlamaModel(cfg).eval(), ("input_ids", "attention_mask"), "last_hidden_state")


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype))


class Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, kv: int, hd: int, ffn: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(hidden), RMSNorm(hidden)
        self.q = nn.Linear(hidden, heads * hd, bias=False)
        self.k = nn.Linear(hidden, kv * hd, bias=False)
        self.v = nn.Linear(hidden, kv * hd, bias=False)
        self.o = nn.Linear(heads * hd, hidden, bias=False)
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)


class DecodeStack(nn.Module):
    """One decode step of a LLaMA-style decoder: every layer's caches as inputs ([layers, batch, KV heads,
    past, head dim]), the step's new keys and values as outputs (what a server appends)."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, tiny: bool) -> None:
        super().__init__()
        c = LLAMA.tiny if tiny else LLAMA.full
        self.hidden, self.heads, self.kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = self.hidden // self.heads
        shape = (self.hidden, self.heads, self.kv, self.hd, c["intermediate_size"])
        self.layers = nn.ModuleList(Layer(*shape) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(self.hidden)
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        emb = torch.outer(torch.arange(c["max_position_embeddings"]).float(), inv).repeat(1, 2)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def _rotary(self, x: torch.Tensor, past: int) -> torch.Tensor:
        cos, sin = self.cos[past : past + 1][None, None].to(x.dtype), self.sin[past : past + 1][None, None].to(x.dtype)
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def forward(self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, past = x.shape[0], past_k.shape[3]
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, Layer)
            h = layer.norm1(x)
            q = self._rotary(layer.q(h).view(b, 1, self.heads, self.hd).transpose(1, 2), past)
            k = self._rotary(layer.k(h).view(b, 1, self.kv, self.hd).transpose(1, 2), past)
            v = layer.v(h).view(b, 1, self.kv, self.hd).transpose(1, 2)
            keys, values = torch.cat([past_k[i], k], dim=2), torch.cat([past_v[i], v], dim=2)
            a = F.scaled_dot_product_attention(q, keys, values, enable_gqa=True)
            x = x + layer.o(a.transpose(1, 2).reshape(b, 1, self.heads * self.hd))
            h = layer.norm2(x)
            x = x + layer.down(F.silu(layer.gate(h)) * layer.up(h))
            new_k.append(k)
            new_v.append(v)
        return self.norm(x), torch.stack(new_k), torch.stack(new_v)


def _decode_inputs(tiny: bool) -> Callable[[torch.Generator, tuple[int, ...]], Inputs]:
    c = LLAMA.tiny if tiny else LLAMA.full
    layers, kv, hd = c["num_hidden_layers"], c["num_key_value_heads"], c["hidden_size"] // c["num_attention_heads"]

    def make(g: torch.Generator, size: tuple[int, ...]) -> Inputs:
        b, past = size
        x = torch.randn(b, 1, c["hidden_size"], generator=g)
        caches = (torch.randn(layers, b, kv, past, hd, generator=g) for _ in "kv")
        return (x, *caches)

    return make


TEXT = {"ids": {0: ("batch", 1, 32), 1: ("seq", 16, 512)}, "mask": {0: ("batch", 1, 32), 1: ("seq", 16, 512)}}
PREFILL = {"ids": {0: ("batch", 1, 8), 1: ("seq", 16, 2048)}, "mask": {0: ("batch", 1, 8), 1: ("seq", 16, 2048)}}
CACHES = {1: ("batch", 1, 32), 3: ("past", 16, 4096)}


def models(tiny: bool) -> dict[str, ZooModel]:
    """The benchmark's models (`bench` holds the measured sizes); `tiny`: miniature configs."""
    return {
        "bert": ZooModel(
            lambda: _bert(tiny),
            ("ids", "mask"),
            TEXT,
            _text(96 if tiny else 30522),
            ((2, 33), (3, 40)),
            (),
            ((1, 128), (8, 128), (32, 128), (1, 512), (8, 512)),
        ),
        "vit": ZooModel(
            lambda: _vit(tiny),
            ("x",),
            {"x": {0: ("batch", 1, 32), 2: ("height", 224, 384), 3: ("width", 224, 384)}},
            _images,
            ((2, 224, 224), (3, 256, 240)),
            (),
            ((1, 224, 224), (8, 224, 224), (32, 224, 224), (1, 384, 384), (8, 384, 384)),
        ),
        "resnet50": ZooModel(
            lambda: _resnet(tiny), ("x",), {"x": {0: ("batch", 1, 64)}}, _images, ((2,), (3,)), (), ((1,), (8,), (64,))
        ),
        "llama": ZooModel(
            lambda: _llama(tiny),
            ("ids", "mask"),
            PREFILL,
            _text(96 if tiny else 32000),
            ((2, 33), (3, 40)),
            (),
            ((1, 128), (1, 512), (4, 512), (1, 2048)),
        ),
        "llama-decode": ZooModel(
            lambda: DecodeStack(tiny).eval(),
            ("x", "past_k", "past_v"),
            {"x": {0: ("batch", 1, 32)}, "past_k": CACHES, "past_v": CACHES},
            _decode_inputs(tiny),
            ((2, 33), (3, 40)),
            (),
            ((1, 128), (1, 1024), (1, 4096), (8, 1024), (32, 1024), (8, 4096)),
        ),
    }


# --------------------------------------------------------------------------- runners


def _cuda(args: Inputs, dtype: torch.dtype) -> Inputs:
    return tuple(a.to("cuda", dtype) if a.is_floating_point() else a.cuda() for a in args)


def build_artifact(zoo: ZooModel, model: nn.Module, targets: tuple[str, ...]) -> Any:
    g = torch.Generator().manual_seed(0)
    samples = [zoo.make(g, s) for s in zoo.samples]
    return bladepack.optimize(model, samples, zoo.dynamic_shapes(), targets=targets, dtype="float16")


def _peer(name: str, model: nn.Module, zoo: ZooModel, sample: Inputs) -> Callable[..., Any]:
    if name == "eager":
        return model
    if name == "aoti":
        named: dict[str, Any] = {}
        for axes in zoo.dims.values():
            for dim, lo, hi in axes.values():
                named.setdefault(dim, torch.export.Dim(dim, min=lo, max=hi))
        dims = tuple({a: named[d[0]] for a, d in zoo.dims.get(n, {}).items()} for n in zoo.names)
        ep = torch.export.export(model, sample, dynamic_shapes=dims)
        return torch._inductor.aoti_load_package(torch._inductor.aoti_compile_and_package(ep))
    mode = {"compile": None, "reduce-overhead": "reduce-overhead", "max-autotune": "max-autotune-no-cudagraphs"}[name]
    return torch.compile(model, dynamic=True, mode=mode)


def _host_us(fn: Callable[[], Any], repeat: int) -> float:
    """The median wall time of enqueueing one call (no synchronization between calls)."""
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e6)
    torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def _error(out: Any, ref: Any) -> float:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    err = 0.0
    for o, r in zip(outs, refs, strict=True):
        r = r.float()
        err = max(err, float((o.float() - r).abs().max() / (1 + r.abs().max())))
    return err


def measure(name: str, zoo: ZooModel, peers: list[str], repeat: int, deadline: float) -> list[dict[str, Any]]:
    """Every runner at every benchmark size of one model; runners that fail or would pass the deadline
    are reported with the reason."""
    model = zoo.build().eval()
    t = time.perf_counter()
    art = build_artifact(zoo, model, ("cuda",))
    built = {"bladepack": time.perf_counter() - t}
    ours = bladepack.load(art.to_bytes(), device="cuda")
    del art
    gpu = model.to("cuda", DTYPE)
    reference = _float32_copy(model)
    runners: dict[str, Callable[..., Any]] = {"bladepack": ours}
    skipped: dict[str, str] = {}
    g = torch.Generator().manual_seed(1)
    first = _cuda(zoo.make(g, zoo.bench[0]), DTYPE)
    for peer in peers:
        if time.monotonic() > deadline:
            skipped[peer] = "no time left in the budget"
            continue
        try:
            t = time.perf_counter()
            fn = _peer(peer, gpu, zoo, first)
            with torch.no_grad():
                fn(*first)  # compiles (torch.compile compiles at the first call)
            torch.cuda.synchronize()
            built[peer] = time.perf_counter() - t
            runners[peer] = fn
        except Exception as e:  # reported with its reason
            skipped[peer] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    rows = []
    for size in zoo.bench:
        if time.monotonic() > deadline:
            rows.append({"model": name, "shape": list(size), "skipped": "no time left in the budget"})
            continue
        args = _cuda(zoo.make(g, size), DTYPE)
        row: dict[str, Any] = {"model": name, "shape": list(size), "built_s": built, "skipped_peers": skipped}
        with torch.no_grad():
            ref = reference(*_cuda(args, torch.float32))
            best: dict[str, float] = {}
            for name_, fn in runners.items():
                try:
                    row[f"{name_}_err"] = _error(fn(*args), ref)
                except Exception as e:  # a shape one runner refuses (a recompile limit, a guard)
                    row[f"{name_}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            live = [n for n in runners if f"{n}_error" not in row]
            for r in range(ROUNDS):
                for n in live[r % len(live) :] + live[: r % len(live)]:
                    call = functools.partial(runners[n], *args)
                    best[n] = min(best.get(n, math.inf), _time_us(call, repeat, calls=3))
            row["bladepack_host_us"] = _host_us(functools.partial(ours, *args), repeat)
        for n, us in best.items():
            row[f"{n}_us"] = us
            if n != "bladepack" and "bladepack" in best:
                row[f"vs_{n}"] = us / best["bladepack"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def _float32_copy(model: nn.Module) -> nn.Module:
    """A float32 copy of the model on the GPU: the accuracy reference."""
    import copy

    return copy.deepcopy(model).to("cuda", torch.float32).eval()


def report(rows: list[dict[str, Any]], device: str, peers: list[str]) -> str:
    lines = [
        f"# Real-size models on {device}",
        "",
        "`python -m bench.gpu_models`: float16, µs per call (CUDA events around back-to-back calls, best of",
        "three rounds), each peer's time over bladepack's (above 1: bladepack faster), bladepack's host time",
        "per call, error against float32 eager. Build: bladepack's optimize, the peers' compile at the first call.",
        "",
        "| model | shape | bladepack µs | host µs | " + " | ".join(f"vs {p}" for p in peers) + " | error |",
        "|---|---|---|---|" + "---|" * len(peers) + "---|",
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['model']} | {'x'.join(map(str, r['shape']))} | skipped: {r['skipped']} |")
            continue
        ratios = [f"{r[f'vs_{p}']:.2f}x" if f"vs_{p}" in r else "—" for p in peers]
        lines.append(
            f"| {r['model']} | {'x'.join(map(str, r['shape']))} | {r.get('bladepack_us', math.nan):.1f} | "
            f"{r.get('bladepack_host_us', math.nan):.1f} | {' | '.join(ratios)} | {r.get('bladepack_err', math.nan):.1e} |"
        )
    lines.append("")
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model and "skipped" not in r]
        if not mine:
            continue
        built = ", ".join(f"{k} {v:.0f} s" for k, v in mine[0]["built_s"].items())
        lines.append(f"- {model}: built in {built}")
        for peer, why in mine[0]["skipped_peers"].items():
            lines.append(f"  - {peer} not measured: {why}")
    compiled = [p for p in peers if p not in ("eager", "aoti")]
    best = []
    for r in rows:
        vals = [r[f"vs_{p}"] for p in compiled if f"vs_{p}" in r]
        if vals:
            best.append(min(vals))
    if best:
        geo = math.exp(sum(math.log(v) for v in best) / len(best))
        lines.append(f"\nAgainst the best torch.compile mode per shape: geomean {geo:.2f}x over {len(best)} shapes")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="bert,vit,resnet50,llama,llama-decode")
    ap.add_argument("--peers", default="eager,compile,reduce-overhead,aoti", help=f"of {', '.join(PEERS)}")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: build miniature models for a CUDA target")
    a = ap.parse_args()
    names = a.models.split(",")
    peers = [p for p in a.peers.split(",") if p]
    unknown = sorted(set(peers) - set(PEERS)) + sorted(set(names) - set(models(True)))
    if unknown:
        ap.error(f"unknown model or peer: {', '.join(unknown)}")
    if a.dry_run:
        for name in names:
            zoo = models(True)[name]
            art = build_artifact(zoo, zoo.build().eval(), ("cuda:sm_90",))
            kinds = sorted({k.kind for k in art.plan.kernels if k.target == "cuda"})
            variants = [v.name for k in art.plan.kernels if k.kind == "attention" for v in k.variants]
            print(f"{name}: {len(art.plan.kernels)} kernels ({', '.join(kinds)}); attention variants {variants}")
        return 0
    if not torch.cuda.is_available():
        print("bench.gpu_models needs a CUDA device (--dry-run builds miniature models without one)")
        return 2
    device = torch.cuda.get_device_name()
    deadline = time.monotonic() + a.budget
    rows: list[dict[str, Any]] = []
    for name in names:
        if time.monotonic() > deadline:
            rows.append({"model": name, "shape": [], "skipped": "no time left in the budget"})
            continue
        try:
            rows += measure(name, models(False)[name], peers, a.repeat, deadline)
            torch.cuda.empty_cache()  # the model's runners are gone
        except Exception as e:  # a model that fails to build: said, and the rest still run
            rows.append({"model": name, "shape": [], "skipped": f"{type(e).__name__}: {str(e)[:300]}"})
    text = report(rows, device, peers)
    save_results("gpu_models", device, text, rows)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
