"""torch.export's input guards as shape conditions of the program.

In: an ExportedProgram and the model's forward (for the names its guards use). Out: each guard as a
sympy condition over the program's input dims (torch's symbols), with its source text.

Note [Input guards]: where export could not prove the model over the declared ranges, capture falls
back to Dim.AUTO for the dims torch named (capture.py `_export_min1`). torch then accepts every guard
the trace needs — a dim's parity, `min(h // 4, w // 4) > 4` for a windowed attention's branch, a
padded size that must divide evenly — and keeps the ones that are no range only as the exported
module's own input checks (`ExportedProgram._guards_code`, Python source over `L['x'].size()[k]`). The
traced graph is the model only where they hold: at a shape that breaks one, eager takes another
branch. Each guard therefore becomes an assumption of the program (checked by the shape program at
every call, a ShapeGuardError naming it), so such a call is refused, never answered by the traced
branch. A guard this module cannot read fails the export with its text: dropping it would make the
artifact silently wrong where it fails.

A disequality (`e != c`) is not checked, nor a bound on one dim without a remainder in it (a
pool's `h // 2 >= 1`: the op's own check names it better). torch writes one wherever the trace took a size's general
path — its size-1 specialization (`(w - 1) // 2 + 1 != 1` behind every strided convolution), a
ViT's `num_patches != 16` where the table's own size skips an interpolation that is the identity
there — and the general path computes those sizes right: checked, they refused a CNN's width 1 to 2
and a ViT at its native resolution. A model whose result at one isolated size truly differs (a
branch on `x.shape[1] == 3`) is not caught by this; the reference cases' self-check compares such
sizes where its draws reach them.

Note [Remainder guards]: a guard on one dim with a remainder in it (`h % 4 == 0`: Swin's patches and
windows, a parity branch) holds over no range, so a named Dim export fails on it, in the plain and in
the size-oblivious mode, before the fallback succeeds. The discovery export already holds the guard:
capture reads it there (`broken_guards`, from the guards that read one input dim) and exports such
dims with Dim.AUTO at once. A disequality on one dim that the range breaks (`(w - 1) // 2 + 1 != 1`
behind a stride-2 convolution, from w = 1) fails the plain named export the same way, where the
size-oblivious one succeeds: capture tries that mode first. Measured in fresh processes, capture of
EfficientNet-B0 7.9 -> 6.9 s and of ResNet-18 3.7 -> 3.3 s; a dynamic-size Swin's (about 70 s) did not
move measurably: its two failing traces are quick (12 s) and warm torch's caches for the third.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from bladepack.errors import ExportError
from bladepack.ir.shape_env import SymbolRange, interval

_DIM_READ = re.compile(r"L(?:\[[^\]]*\])+\.size\(\)\[\d+\]")  # an input dim as torch's guard source reads it
REMAINDER_PROBE = 64  # sizes from a range's start tried against a remainder guard (Note [Remainder guards])
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: sympy.floor(a / b),
    ast.Mod: lambda a, b: sympy.Mod(a, b),
    ast.Div: lambda a, b: a / b,
    ast.Pow: lambda a, b: a**b,
}
_CALLS: dict[str, Callable[..., Any]] = {
    "min": sympy.Min,
    "max": sympy.Max,
    "floor": sympy.floor,  # math.floor / math.ceil / int / float as torch prints a sym_float's use
    "ceil": sympy.ceiling,
    "int": lambda v: sympy.floor(v) if v.is_nonnegative else sympy.sign(v) * sympy.floor(abs(v)),
    "float": lambda v: v,
}
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: sympy.Eq,
    ast.NotEq: sympy.Ne,
    ast.Lt: sympy.Lt,
    ast.LtE: sympy.Le,
    ast.Gt: sympy.Gt,
    ast.GtE: sympy.Ge,
}


def input_guards(
    ep: torch.export.ExportedProgram, model: torch.nn.Module, symbols: Mapping[str, tuple[str, int, int | None]]
) -> list[tuple[sympy.Basic, str, str]]:
    """Note [Input guards]: per guard the symbol ranges do not already imply, (its condition over the
    placeholders' torch symbols, torch's source, the condition in bladepack's dim names). `symbols`:
    torch symbol -> (bladepack name, min, max)."""
    return [g for g in _conditions(ep, model, symbols) if not _unchecked(g[0])]


def _conditions(
    ep: torch.export.ExportedProgram,
    model: torch.nn.Module,
    symbols: Mapping[str, tuple[str, int, int | None]],
    one_dim: bool = False,
) -> list[tuple[sympy.Basic, str, str]]:
    """Every guard the ranges do not imply, disequalities and one-dim bounds included; `one_dim`: only
    guards whose source reads one input dim (read without sympy first: a Swin's run to kilobytes)."""
    codes = list(getattr(ep, "_guards_code", None) or [])
    if one_dim:
        codes = [c for c in codes if len(set(_DIM_READ.findall(c))) == 1]
    if not codes:
        return []
    shapes = _input_shapes(ep)
    roots = _roots(model, len(shapes))
    ranges = {sym: SymbolRange(lo, hi) for sym, (_, lo, hi) in symbols.items()}
    names = {sym: sympy.Symbol(name) for sym, (name, _, _) in symbols.items()}
    out: list[tuple[sympy.Basic, str, str]] = []
    for code in codes:
        try:
            cond = _Reader(shapes, roots).read(ast.parse(code, mode="eval").body)
        except (SyntaxError, _Unreadable) as e:
            raise ExportError(
                f"torch.export's input guard `{code}` cannot be read ({e}); the traced model holds only where it "
                "does, so bladepack refuses to build without it"
            ) from None
        for part in cond.args if isinstance(cond, sympy.And) else (cond,):
            if part is sympy.true or _implied(part, ranges):
                continue
            named = part.xreplace({s: names[s.name] for s in part.free_symbols if s.name in names})
            text = sympy.pycode(named, fully_qualified_modules=False).removeprefix("(").removesuffix(")")
            out.append((part, code, text))
    return out


@dataclass(frozen=True)
class BrokenGuards:
    """Guards of a discovery export on one symbol that a size of its declared range breaks (Note
    [Remainder guards]), symbol -> the guard's text: with a remainder in it (`h % 4 == 0`), and
    disequalities (a stride-2 convolution's `(w - 1) // 2 + 1 != 1`, broken at w = 1 and 2)."""

    remainders: dict[str, str] = field(default_factory=dict)
    disequalities: dict[str, str] = field(default_factory=dict)


def broken_guards(
    ep: torch.export.ExportedProgram, model: torch.nn.Module, symbols: Mapping[str, tuple[str, int, int | None]]
) -> BrokenGuards:
    """Note [Remainder guards]: the guards of the discovery export `ep` on one symbol that a size among
    the first REMAINDER_PROBE of its declared range breaks. A guard that cannot be read answers nothing
    here (the final export's guards are read again)."""
    out = BrokenGuards()
    try:
        conditions = _conditions(ep, model, symbols, one_dim=True)
    except ExportError:
        return out
    for cond, _, text in conditions:
        free = cond.free_symbols
        if len(free) != 1:
            continue
        (sym,) = free
        if sym.name not in symbols:
            continue
        _, lo, hi = symbols[sym.name]
        top = lo + REMAINDER_PROBE - 1 if hi is None else min(hi, lo + REMAINDER_PROBE - 1)
        if not any(cond.subs(sym, v) is sympy.false for v in range(lo, top + 1)):
            continue
        if isinstance(cond, sympy.Ne):
            out.disequalities.setdefault(sym.name, text)
        elif cond.has(sympy.Mod):
            out.remainders.setdefault(sym.name, text)
    return out


def _unchecked(cond: sympy.Basic) -> bool:
    """A disequality, or a bound on one dim without a remainder in it (a window's `h // 2 >= 1`: the
    ops' own checks say it better, and the symbol's range holds what torch derived from it)."""
    if isinstance(cond, sympy.Ne):
        return True
    return (
        isinstance(cond, (sympy.GreaterThan, sympy.StrictGreaterThan, sympy.LessThan, sympy.StrictLessThan))
        and len(cond.free_symbols) == 1
        and not cond.has(sympy.Mod)
    )


def _implied(cond: sympy.Basic, ranges: dict[str, SymbolRange]) -> bool:
    """Whether the ranges alone make a comparison true (a range's own guard, `s >= 1`)."""
    rel = {
        sympy.GreaterThan: (1, 0),
        sympy.StrictGreaterThan: (1, 1),
        sympy.LessThan: (-1, 0),
        sympy.StrictLessThan: (-1, 1),
    }
    if type(cond) not in rel:
        return False
    sign, strict = rel[type(cond)]
    lo, _ = interval(sympy.expand(sign * (cond.lhs - cond.rhs)), ranges)
    return bool(lo > 0 if strict else lo >= 0)


class _Unreadable(Exception):
    pass


def _input_shapes(ep: torch.export.ExportedProgram) -> list[list[sympy.Expr]]:
    """The user inputs' dims as torch's sympy expressions (an int as an Integer), in argument order."""
    user = [
        s.arg.name
        for s in ep.graph_signature.input_specs
        if s.kind == torch.export.graph_signature.InputKind.USER_INPUT
    ]
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    shapes = []
    for name in user:
        dims = nodes[name].meta["val"].shape
        shapes.append([d.node.expr if isinstance(d, torch.SymInt) else sympy.Integer(int(d)) for d in dims])
    return shapes


def _roots(model: torch.nn.Module, n: int) -> dict[tuple[str, ...], int]:
    """The guard's spelling of each user input (`L['x']`: ("x",); `L['args'][1]`: ("args", 1)) -> its
    position among the program's inputs."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    named = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var = next((p.name for p in params if p.kind == p.VAR_POSITIONAL), "args")
    roots: dict[tuple[str, ...], int] = {(name,): k for k, name in enumerate(named[:n])}
    for k in range(len(named), n):
        roots[(var, str(k - len(named)))] = k
    return roots


class _Reader:
    """A guard's Python expression as a sympy condition."""

    def __init__(self, shapes: Sequence[Sequence[sympy.Expr]], roots: dict[tuple[str, ...], int]) -> None:
        self.shapes, self.roots = shapes, roots

    def read(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int)):
            return (
                sympy.true if node.value is True else sympy.false if node.value is False else sympy.Integer(node.value)
            )
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](self.read(node.left), self.read(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self.read(node.operand)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return sympy.Not(self.read(node.operand))
        if isinstance(node, ast.BoolOp):
            parts = [self.read(v) for v in node.values]
            return sympy.And(*parts) if isinstance(node.op, ast.And) else sympy.Or(*parts)
        if isinstance(node, ast.Compare):
            terms = [self.read(node.left), *(self.read(c) for c in node.comparators)]
            pairs = [_COMPARE[type(op)](a, b) for op, a, b in zip(node.ops, terms, terms[1:]) if type(op) in _COMPARE]
            if len(pairs) != len(node.ops):
                raise _Unreadable("a comparison other than ==, !=, <, <=, >, >=")
            return sympy.And(*pairs)
        if isinstance(node, ast.Call) and not node.keywords:
            fn = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if fn in _CALLS:
                return _CALLS[fn](*(self.read(a) for a in node.args))
        if isinstance(node, ast.Subscript):
            return self._dim(node)
        raise _Unreadable(f"{type(node).__name__} `{ast.unparse(node)}`")

    def _dim(self, node: ast.Subscript) -> sympy.Expr:
        """`L[...].size()[k]` (a dim) or `L[...].stride()[k]` (a contiguous input's stride)."""
        call = node.value
        axis = node.slice
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr in ("size", "stride")
            and isinstance(axis, ast.Constant)
            and isinstance(axis.value, int)
        ):
            raise _Unreadable(f"`{ast.unparse(node)}`")
        shape = self.shapes[self._input(call.func.value)]
        k = axis.value
        if call.func.attr == "size":
            return shape[k]
        stride: sympy.Expr = sympy.Integer(1)  # the loaders take C-contiguous inputs only
        for d in shape[k + 1 :]:
            stride = stride * d
        return stride

    def _input(self, node: ast.expr) -> int:
        path: list[str] = []
        while isinstance(node, ast.Subscript):
            key = node.slice
            if not isinstance(key, ast.Constant):
                raise _Unreadable(f"`{ast.unparse(node)}`")
            path.append(str(key.value))
            node = node.value
        if not (isinstance(node, ast.Name) and node.id == "L"):
            raise _Unreadable(f"`{ast.unparse(node)}`")
        found = self.roots.get(tuple(reversed(path)))
        if found is None:
            raise _Unreadable(f"an input spelled {'.'.join(reversed(path))}")
        return found
