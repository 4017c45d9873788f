"""torch.export program → bladepack IR `Program`.

In: a `Captured` export (symbolic dims; the training IR or its retrace, inference_ir.py). Out: an IR
`Program`: graph, shape environment (one bladepack symbol per torch symbol, with ranges), weight
arrays and the runtime assertions torch recorded. Every unsupported op is collected with its source
location and reported at once in `UnsupportedOpsError`.
"""

from __future__ import annotations

import operator
import os
import re
from dataclasses import replace
from typing import Any

import numpy as np
import sympy
import torch
from torch.export.graph_signature import InputKind

from bladepack.errors import UnsupportedOpsError
from bladepack.export import (  # noqa: F401  (registers converters)
    ops_conv,
    ops_core,
    ops_elementwise,
    ops_indexed,
    ops_layout,
    ops_nn,
    ops_resize,
    ops_sampling,
    ops_scatter,
    recurrent,
    selective_scan,
)
from bladepack.export.capture import Captured
from bladepack.export.context import TABLE, Ctx, Unsupported, dtype_of
from bladepack.export.control_flow import inline_cond
from bladepack.export.core_aten import REASONS
from bladepack.export.inference_ir import retraced
from bladepack.ir import GraphBuilder, Program, ShapeEnv, TensorType

# Nodes that carry no tensor computation at inference time.
_IGNORED = {
    "aten._assert_tensor_metadata.default",
    "aten.sym_constrain_range_for_size.default",
    "aten.sym_constrain_range.default",
    "aten._assert_async.msg",
}


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def source_location(node: torch.fx.Node) -> str:
    """`file.py:LINE in fn` of the user code that produced the node, plus the op name."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\w+)\n\s*(.*)', trace)
    target = str(node.target)
    if frames:
        # the innermost frame of the model's code: torch's own modules (nn.Embedding.forward's
        # F.embedding call, conv.py) are where every model's op is issued, not where it is written
        # (and fx's generated code, `<eval_with_key>.N`, which torch.cond's tracing leaves innermost)
        own = [f for f in frames if not f[0].startswith((_TORCH_DIR, "<eval_with_key>"))]
        path, line, fn, code = (own or frames)[-1]
        return f"{path.split('/')[-1]}:{line} in {fn}: {code.strip()} [{target}]"
    stack = node.meta.get("nn_module_stack")
    if stack:
        return f"{list(stack.values())[-1][0] or 'model'} [{target}]"
    return f"node {node.name} [{target}]"


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # kept as bit patterns: numpy has no bfloat16 (see artifact/writer.py)
        return t.view(torch.int16).numpy().view(np.uint16).copy()
    return t.numpy().copy()


def to_program(cap: Captured) -> Program:
    """The program of a captured export. Note [Training IR as it is]: a program taken as exported that
    the converters refuse is converted again after torch's retrace (a torch whose retrace decomposes
    a composite the rule keeps), so what converted with the retrace still converts; the retrace's
    refusal is the one reported."""
    try:
        return _program(cap)
    except UnsupportedOpsError:
        if not cap.as_exported:
            raise
    return _program(replace(cap, program=retraced(cap.program), as_exported=False))


def _program(cap: Captured) -> Program:
    ep = cap.program
    env = ShapeEnv()
    symbols: dict[str, sympy.Symbol] = {}
    for torch_sym, info in sorted(cap.symbols.items(), key=lambda kv: kv[1].name):
        if info.name in [s.name for s in env.symbols]:
            symbols[torch_sym] = env.symbol(info.name)
        else:
            symbols[torch_sym] = env.create_symbol(info.name, info.min, info.max)
    ctx = Ctx(GraphBuilder(), env, symbols)
    problems: list[tuple[str, str]] = []
    poisoned: set[torch.fx.Node] = set()
    state = {**ep.state_dict, **ep.constants}
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
    user_index = 0
    branches: dict[torch.fx.Node, torch.fx.GraphModule] = {}  # get_attr nodes naming torch.cond branches

    def convert(node: torch.fx.Node, owner: torch.fx.GraphModule) -> None:
        """One node of the program (or of a branch inlined from it, owned by `owner`)."""
        ctx.node, ctx.loc = node, source_location(node)
        if node.op == "get_attr":  # Note [Inlined torch.cond]: only the cond that names it reads it
            branches[node] = getattr(owner, str(node.target))
            return
        if node.op != "call_function":
            problems.append((f"{node.op} {node.target}", ctx.loc))
            return
        if any(a in poisoned for a in node.all_input_nodes):
            poisoned.add(node)
            return
        target = str(node.target)
        try:
            if node.target is torch.ops.higher_order.cond:
                reported, loc = len(problems), ctx.loc
                results = inline_cond(ctx, node, branches, convert)
                ctx.node, ctx.loc = node, loc
                if len(problems) > reported or any(r is None for r in results):
                    poisoned.add(node)  # its branch's problems are reported already
                    return
                ctx.values[node] = results
                return
            _convert_node(ctx, node, target, node.meta.get("val"))
        except Unsupported as e:
            name = target if target in TABLE else f"{target} ({REASONS.get(target, 'no converter')})"
            name = "torch.cond" if node.target is torch.ops.higher_order.cond else name
            detail = str(e)
            problems.append((name if not detail else f"{name}: {detail}", ctx.loc))
            poisoned.add(node)

    for node in _in_signature_order(ep):
        ctx.node, ctx.loc = node, source_location(node)
        val = node.meta.get("val")
        if node.op == "placeholder":
            spec = specs[node.name]
            if spec.kind == InputKind.USER_INPUT:
                if not isinstance(val, torch.Tensor):
                    problems.append((f"non-tensor input {node.name}", "model signature"))
                    continue
                ctx.values[node] = ctx.b.add_input(cap.input_names[user_index], ctx.type_of_val(val))
                user_index += 1
            elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                name = spec.target or node.name
                try:
                    ctx.weight_data[name] = _to_numpy(state[name])
                    t = TensorType(dtype_of(state[name].dtype), tuple(state[name].shape))
                except Unsupported as e:
                    problems.append((str(e), name))
                    poisoned.add(node)
                    continue
                ctx.values[node] = ctx.b.add_weight(name, t)
            else:
                problems.append((f"input kind {spec.kind.name}", node.name))
            continue
        if node.op == "output":
            continue
        convert(node, ep.graph_module)
    if problems:
        raise UnsupportedOpsError(problems)
    for cond, code, text in cap.guards:  # Note [Input guards]
        ctx.node, ctx.loc = None, "torch.export"
        ctx.assume(ctx.expr(cond), f"the model was traced where {text} (torch.export's guard `{code}`)")
    outputs, names = _outputs(ctx, ep)
    graph = ctx.b.finish(tuple(outputs), tuple(names))
    structure = "tuple" if not ep.call_spec.out_spec.is_leaf() else "single"
    limits: dict[str, tuple[int, int | None]] = {}
    for info in cap.symbols.values():  # the traced graph holds on [min, model_max] (SymbolInfo)
        hi, prev = info.model_max, limits.get(info.name, (0, None))[1]
        if prev is not None:
            hi = prev if hi is None else min(hi, prev)
        limits[info.name] = (env.range_of(info.name).min, hi)
    return Program(graph, env, dict(ctx.weight_data), structure, tuple(ctx.assertions), limits)


_INPUT_ORDER = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR, InputKind.USER_INPUT)


def _in_signature_order(ep: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    """The program's nodes, placeholders first as parameters, buffers, constants, user inputs (the
    order of torch's retrace; the training IR may list a lifted constant before the buffers), so the
    weights' order does not depend on Note [Training IR as it is]."""
    kinds = {s.arg.name: s.kind for s in ep.graph_signature.input_specs}
    nodes = list(ep.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    rank = {k: i for i, k in enumerate(_INPUT_ORDER)}
    placeholders.sort(key=lambda n: rank.get(kinds.get(n.name), len(rank)))  # type: ignore[arg-type]
    return placeholders + [n for n in nodes if n.op != "placeholder"]


def _convert_node(ctx: Ctx, node: torch.fx.Node, target: str, val: Any) -> None:
    if target in _IGNORED:
        return
    if node.target is torch.ops.aten._assert_scalar.default:
        cond = node.args[0]
        expr = ctx.syms.get(cond) if isinstance(cond, torch.fx.Node) else sympy.sympify(bool(cond))
        if expr is None:
            raise Unsupported("runtime assertion on a data-dependent value")
        ctx.assume(expr, str(node.args[1]) if len(node.args) > 1 else "runtime assertion")
        return
    if node.target is operator.getitem:
        src = ctx.values.get(node.args[0])  # type: ignore[arg-type]
        if isinstance(src, tuple):
            item = src[node.args[1]]  # type: ignore[index]
            if item is None:
                raise Unsupported(f"result {node.args[1]} of {node.args[0]} (only the primary result is supported)")
            ctx.values[node] = item
            return
    if isinstance(val, (torch.SymInt, torch.SymBool, int, bool)) and not isinstance(val, torch.Tensor):
        ctx.syms[node] = ctx.expr(val.node.expr if isinstance(val, (torch.SymInt, torch.SymBool)) else val)
        return
    if isinstance(val, torch.SymFloat):
        raise Unsupported("symbolic float values")
    conv = TABLE.get(target)
    if conv is None and isinstance(val, torch.Tensor) and not node.all_input_nodes:
        ctx.values[node] = _fold_constant(ctx, node)
        return
    if conv is None:
        raise Unsupported("")
    ctx.values[node] = conv(ctx, tuple(node.args), dict(node.kwargs))


def _fold_constant(ctx: Ctx, node: torch.fx.Node) -> int:
    """A tensor factory with only constant arguments (linspace, eye, ...) runs now; its value becomes a
    weight. Its shape must be static: a factory sized by a symbol needs a converter."""
    val = node.meta["val"]
    if not all(isinstance(d, int) for d in val.shape):
        raise Unsupported("a tensor factory with a symbolic size")
    with torch.no_grad():
        data = node.target(*node.args, **node.kwargs)  # type: ignore[operator]
    name = f"constant:{node.name}"
    ctx.weight_data[name] = _to_numpy(data)
    return ctx.b.add_weight(name, TensorType(dtype_of(data.dtype), tuple(data.shape)))


def output_names(spec: Any) -> list[str]:
    """Per output leaf of torch's output tree: its keys joined by dots where the model returns a dict
    or a Hugging Face ModelOutput (`last_hidden_state`, `hidden_states.1`), else `output<k>`."""
    paths: list[list[str | int]] = []

    def walk(s: Any, path: list[str | int]) -> None:
        if s.is_leaf():
            paths.append(path)
            return
        children = list(s.children()) if hasattr(s, "children") else list(s.children_specs)  # torch < 2.12
        keys = s.context if isinstance(s.context, (list, tuple)) and len(s.context) == len(children) else None
        for k, c in enumerate(children):
            walk(c, [*path, keys[k] if keys is not None and isinstance(keys[k], str) else k])

    walk(spec, [])
    names = [
        ".".join(str(p) for p in path) if any(isinstance(p, str) for p in path) else f"output{k}"
        for k, path in enumerate(paths)
    ]
    return names if len(set(names)) == len(names) else [f"output{k}" for k in range(len(names))]


def _outputs(ctx: Ctx, ep: torch.export.ExportedProgram) -> tuple[list[int], list[str]]:
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    specs = ep.graph_signature.output_specs
    outputs: list[int] = []
    for i, (a, spec) in enumerate(zip(out_node.args[0], specs)):
        if spec.kind != torch.export.graph_signature.OutputKind.USER_OUTPUT:
            continue
        if not isinstance(a, torch.fx.Node) or not isinstance(ctx.values.get(a), int):
            raise UnsupportedOpsError([(f"output {i} is not a tensor", "model outputs")])
        outputs.append(ctx.values[a])
    names = output_names(ep.call_spec.out_spec)
    if len(names) != len(outputs):
        names = [f"output{k}" for k in range(len(outputs))]
    return outputs, names
