"""ONNX model → bladepack IR `Program`.

In: a path to a .onnx file (external-data files beside it are read) or an `onnx.ModelProto`, optional
`dynamic_shapes` ({input name: {axis: bladepack.Dim}}) and optional sample inputs. Out: an IR
`Program` (graph, shape environment, weights, runtime assertions) for `api.optimize_program`.

Symbols: each named `dim_param` becomes one symbol (the same name anywhere means the same symbol);
a dynamic dim without a name gets a fresh symbol `<input>_<axis>`; a `bladepack.Dim` given for an
axis names that axis' symbol and sets its range (default [1, unbounded)). Dims the model itself
proves equal (an Add of two inputs, a MatMul's contracting dims) are unified later by the
canonicalize_shapes pass, which also guards them at run time.

Every node is converted or folded (Note [Known values] in context.py); every unsupported op or
attribute is collected with its node name and opset and reported at once in `UnsupportedOpsError`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import sympy
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from bladepack.dims import Dim
from bladepack.errors import UnsupportedOpsError
from bladepack.ir import GraphBuilder, Program, ShapeEnv, TensorType
from bladepack.onnx_import import (  # noqa: F401  (registers converters)
    ops_einsum,
    ops_elementwise,
    ops_layout,
    ops_nn,
    ops_recurrent,
    ops_sampling,
    ops_shape,
)
from bladepack.onnx_import.context import FOLDABLE, TABLE, OnnxCtx, OVal, Unsupported, dtype_of, known
from bladepack.onnx_import.control_flow import CONTROL_FLOW, inline_if, unroll_loop

MIN_OPSET = 13
# A fold whose result is bigger than this and bigger than its operands stays a run-time op, so that a
# constant broadcast to a large shape does not become a large weight.
FOLD_LIMIT = 1 << 16


class OnnxModelError(UnsupportedOpsError):
    """The ONNX model cannot be read as bladepack input (opset, missing shapes, external data)."""

    def __init__(self, message: str) -> None:
        self.problems = [(message, "model")]
        Exception.__init__(self, message)


@dataclass(frozen=True)
class InputSpec:
    name: str
    type: TensorType


def load_model(model: Any) -> onnx.ModelProto:
    """A ModelProto from a path (with its external data) or a ModelProto given in memory."""
    if isinstance(model, onnx.ModelProto):
        for t in model.graph.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                raise OnnxModelError(
                    f"initializer {t.name!r} keeps its data in an external file; pass the model's path so "
                    "bladepack can read the files beside it"
                )
        return model
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise FileNotFoundError(f"no ONNX model at {path}")
        try:
            return onnx.load(str(path), load_external_data=True)
        except Exception as e:
            raise OnnxModelError(f"cannot read {path} as an ONNX model: {e}") from e
    raise TypeError(f"expected a path to a .onnx file or an onnx.ModelProto, got {type(model).__name__}")


def is_onnx_model(model: Any) -> bool:
    if isinstance(model, onnx.ModelProto):
        return True
    return isinstance(model, (str, os.PathLike)) and str(model).lower().endswith(".onnx")


def default_opset(m: onnx.ModelProto) -> int:
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    raise OnnxModelError("the model imports no version of the default ONNX operator set")


def _symbol_name(raw: str) -> str:
    name = re.sub(r"\W", "_", raw)
    if not name or not (name[0].isalpha() or name[0] == "_"):
        name = f"d_{name}"
    return name


class _Symbols:
    """Dim names → symbols: one symbol per dim_param or user Dim name, a fresh one per unnamed dim."""

    def __init__(self, env: ShapeEnv) -> None:
        self.env = env
        self.by_name: dict[str, sympy.Symbol] = {}
        self.declared: dict[str, Dim] = {}

    def get(self, name: str, dim: Dim | None, where: str) -> sympy.Symbol:
        if dim is not None:
            prev = self.declared.get(name)
            if prev is not None and (prev.min, prev.max) != (dim.min, dim.max):
                raise ValueError(f"{where}: dim {name!r} is declared twice with different ranges ({prev} and {dim})")
            self.declared[name] = dim
        if name not in self.by_name:
            lo, hi = (dim.min, dim.max) if dim is not None else (1, None)
            self.by_name[name] = self.env.create_symbol(name, lo, hi)
        return self.by_name[name]


def _axis_dims(dynamic_shapes: Any, name: str, index: int, rank: int) -> dict[int, Dim]:
    if dynamic_shapes is None:
        return {}
    if isinstance(dynamic_shapes, Mapping):
        spec = dynamic_shapes.get(name)
    elif isinstance(dynamic_shapes, (list, tuple)):
        spec = dynamic_shapes[index] if index < len(dynamic_shapes) else None
    else:
        raise TypeError("dynamic_shapes must map input names to {axis: bladepack.Dim}")
    if spec is None:
        return {}
    if isinstance(spec, (list, tuple)):
        spec = {k: d for k, d in enumerate(spec) if d is not None}
    out = {}
    for axis, d in dict(spec).items():
        if not isinstance(axis, int) or not -rank <= axis < rank:
            raise ValueError(f"dynamic_shapes[{name!r}]: axis {axis!r} out of range for rank {rank}")
        if not isinstance(d, Dim):
            raise TypeError(f"dynamic_shapes[{name!r}][{axis}] must be a bladepack.Dim, got {type(d).__name__}")
        out[axis % rank] = d
    return out


def _inputs(m: onnx.ModelProto, env: ShapeEnv, dynamic_shapes: Any) -> list[InputSpec]:
    inits = {t.name for t in m.graph.initializer}
    graph_inputs = [i for i in m.graph.input if i.name not in inits]
    if isinstance(dynamic_shapes, Mapping):
        unknown = sorted(set(dynamic_shapes) - {i.name for i in graph_inputs})
        if unknown:
            raise ValueError(
                f"dynamic_shapes names {unknown}, which are not inputs of the model; inputs: {[i.name for i in graph_inputs]}"
            )
    syms = _Symbols(env)
    specs = []
    for index, vi in enumerate(graph_inputs):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise OnnxModelError(f"input {vi.name!r} is not a tensor (sequences, maps and optionals are not supported)")
        if not tt.HasField("shape"):
            raise OnnxModelError(f"input {vi.name!r} has no shape in the model (its rank must be known)")
        try:
            dtype = dtype_of(tt.elem_type)
        except Unsupported as e:
            raise OnnxModelError(f"input {vi.name!r}: {e}") from None
        rank = len(tt.shape.dim)
        user = _axis_dims(dynamic_shapes, vi.name, index, rank)
        dims: list[Any] = []
        for axis, d in enumerate(tt.shape.dim):
            where = f"input {vi.name!r} axis {axis}"
            if d.HasField("dim_value") and axis not in user:
                dims.append(int(d.dim_value))
                continue
            if d.HasField("dim_value") and axis in user:
                raise ValueError(f"{where} is static ({d.dim_value}) in the model; it cannot take {user[axis]}")
            dim = user.get(axis)
            raw = dim.name if dim is not None else (d.dim_param or f"{vi.name}_{axis}")
            dims.append(syms.get(_symbol_name(raw), dim, where))
        specs.append(InputSpec(vi.name, TensorType(dtype, tuple(dims))))
    return specs


def check_samples(specs: Sequence[InputSpec], env: ShapeEnv, sample_inputs: Any) -> None:
    """Sample inputs are optional for ONNX; given, each must fit the declared signature and ranges."""
    if sample_inputs is None:
        return
    samples = sample_inputs if isinstance(sample_inputs, list) else [sample_inputs]
    for k, s in enumerate(samples):
        s = tuple(s) if isinstance(s, (tuple, list)) else (s,)
        if len(s) != len(specs):
            raise ValueError(
                f"sample {k} has {len(s)} inputs; the model takes {len(specs)} ({[x.name for x in specs]})"
            )
        bound: dict[str, int] = {}
        for spec, a in zip(specs, s):
            shape = tuple(int(d) for d in getattr(a, "shape", ()))
            if len(shape) != spec.type.rank:
                raise ValueError(
                    f"sample {k} input {spec.name!r} has rank {len(shape)}, the model expects {spec.type.rank}"
                )
            for axis, (want, got) in enumerate(zip(spec.type.shape, shape)):
                if isinstance(want, int):
                    if want != got:
                        raise ValueError(
                            f"sample {k} input {spec.name!r} axis {axis} is {got}; the model fixes it at {want}"
                        )
                    continue
                r = env.range_of(want.name)
                if got < r.min or (r.max is not None and got > r.max):
                    raise ValueError(f"sample {k} input {spec.name!r} axis {axis} ({want}) is {got}, outside {r}")
                if bound.setdefault(want.name, got) != got:
                    raise ValueError(
                        f"sample {k}: dim {want} is {bound[want.name]} in one input and {got} in {spec.name!r}"
                    )


def _upgrade(m: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Models older than MIN_OPSET are converted with onnx's version converter (the converters here
    follow opset 13 and newer semantics); one it cannot convert is refused."""
    opset = default_opset(m)
    if opset >= MIN_OPSET:
        return m, opset
    try:
        from onnx import version_converter

        up = version_converter.convert_version(m, MIN_OPSET)
    except Exception as e:
        raise OnnxModelError(
            f"the model uses opset {opset}; bladepack reads opset {MIN_OPSET} and newer, and onnx's version "
            f"converter could not upgrade it: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None
    return up, default_opset(up)


def import_onnx(model: Any, sample_inputs: Any = None, dynamic_shapes: Any = None) -> Program:
    m = load_model(model)
    m, opset = _upgrade(m)
    env = ShapeEnv()
    specs = _inputs(m, env, dynamic_shapes)
    check_samples(specs, env, sample_inputs)
    ctx = OnnxCtx(GraphBuilder(), env, opset)
    values: dict[str, OVal] = {}
    problems: list[tuple[str, str]] = []
    for spec in specs:
        values[spec.name] = OVal(spec.type, ctx.b.add_input(spec.name, spec.type))
    for t in m.graph.initializer:
        try:
            dt = dtype_of(t.data_type)
            values[t.name] = known(numpy_helper.to_array(t), dt)
        except Unsupported as e:
            problems.append((f"initializer {t.name!r}: {e}", "initializers"))
    poisoned: set[str] = set()
    for index, node in enumerate(m.graph.node):
        _convert_node(ctx, node, index, values, poisoned, problems)
    outputs, names = [], []
    for o in m.graph.output:
        v = values.get(o.name)
        if o.name in poisoned:
            continue  # its producer is reported already
        if v is None:
            problems.append((f"output {o.name!r} is not produced by any node", "model outputs"))
            continue
        try:
            outputs.append(ctx.tensor(v))
        except Unsupported as e:
            problems.append((f"output {o.name!r}: {e}", "model outputs"))
        names.append(o.name)
    if problems:
        raise UnsupportedOpsError(problems)
    graph = ctx.b.finish(tuple(outputs), tuple(names))
    structure = "single" if len(outputs) == 1 else "tuple"
    return Program(graph, env, dict(ctx.weight_data), structure, tuple(ctx.assertions))


def _where(node: onnx.NodeProto, index: int, scope: str = "") -> str:
    own = f"node {node.name!r}" if node.name else f"node #{index} ({node.op_type} -> {', '.join(node.output)})"
    return f"{scope} {own}" if scope else own


def _convert_node(
    ctx: OnnxCtx,
    node: onnx.NodeProto,
    index: int,
    values: dict[str, OVal],
    poisoned: set[str],
    problems: list[tuple[str, str]],
    scope: str = "",
) -> None:
    where = _where(node, index, scope)
    label = f"{node.op_type} (opset {ctx.opset})" if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
    if any(i in poisoned for i in node.input if i):
        poisoned.update(node.output)
        return
    missing = [i for i in node.input if i and i not in values]
    if missing:
        problems.append((f"{label}: inputs {missing} are produced by no earlier node", where))
        poisoned.update(node.output)
        return
    ins: list[OVal | None] = [values[i] if i else None for i in node.input]
    ctx.node, ctx.loc = node, f"{where} [{node.op_type}]"
    ctx.attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    try:
        if node.domain not in ("", "ai.onnx") or node.op_type not in TABLE.keys() | CONTROL_FLOW:
            raise Unsupported("no converter")
        outs: list[OVal | None] | None
        if node.op_type in ("If", "Loop"):  # Note [Inlined branches], Note [Unrolled loops] in control_flow.py
            reads_poisoned = False

            def branch_node(inner: onnx.NodeProto, k: int, at: str, scope: dict[str, OVal]) -> None:
                nonlocal reads_poisoned
                reads_poisoned |= any(i in poisoned for i in inner.input if i)
                _convert_node(ctx, inner, k, scope, poisoned, problems, at)

            reported = len(problems)
            unroll = unroll_loop if node.op_type == "Loop" else inline_if
            outs = unroll(ctx, node, ins, values, branch_node)
            ctx.node, ctx.loc = node, f"{where} [{node.op_type}]"
            if len(problems) > reported or reads_poisoned:  # reported already: poison, add nothing
                poisoned.update(node.output)
                return
        elif _foldable(node, ins):
            outs = _fold(ctx, node, ins)
        else:
            outs = None
        if outs is None:
            outs = TABLE[node.op_type](ctx, ins)
    except Unsupported as e:
        problems.append((f"{label}: {e}" if str(e) else label, where))
        poisoned.update(node.output)
        return
    except Exception as e:  # a converter's own failure: reported with the node, never as a raw traceback
        problems.append((f"{label}: internal error in its converter ({type(e).__name__}: {e}); a bladepack bug", where))
        poisoned.update(node.output)
        return
    for k, name in enumerate(node.output):
        if not name:
            continue
        v = outs[k] if k < len(outs) else None
        if v is None:
            poisoned.add(name)
            problems.append((f"{label}: output {k} ({name!r}) is not supported", where))
        else:
            values[name] = v


def _foldable(node: onnx.NodeProto, ins: list[OVal | None]) -> bool:
    return (
        node.op_type in FOLDABLE
        and all(v is None or v.numeric is not None for v in ins)
        and any(v is not None for v in ins)
    )


def _fold(ctx: OnnxCtx, node: onnx.NodeProto, ins: list[OVal | None]) -> list[OVal | None] | None:
    """Run a node whose operands are all known with the onnx reference implementation; None when the
    result is too large to keep as a constant (the converter emits run-time ops instead)."""
    feeds = {name: v.numeric for name, v in zip(node.input, ins) if name and v is not None}
    try:
        results = ReferenceEvaluator(node, opsets={"": ctx.opset}).run(None, feeds)
    except Exception as e:
        raise Unsupported(f"evaluating it on its constant inputs failed: {e}") from None
    biggest_in = max((v.numeric.size for v in ins if v is not None and v.numeric is not None), default=0)
    if any(np.asarray(r).size > max(FOLD_LIMIT, biggest_in) for r in results):
        return None
    outs: list[OVal | None] = []
    for r in results:
        outs.append(known(np.asarray(r)))
    return outs
