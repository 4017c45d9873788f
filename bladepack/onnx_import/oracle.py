"""The ONNX model itself as the oracle for reference cases (Note [Reference cases]): onnx's own
reference evaluator, independent of bladepack's kernels and of its numpy reference executor.

In: the model (a path or a ModelProto). Out: a function from input arrays (in graph-input order,
initializers excluded) to output arrays (in graph-output order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnx.reference.ops import op_grid_sample, op_gru, op_lstm, op_resize, op_rnn

from bladepack.errors import IllConditionedCase
from bladepack.ir.order_margins import OrderLog, ill_conditioned
from bladepack.onnx_import.model import load_model
from bladepack.onnx_import.oracle_orders import OrderNode, fetched, float64_twin, order_log, order_nodes


class Resize(op_resize.Resize):
    """Note [pytorch_half_pixel at one pixel]: the ONNX specification (and ONNX Runtime) maps an output
    axis of length 1 to input position 0 under pytorch_half_pixel; onnx's reference evaluator uses -0.5
    there, which a cubic kernel reads as a mix of the first two pixels (a 1x2 row resized to 1x1 gives
    0.83 * x0 + ... instead of x0). bladepack's kernels follow the specification (ir/interpolate.py), so
    the oracle must too: such axes are resized in a second pass with `asymmetric`, which maps output 0
    to position 0 whatever the scale (the first pass resizes the other axes as asked; linear and cubic
    resizing is separable, so the two passes give the one-pass result but for rounding). The class is
    named as the op it replaces: the evaluator matches `new_ops` by class name."""

    def _run(self, X, roi, scales=None, sizes=None, **attrs):  # type: ignore[no-untyped-def,override]
        out = super()._run(X, roi, scales, sizes, **attrs)
        y = out[0]
        ones = [k for k in range(X.ndim) if y.shape[k] == 1 and X.shape[k] != 1]
        if (
            not ones
            or attrs.get("coordinate_transformation_mode") != "pytorch_half_pixel"
            or attrs.get("mode") not in ("linear", "cubic")
            or attrs.get("antialias")
            or attrs.get("axes") is not None
        ):
            return out
        if scales is not None and len(scales):
            first = np.array([1.0 if k in ones else float(scales[k]) for k in range(X.ndim)], dtype=np.float32)
            (mid,) = super()._run(X, roi, first, None, **attrs)
        else:
            first_sizes = np.array([X.shape[k] if k in ones else y.shape[k] for k in range(X.ndim)], dtype=np.int64)
            (mid,) = super()._run(X, roi, None, first_sizes, **attrs)
        last = {**attrs, "coordinate_transformation_mode": "asymmetric"}
        return super()._run(mid, roi, None, np.array(y.shape, dtype=np.int64), **last)


def _per_sequence(run: Callable[..., Any], x: np.ndarray, lens: Any, states: list[Any], layout: int) -> Any:
    """Note [sequence_lens in the oracle]: each sequence run alone on its own steps, its Y zero past
    them and its states zero where it has none."""
    if lens is None:
        return run(x, states)
    outs = [np.zeros_like(o) for o in run(x, states)]
    steps = x.shape[1 if layout else 0]
    for b, n in enumerate(np.asarray(lens).ravel()):
        n = min(int(n), steps)
        if n <= 0:
            continue
        mine = run(
            x[b : b + 1, :n] if layout else x[:n, b : b + 1],
            [None if s is None else (s[b : b + 1] if layout else s[:, b : b + 1]) for s in states],
        )
        if layout:
            outs[0][b, :n] = mine[0][0]
        else:
            outs[0][:n, :, b] = mine[0][:, :, 0]
        for k in range(1, len(outs)):
            if layout:
                outs[k][b] = mine[k][0]
            else:
                outs[k][:, b] = mine[k][:, 0]
    return tuple(outs)


class LSTM(op_lstm.LSTM):
    """Note [sequence_lens in the oracle]: onnx's reference evaluator ignores an RNN's sequence_lens
    (its argument is unused), where the specification and ONNX Runtime stop each sequence at its
    length: Y is 0 past it and Y_h / Y_c are its states after its last step (0 for a length of 0). The
    three ops run each sequence alone through the evaluator's own implementation instead."""

    def _run(self, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, **attrs):  # type: ignore[no-untyped-def,override]
        base = super()._run
        return _per_sequence(
            lambda x, s: base(x, W, R, B, None, s[0], s[1], P, **attrs),  # type: ignore[no-untyped-call]
            X,
            sequence_lens,
            [initial_h, initial_c],
            int(getattr(self, "layout", 0) or 0),
        )


class GRU(op_gru.GRU):
    """Note [sequence_lens in the oracle]."""

    def _run(self, X, W, R, B=None, sequence_lens=None, initial_h=None, **attrs):  # type: ignore[no-untyped-def,override]
        base = super()._run
        layout = int(attrs.get("layout") or getattr(self, "layout", 0) or 0)
        return _per_sequence(lambda x, s: base(x, W, R, B, None, s[0], **attrs), X, sequence_lens, [initial_h], layout)  # type: ignore[no-untyped-call]


class RNN(op_rnn.RNN_14):
    """Note [sequence_lens in the oracle]."""

    def _run(self, X, W, R, B=None, sequence_lens=None, initial_h=None, **attrs):  # type: ignore[no-untyped-def,override]
        base = super()._run
        layout = int(attrs.get("layout") or getattr(self, "layout", 0) or 0)
        return _per_sequence(lambda x, s: base(x, W, R, B, None, s[0], **attrs), X, sequence_lens, [initial_h], layout)  # type: ignore[no-untyped-call]


class GridSample(op_grid_sample.GridSample):
    """onnx's evaluator knows opset 20's mode names only; opset 16's bilinear / bicubic are the same
    sampling under their old names."""

    def _run(self, X, grid, mode=None, padding_mode=None, align_corners=None):  # type: ignore[no-untyped-def]
        mode = mode or self.mode  # type: ignore[attr-defined]
        mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
        return super()._run(X, grid, mode=mode, padding_mode=padding_mode, align_corners=align_corners)  # type: ignore[no-untyped-call]


_NEW_OPS: list[type[OpRun]] = [Resize, LSTM, GRU, RNN, GridSample]


def onnx_oracle(model: Any) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """Note [Conditioned cases]: where the model's indices come from TopK / ArgMax / ArgMin, each case's
    decisions are judged against a float64 twin of the model (IllConditionedCase when one rests on
    rounding; a twin that cannot run leaves the case as it is)."""
    proto = load_model(model)
    evaluator = ReferenceEvaluator(proto, new_ops=_NEW_OPS)
    initializers = {t.name for t in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in initializers]
    outputs = [o.name for o in proto.graph.output]
    orders = order_nodes(proto)
    extra = fetched(orders)
    twin: list[ReferenceEvaluator | None] = []  # built at the first case that has a decision

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        with np.errstate(all="ignore"):  # the model's own arithmetic on generated data (a log of 0 is -inf)
            got = list(evaluator.run(outputs + extra, dict(zip(names, arrays))))
        outs = [np.asarray(o) for o in got[: len(outputs)]]
        log = order_log(orders, dict(zip(extra, got[len(outputs) :])))
        if log.used:
            why = _twin_verdict(proto, twin, names, arrays, extra, orders, log)
            if why is not None:
                raise IllConditionedCase(why)
        return outs

    return run


def _twin_verdict(
    proto: Any,
    twin: list[ReferenceEvaluator | None],
    names: list[str],
    arrays: list[np.ndarray],
    extra: list[str],
    orders: list[OrderNode],
    log: OrderLog,
) -> str | None:
    if not twin:
        wide = float64_twin(proto)
        try:
            twin.append(None if wide is None else ReferenceEvaluator(wide, new_ops=_NEW_OPS))
        except Exception:  # the evaluator refuses the widened model: nothing to judge by
            twin.append(None)
    if twin[0] is None:
        return None
    feeds = {n: a.astype(np.float64) if np.issubdtype(a.dtype, np.floating) else a for n, a in zip(names, arrays)}
    try:
        with np.errstate(all="ignore"):
            got = list(twin[0].run(extra, feeds))
    except Exception:  # an op of the widened model without a float64 form: nothing to judge by
        return None
    return ill_conditioned(log, order_log(orders, dict(zip(extra, got))))
