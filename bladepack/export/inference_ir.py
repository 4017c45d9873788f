"""The inference IR of an exported program: the program torch.export traced, or its retrace.

In: the `ExportedProgram` torch.export returned (its training IR). Out: a program the converters take:
the same program when nothing in it needs the retrace, else `run_decompositions`' inference IR.

Note [Training IR as it is]: `ep.run_decompositions(table)` retraces the whole program under fake
tensors (BERT-2L: 0.7 s of a 2.7 s warm optimize; a Swin: 15 s). With a table of only `_DECOMPOSED`,
what the retrace changes in a program is:
- functionalization: in-place ops and mutated inputs or buffers become functional forms;
- composite ops (CompositeImplicitAutograd) that may alias or mutate are decomposed: reshape and
  flatten become view or _unsafe_view, contiguous and eval dropout clone, to.* _to_copy (or nothing),
  eval batch_norm _native_batch_norm_legit_no_training, numpy_T permute, lift_fresh_copy goes; the
  functional composites (linear, conv2d, matmul, softmax, layer_norm, scaled_dot_product_attention,
  ...) are kept, as are all other (non-composite) ops;
- `_DECOMPOSED` ops go through torch's decompositions;
- dead nodes go.
The converters take each training form of `_TRAINING_FORMS` into the IR its decomposed form gives,
so a program whose ops are all functional and kept, or training forms, is converted as exported,
after dead code elimination (from_torch.py reads the placeholders in the retrace's order). Anything
else (an in-place op but those of Note [Fresh in-place ops], a mutated input or buffer, a
higher-order op such as torch.cond, a `_DECOMPOSED` op, a composite not listed, a dropout or batch
norm in training mode) gets the retrace, as every program did before; so does a program taken as
exported that the converters refuse (from_torch.to_program: another torch's retrace may decompose a
composite this rule keeps). The IR is the same either way but for source locations, which name the
op the model called (`[aten.batch_norm.default]`, not `[aten._native_batch_norm_legit_no_training
.default]`): scripts/artifact_digests.py's manifests differ in those strings only, and
tests/test_inference_ir.py converts programs both ways and compares.
"""

from __future__ import annotations

import operator
import warnings
from typing import Any

import torch

# Composite ops that the front end takes as torch decomposes them: einsum becomes permutes, views and
# batched matmuls (whose GEMMs then go to the GEMM library like any other).
_DECOMPOSED = ("einsum",)

# Composites the retrace decomposes (they may alias) whose training form the converters take as is,
# with the condition on the node (an argument index or keyword, and the value it must have).
_TRAINING_FORMS: dict[str, tuple[int, str, Any] | None] = {
    "aten.reshape.default": None,
    "aten.flatten.using_ints": None,
    "aten.contiguous.default": None,
    "aten.to.dtype": None,
    "aten.to.dtype_layout": None,
    "aten.to.device": None,
    "aten.to.other": None,
    "aten.numpy_T.default": None,
    "aten.lift_fresh_copy.default": None,
    "aten.detach_.default": None,  # in place on autograd state only (torch.tensor(...) in forward)
    "aten.dropout.default": (2, "train", False),
    "aten.feature_dropout.default": (2, "train", False),
    "aten.alpha_dropout.default": (2, "train", False),
    "aten.batch_norm.default": (5, "training", False),
}

# Python callables on symbolic sizes that both IRs hold (those this torch has)
_SIZE_FUNCTIONS = tuple(
    f
    for f in (
        operator.getitem, operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod,
        operator.neg, operator.truediv, operator.pow, operator.eq, operator.ne, operator.lt, operator.le,
        operator.gt, operator.ge, operator.and_, operator.or_,
        *(getattr(torch, n, None) for n in ("sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_sqrt", "sym_ite")),
    )
    if f is not None
)  # fmt: skip

# torch's tag for composites that may alias or mutate (None where this torch lacks it: then no
# composite is taken as kept, and programs with composites get the retrace)
_MAYBE_ALIASING = getattr(torch.Tag, "maybe_aliasing_or_mutating", None)


def inference_program(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """`ep` itself when Note [Training IR as it is] allows it (dead code eliminated in place), else
    its inference IR."""
    changed = functional_in_place(ep.graph)
    if retrace_reason(ep) is None:
        changed |= ep.graph.eliminate_dead_code()
        if changed:
            ep.graph_module.recompile()
        return ep
    if changed:
        ep.graph_module.recompile()
    return retraced(ep)


def retraced(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """torch's inference IR of the program (`run_decompositions` with `_DECOMPOSED`)."""
    defaults = torch.export.default_decompositions()
    table = {}
    for name in _DECOMPOSED:
        op = getattr(torch.ops.aten, name).default
        if op in defaults:
            table[op] = defaults[op]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out: torch.export.ExportedProgram = ep.run_decompositions(table)
        return out


def functional_in_place(graph: torch.fx.Graph) -> bool:
    """Note [Fresh in-place ops]: `t.add_(u)` where `t` is a fresh tensor (made by an op whose result
    aliases none of its arguments) that nothing else reads is `t.add(u)`: nothing else can see the
    write. Such nodes get their functional op when it has the same arguments and every tensor
    argument has `t`'s dtype or is boolean (a mask), so the functional op's type promotion cannot
    differ from the in-place op's cast. A T5's `scores += position_bias` and a Falcon's
    `mlp_output += attention_output` are of this kind. Returns whether any node changed."""
    changed = False
    for node in graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        functional = _functional_twin(target)
        if functional is None or not node.args or not isinstance(node.args[0], torch.fx.Node):
            continue
        fresh = node.args[0]
        if len(fresh.users) != 1 or not _makes_fresh_tensor(fresh):
            continue
        val = fresh.meta.get("val")
        tensors = [a.meta.get("val") for a in node.all_input_nodes]
        if not isinstance(val, torch.Tensor) or any(
            not isinstance(t, torch.Tensor) or t.dtype not in (val.dtype, torch.bool) for t in tensors
        ):
            continue
        node.target = functional
        changed = True
    return changed


def _functional_twin(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """`aten.add.Tensor` for `aten.add_.Tensor`: the in-place op writes its first argument only and
    the functional op takes the same arguments."""
    schema = op._schema
    name = op.overloadpacket.__name__
    if op.namespace != "aten" or not name.endswith("_") or name.startswith("_") or not schema.arguments:
        return None
    written = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if written != [schema.arguments[0]]:
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    twin = getattr(packet, schema.overload_name or "default", None) if packet is not None else None
    if not isinstance(twin, torch._ops.OpOverload) or twin._schema.is_mutable:
        return None
    same = [(a.name, str(a.type)) for a in twin._schema.arguments] == [(a.name, str(a.type)) for a in schema.arguments]
    return twin if same else None


def _makes_fresh_tensor(node: torch.fx.Node) -> bool:
    """The node is an op whose one tensor result aliases none of its arguments."""
    op = node.target
    if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload) or op._schema.is_mutable:
        return False
    returns = op._schema.returns
    return len(returns) == 1 and returns[0].alias_info is None


def retrace_reason(ep: torch.export.ExportedProgram) -> str | None:
    """Why the program needs torch's retrace (the first node or signature entry that does), or None."""
    sig = ep.graph_signature
    if sig.buffers_to_mutate or sig.user_inputs_to_mutate or getattr(sig, "parameters_to_mutate", None):
        return "the program mutates an input or a buffer"
    for node in ep.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op != "call_function":  # get_attr: a higher-order op's subgraph (torch.cond)
            return f"{node.name}: {node.op} {node.target}"
        reason = _node_reason(node)
        if reason is not None:
            return f"{node.name}: {reason}"
    return None


def _node_reason(node: torch.fx.Node) -> str | None:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return None if target in _SIZE_FUNCTIONS else f"{target} is no ATen op"
    name = str(target)
    if name in _TRAINING_FORMS:
        cond = _TRAINING_FORMS[name]
        if cond is None:
            return None
        index, key, want = cond
        got = node.args[index] if len(node.args) > index else node.kwargs.get(key, want)
        return None if got == want else f"{name} with {key}={got}"
    if target._schema.is_mutable:
        return f"{name} mutates"
    if target.namespace == "aten" and target.overloadpacket.__name__ in _DECOMPOSED:
        return f"{name} is decomposed"
    if _is_composite(target) and (target.namespace != "aten" or not _kept_composite(target)):
        return f"{name} is a composite the retrace decomposes"
    return None  # kept as it is (a custom op such as bladepack::recurrent_layer too)


def _is_composite(op: torch._ops.OpOverload) -> bool:
    """A CompositeImplicitAutograd kernel, in C++ or registered from Python."""
    key = torch._C.DispatchKey.CompositeImplicitAutograd
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(_qualified(op), key)) or key in op.py_kernels


def _qualified(op: torch._ops.OpOverload) -> str:
    """The dispatcher's name of the overload: aten::mul.Tensor."""
    schema = op._schema
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else str(schema.name)


def _kept_composite(op: torch._ops.OpOverload) -> bool:
    """What run_decompositions keeps of the composites: those known to be functional (no argument
    that aliases, not mutable, not tagged maybe-aliasing)."""
    schema = op._schema
    if any(a.alias_info is not None for a in schema.arguments) or schema.is_mutable:
        return False
    if any(r.alias_info is not None for r in schema.returns):
        return False
    if _MAYBE_ALIASING is None or _MAYBE_ALIASING in op.tags or op is torch.ops.aten.native_batch_norm.default:
        return False
    return str(op) not in _METADATA


# Queries of a tensor's metadata, which the retrace never keeps as ops (torch's FunctionalTensor.metadata_fns)
_METADATA = frozenset(
    f"aten.{name}"
    for name in (
        "dim.default", "is_contiguous.default", "is_contiguous.memory_format", "is_non_overlapping_and_dense.default",
        "is_strides_like_format.default", "numel.default", "size.default", "storage_offset.default", "stride.default",
        "sym_numel.default", "sym_size.default", "sym_storage_offset.default", "sym_stride.default",
    )
)  # fmt: skip
