"""A `Program` as plain data (msgpack-able maps, lists, numbers, strings) and back.

In: a Program from a front end. Out: `encode_program` → (a map, the weight arrays by name);
`decode_program` → the same Program (printing it gives the same text; every dim, attribute and
assertion is the same sympy object). Artifacts keep their front-end program this way so that
`bladepack extend` can rebuild them without the model (Note [Extending an artifact] in extend.py).

Note [Expression encoding]: no expression is ever parsed or evaluated from text. A sympy expression
is a tree: a Python int stays an int; sympy.Integer n is {"i": n}; a symbol {"s": name} (a shape
symbol: integer, nonnegative, as ShapeEnv makes them); a rational {"q": [p, q]}; a float {"r": x};
true / false {"b": bool}; anything else {"f": class name, "a": [args]} for the classes in `_FUNCS`
only. An expression of another class is refused when encoding (`NotSerializable`), so a program
either round-trips exactly or is not kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import sympy

from bladepack.dtypes import DType
from bladepack.ir import ops
from bladepack.ir.graph import Graph, Guard, Node, Param, Program
from bladepack.ir.ops import OpKind
from bladepack.ir.shape_env import RangeFact, ShapeEnv, Tri
from bladepack.ir.types import TensorType

SCHEMA = 1
_FUNCS: dict[str, Any] = {
    c.__name__: c
    for c in (
        sympy.Add, sympy.Mul, sympy.Pow, sympy.Mod, sympy.floor, sympy.ceiling, sympy.Max, sympy.Min, sympy.Abs,
        sympy.Equality, sympy.Unequality, sympy.StrictLessThan, sympy.LessThan, sympy.StrictGreaterThan,
        sympy.GreaterThan, sympy.And, sympy.Or, sympy.Not,
    )
}  # fmt: skip
_ATTRS: dict[str, type] = {
    name: cls
    for name, cls in vars(ops).items()
    if isinstance(cls, type) and dataclasses.is_dataclass(cls) and name.endswith("Attrs")
}


class NotSerializable(ValueError):
    pass


def encode_expr(e: Any) -> Any:
    if isinstance(e, bool) or e is None or isinstance(e, (int, float, str)):
        return e
    if isinstance(e, sympy.Integer):
        return {"i": int(e)}
    if isinstance(e, sympy.Symbol):
        return {"s": e.name}
    if isinstance(e, sympy.Rational):
        return {"q": [int(e.p), int(e.q)]}
    if isinstance(e, sympy.Float):
        return {"r": float(e)}
    if e is sympy.true or e is sympy.false:
        return {"b": bool(e)}
    name = type(e).__name__
    if name not in _FUNCS or _FUNCS[name] is not e.func:
        raise NotSerializable(f"an expression of kind {name} ({e}) has no encoding")
    return {"f": name, "a": [encode_expr(a) for a in e.args]}


def decode_expr(v: Any, symbols: Mapping[str, sympy.Symbol]) -> Any:
    if not isinstance(v, dict):
        return v
    if "i" in v:
        return sympy.Integer(int(v["i"]))
    if "s" in v:
        return symbols[v["s"]]
    if "q" in v:
        return sympy.Rational(int(v["q"][0]), int(v["q"][1]))
    if "r" in v:
        return sympy.Float(float(v["r"]))
    if "b" in v:
        return sympy.true if v["b"] else sympy.false
    return _FUNCS[v["f"]](*(decode_expr(a, symbols) for a in v["a"]))


def _value(v: Any) -> Any:
    """An attribute value: scalars, sympy expressions, and tuples of them (as lists with a tag)."""
    if isinstance(v, tuple):
        return {"t": [_value(x) for x in v]}
    return encode_expr(v)


def _unvalue(v: Any, symbols: Mapping[str, sympy.Symbol]) -> Any:
    if isinstance(v, dict) and "t" in v:
        return tuple(_unvalue(x, symbols) for x in v["t"])
    return decode_expr(v, symbols)


def _type(t: TensorType) -> list[Any]:
    return [t.dtype.value, [encode_expr(d) for d in t.shape]]


def _untype(v: list[Any], symbols: Mapping[str, sympy.Symbol]) -> TensorType:
    return TensorType(DType(v[0]), tuple(decode_expr(d, symbols) for d in v[1]))


def _attrs(a: ops.Attrs) -> list[Any]:
    name = type(a).__name__
    if _ATTRS.get(name) is not type(a):
        raise NotSerializable(f"attributes of kind {name} have no encoding")
    return [name, {f.name: _value(getattr(a, f.name)) for f in dataclasses.fields(a)}]


def _fact(f: RangeFact) -> list[Any]:
    answer = list(f.answer) if isinstance(f.answer, tuple) else f.answer.value
    return [f.kind, encode_expr(f.a), encode_expr(f.b), answer]


def _unfact(v: list[Any], symbols: Mapping[str, sympy.Symbol]) -> RangeFact:
    kind, a, b, answer = v
    if kind not in ("le", "eq", "bounds"):
        raise ValueError(f"range fact of kind {kind!r}")
    return RangeFact(
        kind,
        decode_expr(a, symbols),
        decode_expr(b, symbols),
        (answer[0], answer[1]) if kind == "bounds" else Tri(answer),
    )


def encode_program(p: Program) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Raises NotSerializable for an expression or attribute kind outside the encoding."""
    g = p.graph
    env = p.shape_env
    nodes = []
    for n in g.nodes:
        row: list[Any] = [n.id, n.op.value, list(n.inputs), _attrs(n.attrs), _type(n.type), n.loc]
        if n.guard:
            row.append([[gd.pred, gd.taken] for gd in n.guard])
        nodes.append(row)
    data = {
        "schema": SCHEMA,
        "symbols": [[s.name, env.range_of(s).min, env.range_of(s).max] for s in env.symbols],
        "inputs": [[prm.name, prm.id, _type(prm.type)] for prm in g.inputs],
        "weights": [[prm.name, prm.id, _type(prm.type)] for prm in g.weights],
        "nodes": nodes,
        "outputs": list(g.outputs),
        "output_names": list(g.output_names),
        "output_structure": p.output_structure,
        "assertions": [[encode_expr(c), msg] for c, msg in p.assertions],
        "limits": {k: list(v) for k, v in sorted(p.limits.items())},
        "facts": [_fact(f) for f in env.facts],
    }
    return data, dict(p.weight_data)


def decode_program(
    data: Mapping[str, Any],
    weights: Mapping[str, np.ndarray],
    ranges: Mapping[str, tuple[int, int | None]] | None = None,
) -> tuple[Program, list[RangeFact]]:
    """The program `encode_program` wrote, with the symbol ranges in `ranges` replacing the recorded
    ones, and the range facts its front end relied on (Note [Range facts]). Raises ValueError
    (KeyError, TypeError) for data that is not such a program."""
    ranges = ranges or {}
    if data.get("schema") != SCHEMA:
        raise ValueError(f"program schema {data.get('schema')!r}; this bladepack reads {SCHEMA}")
    env = ShapeEnv()
    symbols = {}
    for name, lo, hi in data["symbols"]:
        lo, hi = ranges.get(name, (lo, hi))
        symbols[name] = env.create_symbol(name, lo, hi)

    def param(row: list[Any]) -> Param:
        return Param(row[0], int(row[1]), _untype(row[2], symbols))

    nodes = []
    for row in data["nodes"]:
        name, fields = row[3]
        attrs = _ATTRS[name](**{k: _unvalue(v, symbols) for k, v in fields.items()})
        guard = tuple(Guard(int(pr), bool(tk)) for pr, tk in (row[6] if len(row) > 6 else ()))
        nodes.append(Node(int(row[0]), OpKind(row[1]), tuple(row[2]), attrs, _untype(row[4], symbols), row[5], guard))
    graph = Graph(
        tuple(param(r) for r in data["inputs"]),
        tuple(param(r) for r in data["weights"]),
        tuple(nodes),
        tuple(data["outputs"]),
        tuple(data["output_names"]),
    )
    program = Program(
        graph,
        env,
        dict(weights),
        data["output_structure"],
        tuple((decode_expr(c, symbols), msg) for c, msg in data["assertions"]),
        {k: (int(v[0]), None if v[1] is None else int(v[1])) for k, v in data["limits"].items()},
    )
    facts = [_unfact(f, symbols) for f in data["facts"]]
    env.restore_facts(facts)
    return program, facts
