"""The model itself as the oracle for reference cases (Note [Reference cases]): torch eager.

In: the nn.Module that was exported. Out: a function from input arrays to output arrays, run as export
ran the model (eval mode, no KV-cache object, no autograd) with the outputs flattened as torch.export
flattens them (pytree leaves: tuples, lists, dicts, Hugging Face ModelOutputs).

Note [Orders the model leaves open]: torch.sort without stable=True and torch.topk give tied
elements in an unspecified order (eager's CPU sort reorders ties in long lines), and the artifact
gives the stable one (Note [Sort kernel]). Both are the model's answer; a case recorded with eager's
order would fail the self-check on a correct artifact. The oracle therefore runs sort, argsort and
topk in their stable form (topk as the first k of a stable sort: NaN ranks largest in both).

Note [Conditioned cases] (bladepack/reference_record.py): where the model orders values (sort, top-k,
argmax, max along a dim, ...), the call runs again in a float64 twin of the model (its floating
parameters, buffers and inputs in float64; `torch.func.functional_call`, the model untouched), and a
case whose orders lie within rounding of a tie raises IllConditionedCase. A twin that cannot run
(a model that fixes its own dtypes), or one whose float64 state would exceed TWIN_CAP bytes, leaves the
case as it is.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bladepack.errors import IllConditionedCase
from bladepack.export.capture import eval_mode, no_cache_object
from bladepack.ir.order_margins import OrderCall, OrderLog, ill_conditioned

TWIN_CAP = 2 << 30  # bytes of float64 parameters and buffers the twin may hold
_SORTS = {torch.sort, torch.Tensor.sort, torch.argsort, torch.Tensor.argsort}
_TOPKS = {torch.topk, torch.Tensor.topk}
_ORDERS = {
    f: f.__name__
    for f in (
        *_SORTS,
        *_TOPKS,
        torch.argmax,
        torch.Tensor.argmax,
        torch.argmin,
        torch.Tensor.argmin,
        torch.max,
        torch.Tensor.max,
        torch.min,
        torch.Tensor.min,
    )
}


class _StableOrders(torch.overrides.TorchFunctionMode):
    """Note [Orders the model leaves open]; each order decision, and every op that reads its indices,
    goes to `log` (Note [Conditioned cases]), with its values for the decisions numbered in `keep`."""

    def __init__(self, log: OrderLog, keep: frozenset[int]) -> None:
        super().__init__()
        self.log = log
        self.keep = keep

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = dict(kwargs or {})
        if self.log.indices:
            self.log.read(torch.utils._pytree.tree_leaves((args, kwargs)))
        keep = len(self.log.calls) in self.keep
        call = order_call(_ORDERS[func], tuple(args), kwargs, keep) if func in _ORDERS else None
        if func in _SORTS:  # (input, dim, descending, stable): the stable form takes them by keyword
            kwargs = {**dict(zip(("dim", "descending"), args[1:3])), **kwargs, "stable": True}
            args = args[:1]
        out = _stable_topk(*args, **kwargs) if func in _TOPKS else func(*args, **kwargs)
        if call is not None:
            self.log.decided(call, out if isinstance(out, torch.Tensor) else out[1])
        return out


def order_call(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], keep: bool = True) -> OrderCall | None:
    """The decision of a torch call `name` (sort, argsort, topk, argmax, argmin, max, min) with these
    arguments, its values as float64 when `keep`; or None where it decides no order (max of a whole
    tensor, max of two tensors)."""
    x = args[0] if args else kwargs.get("input")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return None  # integer values round nowhere
    rest = args[1:]
    values, shape = (_values(x) if keep else None), tuple(x.shape)

    def arg(i: int, key: str, default: Any) -> Any:
        return rest[i] if len(rest) > i else kwargs.get(key, default)

    if name in ("sort", "argsort"):
        dim = arg(0, "dim", -1)
        return OrderCall(name, values, shape, int(dim), None, bool(arg(1, "descending", False)))
    if name == "topk":
        k, dim = arg(0, "k", 1), arg(1, "dim", -1)
        return OrderCall(name, values, shape, int(dim), int(k), bool(arg(2, "largest", True)))
    if name in ("argmax", "argmin"):
        dim = arg(0, "dim", None)
        return OrderCall(name, values, shape, None if dim is None else int(dim), 1, name == "argmax")
    if name in ("max", "min"):
        dim = arg(0, "dim", None)
        if isinstance(dim, bool) or not isinstance(dim, int):
            return None  # the whole tensor's extreme (a value only), or the elementwise form
        return OrderCall(name, values, shape, dim, 1, name == "max")
    return None


def _values(x: torch.Tensor) -> np.ndarray:
    """An order op's values as float64 (exact for every floating dtype; a copy)."""
    return x.detach().to(torch.float64).numpy(force=True).copy()


def _stable_topk(
    x: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True, *, out: object = None
) -> tuple[torch.Tensor, torch.Tensor]:
    del sorted, out  # sorted either way (an unsorted topk leaves the order open too)
    values, indices = torch.sort(x, dim=dim, descending=largest, stable=True)
    return torch.return_types.topk((values.narrow(dim, 0, k), indices.narrow(dim, 0, k)))


def torch_oracle(model: torch.nn.Module) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """Note [Conditioned cases]: a call logs its order decisions and which of them the model used;
    where it used one, the call runs again keeping those decisions' values, and so does its float64
    twin (the values of unused decisions, a softmax's row maxima over attention scores, are never
    copied or held)."""
    twin: dict[str, torch.Tensor] = {}  # the float64 parameters and buffers, made at the first order

    def call(
        args: list[torch.Tensor], state: dict[str, torch.Tensor] | None, keep: frozenset[int]
    ) -> tuple[list[torch.Tensor], OrderLog]:
        log = OrderLog()
        with eval_mode(model), no_cache_object(model, []), torch.no_grad(), _StableOrders(log, keep):
            out = model(*args) if state is None else torch.func.functional_call(model, state, tuple(args))
        leaves = [x for x in torch.utils._pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]
        log.read(leaves)
        return leaves, log

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        args = [torch.from_numpy(np.ascontiguousarray(a).reshape(a.shape)) for a in arrays]
        out, log = call(args, None, frozenset())
        if log.used and (twin or _twin_bytes(model) <= TWIN_CAP):
            if not twin:
                twin.update(_float64_state(model))
            why = _twin_verdict(call, args, twin, frozenset(log.used))
            if why is not None:
                raise IllConditionedCase(why)
        return [x.detach().contiguous().numpy() for x in out]

    return run


def _twin_bytes(model: torch.nn.Module) -> int:
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * (8 if t.is_floating_point() else t.element_size()) for t in tensors)


def _float64_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return {k: v.detach().double() if v.is_floating_point() else v for k, v in state.items()}


def _twin_verdict(
    call: Callable[
        [list[torch.Tensor], dict[str, torch.Tensor] | None, frozenset[int]], tuple[list[torch.Tensor], OrderLog]
    ],
    args: list[torch.Tensor],
    state: dict[str, torch.Tensor],
    used: frozenset[int],
) -> str | None:
    """Note [Conditioned cases]: why the call's `used` decisions depend on rounding, or None (also when
    the float64 twin cannot run: the model fixes its own dtypes somewhere)."""
    _, log = call(args, None, used)
    wide = [a.double() if a.is_floating_point() else a for a in args]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, twin_log = call(wide, state, used)
    except Exception:  # the user's model in a dtype it was not written for: anything may go wrong
        return None
    return ill_conditioned(log, twin_log)
