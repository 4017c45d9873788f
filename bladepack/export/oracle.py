"""The model itself as the oracle for reference cases (Note [Reference cases]): torch eager.

In: the nn.Module that was exported. Out: a function from input arrays to output arrays, run as export
ran the model (eval mode, no KV-cache object, no autograd) with the outputs flattened as torch.export
flattens them (pytree leaves: tuples, lists, dicts, Hugging Face ModelOutputs).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from bladepack.export.capture import eval_mode, no_cache_object


def torch_oracle(model: torch.nn.Module) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        args = [torch.from_numpy(np.ascontiguousarray(a).reshape(a.shape)) for a in arrays]
        with eval_mode(model), no_cache_object(model, []), torch.no_grad():
            out = model(*args)
        leaves = torch.utils._pytree.tree_leaves(out)
        return [x.detach().contiguous().numpy() for x in leaves if isinstance(x, torch.Tensor)]

    return run
