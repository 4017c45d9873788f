"""Choose CUTLASS configs per GEMM and a dispatch table over its dynamic extents.

In: a `GemmCall` (M, N, K, batch, leading dims, transposes — sizes may be symbolic), the program's
`ShapeEnv` and the sample bindings. Out: `GemmDispatch` — an ordered list of (config, split-K slices,
predicate): the first entry whose predicate holds runs. Predicates are sympy booleans over the shape
symbols (the shape program evaluates them per input signature): alignment conditions and an upper
bound on the dispatch key `M * N * batch`; the last entry is the SIMT fallback (true).

Note [GEMM cost model]: at shapes drawn from the declared ranges (every dynamic symbol on a geometric
grid over its range, its ends, odd values next to powers of two, the samples), each option's time is
estimated as max(compute, memory) + split-K cost:
- compute: the output tiles (ceil(M/TM) ceil(N/TN) batch x slices) spread over the SMs in waves; each
  CTA iterates ceil(K / slices / TK) times over TM x TN x TK multiply-adds, at the per-SM tensor-core
  (or FMA) rate scaled by the warp tile's efficiency and by how many warps the SM holds at once
  (few warps cannot hide latency);
- memory: A read once per column of tiles, B once per row of tiles, D written (and reread per extra
  slice), at a bandwidth that needs enough active CTAs to reach the device's;
- serial split-K: each extra slice waits for the previous one's partial tile.
All shapes and options are estimated at once (`estimates`, numpy; the full waves priced as one
product), and a plan selects each distinct GEMM once (the lowering keys its tables by `selection_key`:
a model's layers repeat their GEMMs). Estimated one by one and per layer, the choice took 97 s of a
BERT-base's float16 optimize (200 s with the sm_90a tables); now 0.3 s, the same tables.
Configs are then chosen greedily (at most `MAX_CONFIGS`, each must cut the geomean loss against the
per-shape best by >= 2%), and the shapes are cut into a few key intervals with one option each (Note
[GEMM dispatch segments] at `_segments`). The constants describe an H100 SXM (132 SMs); they rank
configs, they do not predict times. When a GPU is present at optimize
time, measured times replace the estimates (`measure`; Note [GEMM profiling] in library_ops/cutlass/profile.py) at up
to PROFILE_POINTS of those shapes, and the same greedy choice runs on them.

A plan that targets sm_90a gets a second table per GEMM (`arch` "sm90"), for GPUs of compute capability
9.0: it chooses among the Hopper configs (split-K 1 only) and the sm80 ones together, with the sm80
configs' tensor-core rate cut to what mma.sync reaches on a Hopper SM (MMA_SYNC_ON_HOPPER), so small or
deep problems may still pick an sm80 config with split-K. A GEMM whose batched operand is broadcast
(batch stride 0) cannot use the Hopper configs (TMA takes no zero stride).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
import sympy

from bladepack.dtypes import DType
from bladepack.ir import ShapeEnv
from bladepack.ir.types import IRDim
from bladepack.library_ops.cpu_gemm import GemmCall
from bladepack.library_ops.cutlass.configs import VERIFIED_DTYPES, GemmConfig, candidates, fallback

SMS = 132
SMEM_PER_SM = 227 * 1024
REGS_PER_SM = 65536
BANDWIDTH = 3.35e6  # bytes per microsecond
MACS_PER_SM = {"tensorop": 3.75e6, "tensorop_3xtf32": 0.62e6, "simt": 0.25e6, "wgmma": 3.75e6}  # per microsecond
MMA_SYNC_ON_HOPPER = 0.62  # the fraction of wgmma's rate that mma.sync reaches on an H100
LAUNCH_US = 2.0
MAX_CONFIGS = 4
SPLITS = (1, 2, 4, 8, 16)
MAX_POINTS = 256
PROFILE_POINTS = 24
MAX_SEGMENTS = 8  # key intervals per dispatch table (Note [GEMM dispatch segments])
SEGMENT_SLACK = math.log(1.01)  # the mean slowdown a coarser table may add
SHAPE_SLACK = math.log(1.02)  # and the most it may add at any one shape


class Measure(Protocol):
    """Microseconds of each option (columns) at each binding of the shape symbols (rows)."""

    def __call__(
        self, call: GemmCall, options: Sequence[Option], bindings: Sequence[Mapping[sympy.Symbol, int]]
    ) -> list[list[float]]: ...


@dataclass(frozen=True)
class GemmPolicy:
    """How a CUDA plan's GEMMs are served: `library` "cublas" or "cutlass"; for CUTLASS at most `configs`
    aligned configs per GEMM, chosen by `measure` (Note [GEMM profiling]; the cost model when None) at
    shapes that include `samples` (symbol name -> value, one dict per sample input). `hopper` adds the
    sm90 table (the plan targets sm_90a), which `measure` times only when `measure_hopper` (the device
    profiled on has compute capability 9.0). CUTLASS serves the GEMMs whose dtype is in `dtypes`; the
    others run on cuBLAS (configs.VERIFIED_DTYPES by default)."""

    library: str = "cublas"
    configs: int = 4
    measure: Measure | None = None
    tuned_on: str = "cost model"
    samples: tuple[Mapping[str, int], ...] = ()
    hopper: bool = False
    measure_hopper: bool = False
    dtypes: frozenset[DType] = VERIFIED_DTYPES


CUBLAS = GemmPolicy()  # the default: cuBLAS serves CUDA GEMMs


@dataclass(frozen=True)
class Option:
    config: GemmConfig
    split: int


@dataclass(frozen=True)
class DispatchEntry:
    config: GemmConfig
    split: int
    pred: Any  # sympy boolean
    lo: int  # the dispatch key range this entry was chosen for (for inspect)
    hi: int | None


@dataclass(frozen=True)
class GemmDispatch:
    key: Any  # sympy expression: M * N * batch
    entries: tuple[DispatchEntry, ...]


def _regs(cfg: GemmConfig) -> int:
    acc = cfg.warp[0] * cfg.warp[1] // 32 * (2 if cfg.accumulator.itemsize == 8 else 1)
    return min(255, acc + (96 if cfg.math == "tensorop_3xtf32" else 64))


def occupancy(cfg: GemmConfig) -> int:
    """CTAs one SM holds at once (shared memory, registers, threads)."""
    by_smem = SMEM_PER_SM // max(cfg.smem_bytes, 1)
    by_regs = REGS_PER_SM // (_regs(cfg) * cfg.threads)
    return max(1, min(by_smem, by_regs, 2048 // cfg.threads, 32))


def _efficiency(cfg: GemmConfig) -> float:
    wm, wn = cfg.warp[0], cfg.warp[1]
    if cfg.arch == "sm90":  # a consumer warpgroup's tile
        return {16384: 0.85, 8192: 0.75}.get(wm * wn, 0.6)
    return {4096: 0.9, 2048: 0.8, 1024: 0.65}.get(wm * wn, 0.5)


def _hopper_share(cfg: GemmConfig, arch: str) -> float:
    """The fraction of its tensor-core rate a config reaches on a GPU of `arch`'s table."""
    return MMA_SYNC_ON_HOPPER if arch == "sm90" and cfg.math == "tensorop" else 1.0


def estimate(opt: Option, m: int, n: int, k: int, batch: int, arch: str = "sm80") -> float:
    """Note [GEMM cost model]: estimated microseconds of one launch on a GPU of `arch`'s table."""
    return float(estimates([opt], [(m, n, k, batch)], arch)[0, 0])


def _ceil_div(a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    return -(-a // b)


def estimates(options: Sequence[Option], shapes: Sequence[tuple[int, int, int, int]], arch: str = "sm80") -> np.ndarray:
    """Note [GEMM cost model]: estimated microseconds of each option (columns) at each (M, N, K, batch)
    shape (rows) on a GPU of `arch`'s table, all at once. The CTAs the busiest SM runs go in waves of
    its occupancy: the full waves cost alike, the last one by its own size."""
    shape = np.asarray(shapes, dtype=np.int64).reshape(-1, 4)
    m, n, k, batch = (shape[:, i : i + 1] for i in range(4))
    cfgs = [o.config for o in options]

    def col(values: Sequence[float]) -> np.ndarray:
        return np.asarray(values).reshape(1, -1)

    tm, tn, tk = (col([c.tile[i] for c in cfgs]).astype(np.int64) for i in range(3))
    split = col([o.split for o in options]).astype(np.int64)
    occ = col([occupancy(c) for c in cfgs]).astype(np.int64)
    warps = col([c.warps for c in cfgs]).astype(np.float64)
    rate = col([MACS_PER_SM[c.math] * _efficiency(c) * _hopper_share(c, arch) for c in cfgs])
    item = col([c.dtype.itemsize for c in cfgs]).astype(np.float64)
    tiles = _ceil_div(m, tm) * _ceil_div(n, tn) * batch * split
    cta_macs = _ceil_div(_ceil_div(k, split), tk) * tm * tn * tk
    full, rest = np.divmod(_ceil_div(tiles, SMS), occ)
    wave = occ * cta_macs / (rate * np.minimum(1.0, occ * warps / 8))
    last = rest * cta_macs / (rate * np.minimum(1.0, np.maximum(rest, 1) * warps / 8))
    compute = full * wave + last
    mf, nf, kf = m.astype(np.float64), n.astype(np.float64), k.astype(np.float64)
    traffic = (_ceil_div(n, tn) * mf * kf + _ceil_div(m, tm) * nf * kf + mf * nf * (2 * split - 1)) * item * batch
    memory = traffic / (BANDWIDTH * np.minimum(1.0, 2 * np.minimum(tiles, SMS) / SMS))
    serial = (split - 1) * 2 * tm * tn * 4 / (BANDWIDTH / SMS)
    out: np.ndarray = np.maximum(compute, memory) + serial + LAUNCH_US
    return out


def _options(cfgs: Sequence[GemmConfig], k_max: int, batched: bool) -> list[Option]:
    out = []
    for cfg in cfgs:
        for s in SPLITS:
            if s == 1 or (not batched and cfg.arch == "sm80" and k_max >= 4 * s * cfg.tile[2]):
                out.append(Option(cfg, s))
    return out


def sample_points(
    env: ShapeEnv, exprs: Sequence[IRDim], samples: Sequence[Mapping[str, int]] = ()
) -> list[dict[sympy.Symbol, int]]:
    """Bindings of the symbols in `exprs`: per symbol a geometric grid over its range (unbounded ranges
    stop at 2^16), its ends, odd values around powers of two and the sample values; the product of
    those per symbol, thinned evenly to at most MAX_POINTS."""
    syms = sorted({s for e in exprs for s in sympy.sympify(e).free_symbols}, key=lambda s: s.name)
    per: list[list[int]] = []
    for s in syms:
        r = env.range_of(s)
        lo, hi = max(r.min, 1), r.max if r.max is not None else max(r.min, 1 << 16)
        vals = {lo, hi}
        steps = 12
        for i in range(steps + 1):
            vals.add(round(lo * (hi / lo) ** (i / steps)))
        p = 1
        while p <= hi:
            vals.update(v for v in (p - 1, p + 1) if lo <= v <= hi)
            p *= 4
        vals.update(int(b[s.name]) for b in samples if s.name in b and lo <= int(b[s.name]) <= hi)
        per.append(sorted(vals))
    combos = list(itertools.product(*per))
    if len(combos) > MAX_POINTS:
        stride = len(combos) / MAX_POINTS
        combos = [combos[int(i * stride)] for i in range(MAX_POINTS)] + [combos[-1]]
    return [dict(zip(syms, c)) for c in combos]


def _value(e: IRDim, binding: Mapping[sympy.Symbol, int]) -> int:
    return int(sympy.sympify(e).xreplace(binding)) if not isinstance(e, int) else e


def alignment_pred(call: GemmCall, align: int) -> Any:
    """Leading dims, contiguous extents, batch strides and view offsets are multiples of `align`
    elements (the loader also checks the addresses)."""
    if align == 1:
        return sympy.true
    contiguous = [call.lda, call.ldb, call.ldc, call.n, call.m if call.ta else call.k, call.k if call.tb else call.n]
    contiguous += [s for s in (*call.sa, *call.sb, *call.sc) if s != 0]
    contiguous += [call.a.offset, call.b.offset]
    conds = [sympy.Eq(sympy.Mod(sympy.sympify(e), align), 0) for e in contiguous]
    return sympy.simplify(sympy.And(*conds))


def _hopper_ok(call: GemmCall, batch_total: Any) -> bool:
    """Note [Hopper GEMMs] in library_ops/cutlass/emitter.py: no broadcast (zero-stride) batched operand."""
    if batch_total == 1:
        return True
    return all(s != 0 for b, *ss in zip(call.batch, call.sa, call.sb, call.sc) if b != 1 for s in ss)


def _segments(keys: Sequence[int], times: np.ndarray, options: Sequence[Option]) -> list[tuple[int, int, Option]]:
    """Note [GEMM dispatch segments]: (first key, last key, option) intervals over the shapes, sorted by
    key, with their times per option.

    The dispatch key M·N·batch orders shapes only roughly: with two dynamic symbols (attention's batch and
    sequence) shapes of similar keys can prefer different options, and taking every shape's winner gave
    tables of ~90 entries that alternate between two configs. Instead the shapes are cut into at most
    MAX_SEGMENTS key intervals, one option each, minimizing the summed log-slowdown against each shape's
    best option (dynamic programming over the cut points; shapes of equal key are never separated), and
    the fewest intervals are kept whose mean slowdown is within SEGMENT_SLACK of the best segmentation's
    and that slow no shape by more than SHAPE_SLACK beyond what the best segmentation costs it."""
    n = len(keys)
    cost = np.log(np.asarray(times, dtype=np.float64))
    cost = np.where(np.isfinite(cost), cost - cost.min(axis=1, keepdims=True), 50.0)  # inf: never ran there
    prefix = np.vstack([np.zeros((1, len(options))), np.cumsum(cost, axis=0)])
    span = prefix[None, :, :] - prefix[:, None, :]  # [i, j, o]: shapes i..j-1 all on option o
    seg_cost, seg_option = span.min(axis=2), span.argmin(axis=2)  # ties: the earlier (catalogue) option
    cut = np.array([True, *(keys[i - 1] != keys[i] for i in range(1, n)), True])
    bad = ~(np.triu(np.ones((n + 1, n + 1), dtype=bool), 1) & cut[:, None] & cut[None, :])
    seg_cost = np.where(bad, np.inf, seg_cost)
    best: list[np.ndarray] = [np.where(np.arange(n + 1) == 0, 0.0, np.inf)]
    back: list[np.ndarray] = []
    for _ in range(MAX_SEGMENTS):
        total = best[-1][:, None] + seg_cost  # [i, j]: the last segment is i..j-1
        back.append(total.argmin(axis=0))
        best.append(total.min(axis=0))

    def cuts(count: int) -> list[int]:
        bounds = [n]
        for r in range(count, 0, -1):
            bounds.append(int(back[r - 1][bounds[-1]]))
        return bounds[::-1]

    def per_shape(bounds: list[int]) -> np.ndarray:
        return np.concatenate([cost[i:j, seg_option[i, j]] for i, j in itertools.pairwise(bounds)])

    ends = [float(b[n]) for b in best[1:]]
    bounds = cuts(MAX_SEGMENTS)
    finest = per_shape(bounds)
    for count in range(1, MAX_SEGMENTS):
        if ends[count - 1] > min(ends) + n * SEGMENT_SLACK:
            continue
        trial = cuts(count)
        if np.all(per_shape(trial) <= finest + SHAPE_SLACK):
            bounds = trial
            break
    runs: list[tuple[int, int, Option]] = []
    for i, j in itertools.pairwise(bounds):
        o = options[int(seg_option[i, j])]
        if runs and runs[-1][2] == o:
            runs[-1] = (runs[-1][0], keys[j - 1], o)
        else:
            runs.append((keys[i], keys[j - 1], o))
    return runs


def _thin(items: list[Any], most: int) -> list[Any]:
    """At most `most` items spread evenly, the first and last kept."""
    if len(items) <= most:
        return items
    return [items[round(i * (len(items) - 1) / (most - 1))] for i in range(most)]


def selection_key(call: GemmCall, arch: str = "sm80") -> tuple[GemmCall, str]:
    """Everything `select` reads of a call: the call with its operands' and output's value ids zeroed
    (the same GEMM in each of a model's layers gets the same table), and the arch."""
    return replace(call, a=replace(call.a, base=0), b=replace(call.b, base=0), out=0), arch


def select(
    call: GemmCall,
    env: ShapeEnv,
    samples: Sequence[Mapping[str, int]] = (),
    max_configs: int = MAX_CONFIGS,
    measure: Measure | None = None,
    arch: str = "sm80",
) -> GemmDispatch:
    """Note [GEMM cost model]: the dispatch table of one GEMM for GPUs of `arch` ("sm80": all of them,
    "sm90": compute capability 9.0); `measure` times options on a GPU instead of estimating them."""
    batch_total = sympy.sympify(call.batch[0] * call.batch[1] * call.batch[2])
    key = sympy.expand(sympy.sympify(call.m) * call.n * batch_total)
    fb = fallback(call.dtype)
    cfgs = candidates(call.dtype)
    if arch == "sm90":
        hopper = candidates(call.dtype, "sm90") if _hopper_ok(call, batch_total) else ()
        cfgs = (*hopper, *cfgs)
    elif arch != "sm80":
        raise ValueError(f"no GEMM dispatch for arch {arch!r}; the arches are sm80 and sm90")
    align_pred = {c: alignment_pred(call, c.align) for c in cfgs}
    cfgs = tuple(c for c in cfgs if align_pred[c] is not sympy.false)
    if not cfgs:
        return GemmDispatch(key, (DispatchEntry(fb, 1, sympy.true, 0, None),))
    points = sample_points(env, [call.m, call.n, call.k, batch_total], samples)
    binding_of: dict[tuple[int, int, int, int], dict[sympy.Symbol, int]] = {}
    for b in points:
        binding_of.setdefault((_value(call.m, b), _value(call.n, b), _value(call.k, b), _value(batch_total, b)), b)
    shapes = sorted(binding_of, key=lambda s: (s[0] * s[1] * s[3], s))
    batched = batch_total != 1
    k_max = max(s[2] for s in shapes)
    options = _options(cfgs, k_max, batched)
    if measure is None:
        table = estimates(options, shapes, arch)
    else:
        shapes = _thin(shapes, PROFILE_POINTS)
        table = np.asarray(measure(call, options, [binding_of[s] for s in shapes]), dtype=np.float64)
        ran = table.min(axis=1) < math.inf  # some option ran at that shape
        shapes, table = [s for s, r in zip(shapes, ran) if r], table[ran]
        if not shapes:
            return GemmDispatch(key, (DispatchEntry(fb, 1, sympy.true, 0, None),))
    best = table.min(axis=1)
    column_of = {c: np.asarray([o.config == c for o in options]) for c in cfgs}

    def loss(chosen: Sequence[GemmConfig]) -> float:
        mask = np.logical_or.reduce([column_of[c] for c in chosen])
        return float(np.log(table[:, mask].min(axis=1) / best).mean())

    chosen: list[GemmConfig] = []
    current = math.inf
    while len(chosen) < max_configs:
        trial = {c: loss([*chosen, c]) for c in cfgs if c not in chosen}
        if not trial:
            break
        c, after = min(trial.items(), key=lambda kv: kv[1])
        if chosen and current - after < math.log(1.02):
            break
        chosen.append(c)
        current = after
    usable = [i for i, o in enumerate(options) if o.config in chosen]
    keys = [s[0] * s[1] * s[3] for s in shapes]
    runs = _segments(keys, table[:, usable], [options[i] for i in usable])
    entries = []
    lo = 0
    for i, (_first, last, o) in enumerate(runs):
        top = i == len(runs) - 1
        bound = None if top else math.isqrt(last * runs[i + 1][0])  # geometric midpoint to the next run
        cond = align_pred[o.config] if top else sympy.And(align_pred[o.config], sympy.Le(key, bound))
        entries.append(DispatchEntry(o.config, o.split, cond, lo, bound))
        lo = (bound or 0) + 1
    entries.append(DispatchEntry(fb, 1, sympy.true, 0, None))
    return GemmDispatch(key, tuple(entries))
