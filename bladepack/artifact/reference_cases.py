"""Reference cases: what a self-verifying artifact records, and the rules both loaders check it by.

In: a manifest (its kernel rows, GEMM dispatch tables, native plans) and shape-program registers; a
case's input records. Out: the coverage items a call at those registers exercises (`covered`), every
item the artifact has (`all_items`), seeded inputs (`generate`), and the verdict on an output
(`compare`). The compile side (bladepack/reference_record.py) picks and records the cases; the
Python loader (loader/verify.py) and the C++ runtime (cpp_runtime/src/verify.cpp) run them.

Note [Reference cases] (docs/format.md "Reference cases"):
- A coverage item is a kernel variant of one target ("cpu k2 k2_simd": the first variant whose
  predicate register is non-zero runs) or a CUTLASS dispatch entry ("gemm %48 dispatch 1", and
  "dispatch_sm90" for the compute-capability-9.0 table: the first entry of the launch whose predicate
  register holds, i.e. whose key range holds M*N*batch and whose leading dims allow its alignment).
  A kernel or GEMM that no launch of its plan can reach at these registers (every launch ruled out by
  a shape condition) covers nothing. Pointer alignment, which only a call knows, is not modelled.
- Seeded inputs: element i of an input with seed s takes u = splitmix64(s + i) (mod 2^64), then
  `uniform` [lo, hi]: lo + (hi - lo) * ((u >> 11) * 2^-53) in float64, rounded to the dtype;
  `integers` [lo, hi]: lo + u mod (hi - lo + 1); `choice` values: values[u mod len(values)].
- A result passes when its NaNs and infinities sit where the recorded output has them and every
  other element is within tol * max(1, max |recorded|) of it; tol is the record's per output
  (computed_in: Note [Verdict tolerance]), or for a record without one TOLERANCE of the output's dtype
  (0 for integers and bool). The scaled error reported is max |got - recorded| / max(1, max |recorded|).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "float16": 1e-2, "bfloat16": 4e-2}
SPLITMIX_GAMMA = 0x9E3779B97F4A7C15


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x + np.uint64(SPLITMIX_GAMMA)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


GENERATE_CHUNK = 1 << 20  # elements generated at a time: float64 temporaries of 8 MiB each


def generate(record: dict[str, Any], shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """A seeded input (Note [Reference cases]): {"seed", "uniform": [lo, hi]} / {"integers": [lo, hi]}
    / {"choice": [values]}. Raises ValueError for a record that is none of these. Made GENERATE_CHUNK
    elements at a time, so what it needs beyond the result is a few MiB whatever the input's size."""
    n = int(np.prod(shape, dtype=np.int64))
    seed = np.uint64(int(record["seed"]) % 2**64)
    if "uniform" in record:
        if dtype.kind != "f":
            raise ValueError(f"uniform values for a {dtype} input")
        lo, hi = (float(v) for v in record["uniform"])

        def values(u: np.ndarray) -> np.ndarray:
            return lo + (hi - lo) * ((u >> np.uint64(11)).astype(np.float64) * 2.0**-53)

    elif "integers" in record:
        if dtype.kind == "f":
            raise ValueError(f"integers for a {dtype} input")
        lo_i, hi_i = (int(v) for v in record["integers"])
        if hi_i < lo_i:
            raise ValueError(f"integers range [{lo_i}, {hi_i}] is empty")
        span = np.uint64(hi_i - lo_i + 1)

        def values(u: np.ndarray) -> np.ndarray:
            return (u % span).astype(np.int64) + lo_i

    elif "choice" in record:
        choices = np.asarray(record["choice"])
        if choices.size == 0 or choices.ndim != 1:
            raise ValueError("choice needs a list of values")

        def values(u: np.ndarray) -> np.ndarray:
            return choices[(u % np.uint64(choices.size)).astype(np.int64)]

    else:
        raise ValueError(f"a seeded input needs uniform, integers or choice, got keys {sorted(record)}")
    out = np.empty(n, dtype=dtype)
    for i in range(0, n, GENERATE_CHUNK):
        count = min(GENERATE_CHUNK, n - i)
        with np.errstate(over="ignore"):
            u = _splitmix64(seed + np.uint64(i) + np.arange(count, dtype=np.uint64))
        out[i : i + count] = values(u).astype(dtype)
    return out.reshape(shape)


def computed_in(m: dict[str, Any]) -> list[float]:
    """Note [Verdict tolerance]: per output of manifest `m`, the tolerance of its verdict: the largest
    TOLERANCE of the float dtypes among the values it is computed from (inputs, weights and every plan
    step's result up the chain, its own dtype included); 0 for an integer or bool output. A float64
    output computed through float32 values carries float32's rounding, so it is judged at float32's
    1e-4, not float64's 1e-9; a float32 output of float16 arithmetic at 1e-2."""
    dtypes = {
        int(t["id"]): str(t["dtype"]) for key in ("inputs", "weights", "values", "outputs") for t in m.get(key, ())
    }
    producers: dict[int, list[int]] = {}
    for step in m["plan"]["steps"]:
        ins = [int(v) for v in step.get("in", ()) if isinstance(v, int)]
        outs = step["out"] if isinstance(step["out"], list) else [step["out"]]
        for o in outs:
            if isinstance(o, int):
                producers.setdefault(o, []).extend(ins)
    out: list[float] = []
    for t in m["outputs"]:
        if str(t["dtype"]) not in TOLERANCE:
            out.append(0.0)
            continue
        seen: set[int] = set()
        todo = [int(t["id"])]
        tol = TOLERANCE[str(t["dtype"])]
        while todo:
            v = todo.pop()
            if v in seen:
                continue
            seen.add(v)
            tol = max(tol, TOLERANCE.get(dtypes.get(v, ""), 0.0))
            todo.extend(producers.get(v, ()))
        out.append(tol)
    return out


def compare(got: np.ndarray, want: np.ndarray, dtype: str, tol: float | None = None) -> tuple[bool, float, float]:
    """(passes, max abs error, scaled error) of one output against its recorded value; `tol`: the
    record's tolerance for it (Note [Verdict tolerance]), else TOLERANCE of `dtype`."""
    if got.shape != want.shape:
        return False, float("inf"), float("inf")
    if dtype not in TOLERANCE:
        bad = got != want
        return not bool(bad.any()), float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max(initial=0)), 0.0
    g, w = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(w)
    same_special = np.array_equal(np.isnan(g), np.isnan(w)) and np.array_equal(g[np.isinf(w)], w[np.isinf(w)])
    d = np.abs(g[finite] - w[finite])
    err = float(d.max(initial=0.0)) if not np.isnan(d).any() else float("inf")
    scale = max(1.0, float(np.abs(w[finite]).max(initial=0.0)))
    return same_special and err <= (TOLERANCE[dtype] if tol is None else tol) * scale, err, err / scale


def all_items(m: dict[str, Any]) -> list[str]:
    """Every coverage item of the artifact, in manifest order."""
    items = []
    for k in m.get("kernels", ()):
        items += [f"{k.get('target', 'cpu')} {k['name']} {v['name']}" for v in k["variants"]]
    for g in m.get("gemm_configs", ()):
        for table in ("dispatch", "dispatch_sm90"):
            items += [f"gemm %{g['node']} {table} {e}" for e in range(len(g.get(table, ())))]
    return items


def covered(m: dict[str, Any], regs: Sequence[int]) -> list[str]:
    """The coverage items a call with these registers exercises (Note [Reference cases])."""
    items = []
    rows: dict[str, int] = {}
    by_row: dict[str, dict[int, list[dict[str, Any]]]] = {}  # target -> kernel row -> its launches
    for target, plan_key in (("cpu", "native_cpu"), ("cuda", "native_cuda")):
        of_row = by_row[target] = {}
        for lr in (m.get(plan_key) or {}).get("launches", ()):
            if lr.get("op") == "kernel":
                of_row.setdefault(lr.get("k"), []).append(lr)
    for k in m.get("kernels", ()):
        target = k.get("target", "cpu")
        row = rows.get(target, 0)
        rows[target] = row + 1
        launches = by_row["cpu" if target == "cpu" else "cuda"].get(row, [])
        if not any(_may_run(lr, regs) for lr in launches):
            continue
        v = next((v for v in k["variants"] if regs[v["pred"]]), None)
        if v is not None:
            items.append(f"{target} {k['name']} {v['name']}")
    cutlass = [g for g in m.get("gemm_configs", ()) if g.get("library") == "cutlass"]
    launches = [lr for lr in (m.get("native_cuda") or {}).get("launches", ()) if lr.get("op") == "cutlass"]
    for g, lr in zip(cutlass, launches):  # the plan's CUTLASS launches follow its CUTLASS rows, in order
        if not _may_run(lr, regs):
            continue
        for table, entries in (("dispatch", "entries"), ("dispatch_sm90", "entries_sm90")):
            e = next((e for e, row in enumerate(lr.get(entries, ())) if regs[row["pred"]]), None)
            if e is not None:
                items.append(f"gemm %{g['node']} {table} {e}")
    return items


def _may_run(launch: dict[str, Any], regs: Sequence[int]) -> bool:
    """False when a shape condition rules the launch out at these registers (data conditions may hold)."""
    return all(bool(regs[c["r"]]) == c["is"] for c in launch.get("when", ()) if "r" in c)
