"""The ONNX backend node tests run through bladepack.

The node test cases ship with the `onnx` package as Python (`onnx.backend.test.case.node`); this
collects them in memory (the wheel carries no generated data directory), prepares each model with
`BladepackBackend` and compares with the expected outputs exactly as onnx's own runner does
(`Runner.assert_similar_outputs`: shapes, dtypes, rtol / atol per case).

Each case ends as "pass", "fail" (a wrong result or an unexpected error: a bug) or "unsupported"
(bladepack raised UnsupportedOpsError naming what it does not handle). A case is "in scope" when
every op of its model is one the front end converts.

Many cases feed the operands that decide a result's shape (axes, shape, pads, starts, k) as graph
inputs; an ahead-of-time artifact needs those at optimize time, so the case is unsupported as
written. Its constant-operand variant (`frozen`: the integer inputs baked in as initializers with
the data set's values, as exported models have them) is run as well and reported apart.

    python -m tests.onnx_node_suite [--executor native|reference] [--report FILE.md] [NAME_FILTER]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Outcome:
    name: str
    ops: tuple[str, ...]
    status: str  # "pass", "fail" or "unsupported"
    detail: str = ""


@functools.lru_cache(maxsize=1)
def node_cases() -> list[Any]:
    import warnings

    import onnx.backend.test.case.node as node

    with warnings.catch_warnings(), np.errstate(all="ignore"):  # the cases compute edge values on purpose
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    return sorted((c for c in cases if c.kind == "node"), key=lambda c: c.name)


def ops_of(case: Any) -> tuple[str, ...]:
    return tuple(
        sorted({n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in case.model.graph.node})
    )


def in_scope(case: Any) -> bool:
    from bladepack.onnx_import.context import TABLE
    from bladepack.onnx_import.control_flow import CONTROL_FLOW

    return all(op in TABLE or op in CONTROL_FLOW for op in ops_of(case))


DATA_DEPENDENT = "computed from tensor data at run time"


def frozen(case: Any) -> Any | None:
    """`case` with its integer graph inputs and its scalar and short vector operands made initializers
    (values from its first data set; data sets that disagree on them are dropped); None when it has
    none."""
    from onnx import TensorProto, numpy_helper

    g = case.model.graph
    ints = [
        k for k, vi in enumerate(g.input) if vi.type.tensor_type.elem_type in (TensorProto.INT64, TensorProto.INT32)
    ]
    first = case.data_sets[0][0]
    # scalars (a pad value) and short float vectors (Resize's scales) are operands too
    ints += [k for k, x in enumerate(first) if k not in ints and k > 0 and np.asarray(x).ndim == 0]
    ints += [
        k
        for k, x in enumerate(first)
        if k not in ints and k > 0 and np.asarray(x).ndim == 1 and np.asarray(x).size <= 8
    ]
    if not ints:
        return None
    sets = [
        (ins, outs)
        for ins, outs in case.data_sets
        if all(np.array_equal(np.asarray(ins[k]), np.asarray(first[k])) for k in ints)
    ]
    model = type(case.model)()
    model.CopyFrom(case.model)
    keep = [vi for k, vi in enumerate(g.input) if k not in ints]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(first[k]), g.input[k].name) for k in ints)
    data = [([x for k, x in enumerate(ins) if k not in ints], outs) for ins, outs in sets]
    return dataclasses.replace(case, name=f"{case.name} (constant operands)", model=model, data_sets=data)


def _array(x: Any) -> Any:
    """Test data as numpy: arrays and scalars as they are, TensorProtos decoded; others unchanged."""
    from onnx import TensorProto, numpy_helper

    if isinstance(x, TensorProto):
        return numpy_helper.to_array(x)
    return np.asarray(x) if isinstance(x, (np.ndarray, np.generic)) else x


def _closer_to_float64(model: Any, inputs: list[Any], expected: list[Any], outputs: list[Any]) -> bool:
    """Note [Rounded expectations]: a float16 case's expected outputs were themselves computed in
    float16, rounding after every op, while bladepack rounds once per stored value (and accumulates
    GEMMs in float32), so the two can differ by an ulp where the tolerance is below float16's. Such a
    mismatch is accepted only when every output is float16 and no further from the same graph evaluated in
    float64 (onnx's reference evaluator) than the expected output is."""
    import copy

    from onnx import TensorProto, numpy_helper
    from onnx.reference import ReferenceEvaluator

    if not all(np.asarray(e).dtype == np.float16 for e in expected):
        return False
    m = copy.deepcopy(model)
    f16, f64 = TensorProto.FLOAT16, TensorProto.DOUBLE
    for vi in [*m.graph.input, *m.graph.output, *m.graph.value_info]:
        if vi.type.tensor_type.elem_type == f16:
            vi.type.tensor_type.elem_type = f64
    for t in m.graph.initializer:
        if t.data_type == f16:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for n in m.graph.node:
        for a in n.attribute:
            if a.name == "to" and a.i == f16:
                a.i = f64
            if a.HasField("t") and a.t.data_type == f16:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64), a.t.name))
    feeds = {vi.name: x.astype(np.float64) if x.dtype == np.float16 else x for vi, x in zip(m.graph.input, inputs)}
    try:
        exact = ReferenceEvaluator(m).run(None, feeds)
    except Exception:
        return False
    for e, o, r in zip(expected, outputs, exact):
        e, o = np.asarray(e), np.asarray(o)
        if o.shape != e.shape or o.dtype != e.dtype:
            return False
        ours, theirs = np.abs(o.astype(np.float64) - r), np.abs(e.astype(np.float64) - r)
        if not (np.nanmax(ours, initial=0.0) <= np.nanmax(theirs, initial=0.0)):
            return False
    return True


def run_case(case: Any, executor: str) -> Outcome:
    from onnx.backend.test.runner import Runner

    from bladepack.errors import UnsupportedOpsError
    from bladepack.onnx_backend import BladepackBackend

    ops = ops_of(case)
    try:
        rep = BladepackBackend.prepare(case.model, executor=executor)
    except UnsupportedOpsError as e:
        return Outcome(case.name, ops, "unsupported", str(e).splitlines()[-1].strip())
    except Exception as e:
        return Outcome(case.name, ops, "fail", f"prepare: {type(e).__name__}: {e}"[:400])
    for inputs, expected in case.data_sets:
        inputs, expected = [_array(x) for x in inputs], [_array(x) for x in expected]
        if not all(isinstance(x, np.ndarray) for x in inputs):
            return Outcome(case.name, ops, "unsupported", "non-tensor inputs")
        try:
            outputs = rep.run(inputs)
            try:
                Runner.assert_similar_outputs(expected, outputs, case.rtol, case.atol, case.name)
            except AssertionError:
                if not _closer_to_float64(case.model, inputs, expected, outputs):
                    raise
        except AssertionError as e:
            return Outcome(case.name, ops, "fail", f"mismatch: {str(e).strip()[:400]}")
        except Exception as e:
            return Outcome(case.name, ops, "fail", f"run: {type(e).__name__}: {e}"[:400])
    return Outcome(case.name, ops, "pass")


_GROUPS = (
    ("element type", "an element type the CPU backend does not compute (bfloat16, float8, int4, uint16+)"),
    (
        "computed from tensor data at run time",
        "a shape-determining operand (axes, shape, pads, starts) fed as a run-time input",
    ),
    ("not a tensor", "sequence, map or optional values"),
    ("non-tensor", "sequence, map or optional values"),
    ("version", "an opset older than 13 that onnx's converter cannot upgrade"),
    ("random", "random ops (their expected outputs come from one random generator)"),
)


def group(detail: str) -> str:
    for key, name in _GROUPS:
        if key in detail:
            return name
    return "other forms: " + detail


def run_all(cases: list[Any], executor: str, log: bool = False) -> tuple[list[Outcome], list[Outcome]]:
    """Outcomes of the cases, and of the constant-operand variants of those unsupported only because
    a shape-determining operand is a graph input."""
    outcomes, variants = [], []
    for c in cases:
        o = run_case(c, executor)
        outcomes.append(o)
        if log and o.status != "pass":
            print(f"{o.status:12s} {o.name}: {o.detail}", flush=True)
        f = frozen(c) if o.status == "unsupported" and DATA_DEPENDENT in o.detail else None
        if f is not None:
            v = run_case(f, executor)
            variants.append(v)
            if log and v.status != "pass":
                print(f"{v.status:12s} {v.name}: {v.detail}", flush=True)
    return outcomes, variants


def report(outcomes: list[Outcome], executor: str, seconds: float, variants: list[Outcome] = ()) -> str:
    count = collections.Counter(o.status for o in outcomes)
    done = count["pass"] + count["fail"]
    scope = count["pass"] + count["fail"] + count["unsupported"]
    lines = [
        f"# ONNX backend node tests through bladepack (executor: {executor})",
        "",
        f"onnx {_onnx_version()}; {len(outcomes)} node test cases whose every op has a converter "
        f"(in scope); {seconds:.0f} s.",
        "",
        f"- passed: **{count['pass']}** of {scope} in scope ({100.0 * count['pass'] / max(scope, 1):.1f}%)",
        f"- failed (wrong result or unexpected error): **{count['fail']}**",
        f"- unsupported (clear UnsupportedOpsError: a dtype, attribute or form not handled): {count['unsupported']}",
        f"- of the cases that compiled, {100.0 * count['pass'] / max(done, 1):.1f}% pass",
        "",
    ]
    vc = collections.Counter(o.status for o in variants)
    if variants:
        lines += [
            f"Constant-operand variants of the {len(variants)} cases unsupported only because a shape operand is a "
            f"graph input: **{vc['pass']}** pass, **{vc['fail']}** fail, {vc['unsupported']} unsupported.",
            "",
        ]
    fails = [o for o in [*outcomes, *variants] if o.status == "fail"]
    if fails:
        lines += ["## Failures", ""] + [f"- `{o.name}`: {o.detail}" for o in fails] + [""]
    groups = collections.Counter(group(o.detail) for o in outcomes if o.status == "unsupported")
    lines += ["## Unsupported, by kind", ""] + [f"- {n} x {r}" for r, n in groups.most_common()] + [""]
    reasons = collections.Counter(o.detail for o in outcomes if o.status == "unsupported")
    lines += ["## Unsupported, by message", ""] + [f"- {n} x {r}" for r, n in reasons.most_common()] + [""]
    return "\n".join(lines)


def _onnx_version() -> str:
    import onnx

    return onnx.__version__


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--executor", default="native", choices=["native", "reference", "auto"])
    ap.add_argument("--report")
    ap.add_argument("filter", nargs="?", default="")
    args = ap.parse_args(argv)
    cases = [c for c in node_cases() if in_scope(c) and args.filter in c.name]
    t0 = time.time()
    outcomes, variants = run_all(cases, args.executor, log=True)
    text = report(outcomes, args.executor, time.time() - t0, variants)
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    return 0 if not any(o.status == "fail" for o in [*outcomes, *variants]) else 1


if __name__ == "__main__":
    sys.exit(main())
