"""The model itself as the oracle for reference cases (Note [Reference cases]): torch eager.

In: the nn.Module that was exported. Out: a function from input arrays to output arrays, run as export
ran the model (eval mode, no KV-cache object, no autograd) with the outputs flattened as torch.export
flattens them (pytree leaves: tuples, lists, dicts, Hugging Face ModelOutputs).

Note [Orders the model leaves open]: torch.sort without stable=True and torch.topk give tied
elements in an unspecified order (eager's CPU sort reorders ties in long lines), and the artifact
gives the stable one (Note [Sort kernel]). Both are the model's answer; a case recorded with eager's
order would fail the self-check on a correct artifact. The oracle therefore runs sort, argsort and
topk in their stable form (topk as the first k of a stable sort: NaN ranks largest in both).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from bladepack.export.capture import eval_mode, no_cache_object

_SORTS = {torch.sort, torch.Tensor.sort, torch.argsort, torch.Tensor.argsort}
_TOPKS = {torch.topk, torch.Tensor.topk}


class _StableOrders(torch.overrides.TorchFunctionMode):
    """Note [Orders the model leaves open]."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = dict(kwargs or {})
        if func in _SORTS:  # (input, dim, descending, stable): the stable form takes them by keyword
            kwargs = {**dict(zip(("dim", "descending"), args[1:3])), **kwargs, "stable": True}
            args = args[:1]
        elif func in _TOPKS:
            return _stable_topk(*args, **kwargs)
        return func(*args, **kwargs)


def _stable_topk(
    x: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True, *, out: object = None
) -> tuple[torch.Tensor, torch.Tensor]:
    del sorted, out  # sorted either way (an unsorted topk leaves the order open too)
    values, indices = torch.sort(x, dim=dim, descending=largest, stable=True)
    return torch.return_types.topk((values.narrow(dim, 0, k), indices.narrow(dim, 0, k)))


def torch_oracle(model: torch.nn.Module) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        args = [torch.from_numpy(np.ascontiguousarray(a).reshape(a.shape)) for a in arrays]
        with eval_mode(model), no_cache_object(model, []), torch.no_grad(), _StableOrders():
            out = model(*args)
        leaves = torch.utils._pytree.tree_leaves(out)
        return [x.detach().contiguous().numpy() for x in leaves if isinstance(x, torch.Tensor)]

    return run
