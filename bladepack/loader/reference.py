"""The reference executor: every IR op implemented with numpy, one step at a time.

In: an op name, its input arrays, its attributes (symbolic ones already resolved to ints) and the
result's shape and dtype. Out: the result array. This is the oracle that generated kernels are
checked against, so clarity and accuracy beat speed: elementwise ops are the op table's numpy
references (opset/table.py: functions numpy lacks are computed in float64), and float16 values are
computed in float32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from bladepack.errors import IndexRangeError
from bladepack.opset import OP_INFO, packed_weights

Impl = Callable[[Sequence[np.ndarray], dict[str, Any], tuple[int, ...], np.dtype], np.ndarray]
OPS: dict[str, Impl] = {}


def op(*names: str) -> Callable[[Impl], Impl]:
    def register(fn: Impl) -> Impl:
        for n in names:
            OPS[n] = fn
        return fn

    return register


# --------------------------------------------------------------------------- elementwise


def _elementwise(fn: Callable[..., np.ndarray]) -> Impl:
    """An elementwise op from its numpy reference in the op table: fn(*inputs, **attrs), cast to the
    result dtype."""

    def impl(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(fn(*xs, **attrs)).astype(dt, copy=False)

    return impl


for _kind, _info in OP_INFO.items():
    if _info.numpy is not None:
        OPS[_kind.value] = _elementwise(_info.numpy)


# --------------------------------------------------------------------------- generators


@op("constant", "full")
def _full(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    return np.full(shape, attrs["value"], dtype=dt)


@op("arange")
def _arange(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    start, step = attrs["start"], attrs["step"]
    if isinstance(start, int) and isinstance(step, int):
        return (start + step * np.arange(shape[0], dtype=np.int64)).astype(dt)
    return (start + step * np.arange(shape[0], dtype=np.float64)).astype(dt)


# --------------------------------------------------------------------------- layout and indexing


@op("reshape")
def _reshape(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    return xs[0].reshape(shape)


@op("expand")
def _expand(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    return np.broadcast_to(xs[0], shape)


@op("permute")
def _permute(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    return np.transpose(xs[0], attrs["perm"])


@op("slice")
def _slice(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    axis, start, step = attrs["axis"], attrs["start"], attrs["step"]
    return np.take(xs[0], start + step * np.arange(shape[axis], dtype=np.int64), axis=axis)


@op("concat")
def _concat(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    return np.concatenate(list(xs), axis=attrs["axis"]).astype(dt, copy=False)


@op("take")
def _take(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    x, idx, axis = xs[0], xs[1], attrs["axis"]
    size = x.shape[axis]
    lowest = -size if attrs.get("wrap", True) else 0  # Note [Negative indices] in opset/attrs.py
    if idx.size and (idx.min() < lowest or idx.max() >= size):
        raise IndexRangeError(f"index out of range: indices must lie in [{lowest}, {size - 1}]")
    return np.take(x, idx, axis=axis)


@op("gather")
def _gather(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    x, idx, axis = xs[0], xs[1], attrs["axis"]
    key = tuple(slice(None) if d == axis else slice(0, idx.shape[d]) for d in range(x.ndim))
    size = x.shape[axis]
    lowest = -size if attrs.get("wrap", True) else 0
    if idx.size and (idx.min() < lowest or idx.max() >= size):
        raise IndexRangeError(f"gather index out of range: indices must lie in [{lowest}, {size - 1}]")
    return np.take_along_axis(x[key], idx, axis=axis)


_SCATTER_UFUNC = {"sum": np.add, "prod": np.multiply, "amax": np.maximum, "amin": np.minimum}


@op("scatter")
def _scatter(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    """ScatterAttrs: positions in index order, so the last of duplicates wins an assignment; a
    reduction combines in that order too (ufunc.at is unbuffered)."""
    x, idx, src, axis = xs[0], xs[1], xs[2], attrs["axis"]
    size = x.shape[axis] if x.ndim else 1
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        raise IndexRangeError(f"scatter index out of range: indices must lie in [0, {size - 1}]")
    out = np.array(x, dtype=dt, copy=True)
    if not idx.size:
        return out
    grid: list[Any] = list(np.indices(idx.shape, sparse=True))
    grid[axis] = idx
    where = tuple(grid)
    vals = np.broadcast_to(src, src.shape)[tuple(slice(0, d) for d in idx.shape)].astype(dt)
    reduce = attrs.get("reduce", "none")
    if reduce == "none":
        flat = np.ravel_multi_index(tuple(np.broadcast_to(g, idx.shape) for g in where), out.shape)
        np.put(out, flat.ravel(), vals.ravel())  # sequential: the last of duplicates wins
        return out
    ufunc = _SCATTER_UFUNC[reduce]
    if not attrs.get("include_self", True):
        identity: Any
        if out.dtype.kind == "f":
            identity = {"sum": 0.0, "prod": 1.0, "amax": -np.inf, "amin": np.inf}[reduce]
        else:
            info = np.iinfo(out.dtype)
            identity = {"sum": 0, "prod": 1, "amax": info.min, "amin": info.max}[reduce]
        out[where] = identity
    ufunc.at(out, where, vals)
    return out


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-x)))


@op("recurrent")
def _recurrent(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    """RecurrentAttrs (Note [Recurrent cells] in opset/attrs.py), step by step in float64."""
    xg, r, rb, h = (np.asarray(a, dtype=np.float64) for a in xs[:4])
    c = np.asarray(xs[4], dtype=np.float64) if len(xs) > 4 else None
    peep = np.asarray(xs[5], dtype=np.float64) if len(xs) > 5 else np.zeros(3 * attrs["hidden"])
    cell, hid = attrs["cell"], attrs["hidden"]
    out = np.empty(shape, dtype=np.float64)
    steps = range(xg.shape[0] - 1, -1, -1) if attrs.get("reverse", False) else range(xg.shape[0])
    for t in steps:
        x = xg[t]
        if cell == "lstm":
            assert c is not None
            g = x + h @ r + rb
            i, f, z, o = (g[:, k * hid : (k + 1) * hid] for k in range(4))
            pi, pf, po = peep[:hid], peep[hid : 2 * hid], peep[2 * hid :]
            c = _sigmoid(f + pf * c) * c + _sigmoid(i + pi * c) * np.tanh(z)
            h = _sigmoid(o + po * c) * np.tanh(c)
            out[t] = np.concatenate([h, c], axis=-1)
            continue
        if cell == "gru":
            ru = _sigmoid(x[:, :hid] + h @ r[:, :hid] + rb[:hid])
            zu = _sigmoid(x[:, hid : 2 * hid] + h @ r[:, hid : 2 * hid] + rb[hid : 2 * hid])
            rn, bn = r[:, 2 * hid :], rb[2 * hid :]
            hn = ru * (h @ rn + bn) if attrs.get("linear_before_reset", True) else (ru * h) @ rn + bn
            n = np.tanh(x[:, 2 * hid :] + hn)
            h = (1.0 - zu) * n + zu * h
        else:
            a = x + h @ r + rb
            h = np.tanh(a) if cell == "rnn_tanh" else np.maximum(a, 0.0)
        out[t] = h
    return out.astype(dt)


@op("selective_scan")
def _selective_scan(
    xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype
) -> np.ndarray:
    """SelectiveScanAttrs, step by step in float64."""
    u, delta, a, bm, cm = (np.asarray(v, dtype=np.float64) for v in xs[:5])
    rest = [np.asarray(v, dtype=np.float64) for v in xs[5:]]
    d = rest.pop(0) if attrs["has_d"] else None
    z = rest.pop(0) if attrs["has_z"] else None
    if attrs["has_bias"]:
        delta = delta + rest.pop(0)[:, None]
    if attrs["softplus"]:
        delta = np.where(delta > 20, delta, np.log1p(np.exp(np.minimum(delta, 20))))
    rep = u.shape[1] // delta.shape[1]  # channel d reads head d // (D / H) of dt, A, D, dt_bias
    delta, a = np.repeat(delta, rep, axis=1), np.repeat(a, rep, axis=0)
    if d is not None:
        d = np.repeat(d, rep)
    if bm.ndim == 4:  # grouped [B, G, N, L]: channel d reads group d // (D / G)
        bm, cm = (np.repeat(v, u.shape[1] // v.shape[1], axis=1) for v in (bm, cm))
    else:
        bm, cm = bm[:, None], cm[:, None]
    x = np.zeros((u.shape[0], u.shape[1], bm.shape[2]))  # an A of [D, 1] holds for every N
    y = np.empty(u.shape)
    for t in range(u.shape[2]):
        step = delta[:, :, t, None]
        x = np.exp(step * a[None]) * x + step * bm[:, :, :, t] * u[:, :, t, None]
        y[:, :, t] = np.einsum("bdn,bdn->bd", x, cm[:, :, :, t])
    if d is not None:
        y = y + u * d[None, :, None]
    if z is not None:
        y = y * z * _sigmoid(z)
    return y.astype(dt)


@op("index")
def _index(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    key: list[Any] = [slice(None)] * xs[0].ndim
    for axis, idx in zip(attrs["axes"], xs[1:]):
        size = xs[0].shape[axis]
        if idx.size and idx.dtype != np.bool_ and (idx.min() < -size or idx.max() >= size):
            raise IndexRangeError(f"index out of range: indices must lie in [-{size}, {size - 1}]")
        key[axis] = idx
    return xs[0][tuple(key)]


@op("pad")
def _pad(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    return np.pad(xs[0], [tuple(p) for p in attrs["pads"]], constant_values=attrs["value"])


# --------------------------------------------------------------------------- reductions


def _reduce(fn: Callable[..., np.ndarray]) -> Impl:
    def impl(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
        return np.asarray(fn(xs[0], axis=tuple(attrs["axes"]), keepdims=attrs["keepdim"])).astype(dt, copy=False)

    return impl


OPS.update(
    sum=_reduce(np.sum), mean=_reduce(np.mean), amax=_reduce(np.max), amin=_reduce(np.min), prod=_reduce(np.prod)
)


def _arg(fn: Callable[..., np.ndarray]) -> Impl:
    def impl(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
        return np.asarray(fn(xs[0], axis=attrs["axis"], keepdims=attrs["keepdim"])).astype(dt)

    return impl


OPS.update(argmax=_arg(np.argmax), argmin=_arg(np.argmin))


def _stable_order(x: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    """Note [Sort kernel]: the positions along `axis` in stable order, ascending with NaN last or
    descending with NaN first (NaN is the largest); equal values keep input order."""
    nan = np.isnan(x) if x.dtype.kind == "f" else np.zeros(x.shape, dtype=bool)
    rank = np.unique(np.where(nan, 0, x), return_inverse=True)[1].reshape(x.shape)  # exact for every dtype
    return np.lexsort((-rank, ~nan) if descending else (rank, nan), axis=axis)


@op("topk")
def _topk(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    order = _stable_order(xs[0], attrs["axis"], attrs["largest"])
    return np.take(order, np.arange(attrs["k"]), axis=attrs["axis"]).astype(dt).reshape(shape)


@op("sort")
def _sort(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    return _stable_order(xs[0], attrs["axis"], attrs["descending"]).astype(dt).reshape(shape)


@op("cumsum")
def _cumsum(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    return np.cumsum(xs[0], axis=attrs["axis"] if xs[0].ndim else None, dtype=dt).reshape(shape)


def _softmax_impl(log: bool) -> Impl:
    def impl(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
        x = xs[0].astype(np.float64)
        axis = attrs["axis"] if x.ndim else None
        with np.errstate(invalid="ignore"):
            z = x - np.max(x, axis=axis, keepdims=True)
            s = np.sum(np.exp(z), axis=axis, keepdims=True)
            y = z - np.log(s) if log else np.exp(z) / s
            if attrs.get("safe"):  # Note [Safe softmax] in codegen/emitter.py: an all -inf row gives 0
                y = np.where(np.all(x == -np.inf, axis=axis, keepdims=True), 0.0, y)
            return y.astype(dt)

    return impl


OPS.update(softmax=_softmax_impl(False), log_softmax=_softmax_impl(True))


def _norm_impl(rms: bool) -> Impl:
    def impl(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
        x = xs[0].astype(np.float64)
        axes = tuple(range(x.ndim - attrs["num_axes"], x.ndim))
        if rms:
            y = x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + attrs["eps"])
        else:
            mu = np.mean(x, axis=axes, keepdims=True)
            var = np.mean((x - mu) ** 2, axis=axes, keepdims=True)
            y = (x - mu) / np.sqrt(var + attrs["eps"])
        rest = list(xs[1:])
        if attrs["has_weight"]:
            y = y * rest.pop(0)
        if attrs["has_bias"]:
            y = y + rest.pop(0)
        return y.astype(dt)

    return impl


OPS.update(layer_norm=_norm_impl(False), rms_norm=_norm_impl(True))


# --------------------------------------------------------------------------- library ops


@op("matmul")
def _matmul(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    b = np.swapaxes(xs[1], -1, -2) if attrs["transpose_b"] else xs[1]
    return np.matmul(xs[0], b).astype(dt, copy=False)


def _windows(
    x: np.ndarray, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int], out_hw: Sequence[int]
) -> np.ndarray:
    """[N, C, Ho, Wo, kh, kw] windows of an already padded x."""
    kh, kw = ((k - 1) * d + 1 for k, d in zip(kernel, dilation))
    w = sliding_window_view(x, (kh, kw), axis=(2, 3))
    w = w[:, :, :: stride[0], :: stride[1], :: dilation[0], :: dilation[1]]
    return w[:, :, : out_hw[0], : out_hw[1]]


def _pad_hw(
    x: np.ndarray,
    pad: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    out_hw: Sequence[int],
    value: float,
) -> np.ndarray:
    extra = []
    for i in range(2):
        need = (out_hw[i] - 1) * stride[i] + (kernel[i] - 1) * dilation[i] + 1
        extra.append(max(0, need - (x.shape[2 + i] + 2 * pad[i])))
    widths = [(0, 0), (0, 0), (pad[0], pad[0] + extra[0]), (pad[1], pad[1] + extra[1])]
    return np.pad(x, widths, constant_values=value)


def _nchw(shape: tuple[int, ...]) -> tuple[int, ...]:
    """[N, H, W, C] dims as [N, C, H, W]."""
    return (shape[0], shape[3], shape[1], shape[2])


def _channels_last(impl: Impl) -> Impl:
    """A pooling whose `layout` is "nhwc" computed by its NCHW implementation (Note [Channels-last
    chains] in passes/channels_last.py)."""

    def wrapped(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
        layout = attrs.get("layout", "nchw")
        if layout not in ("nchw", "nhwc"):
            raise ValueError(f"pooling layout {layout!r}: this loader knows nchw and nhwc")
        if layout == "nchw":
            return impl(xs, attrs, shape, dt)
        y = impl([xs[0].transpose(0, 3, 1, 2)], attrs, _nchw(shape), dt)
        return np.ascontiguousarray(y.transpose(0, 2, 3, 1))

    return wrapped


@op("conv2d")
def _conv2d(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    x, w = xs[0], xs[1]
    if attrs.get("weight_layout", "oihw") == "panels":  # [ceil(C_out / 16), C_in, 1, 16], zero-padded
        panels, c_in = w.shape[:2]
        w = w[:, :, 0, :].transpose(1, 0, 2).reshape(c_in, 1, 1, panels * w.shape[3])[..., : shape[-1]]
        xs, attrs = [x, w, *xs[2:]], {**attrs, "weight_layout": "ihwo"}
    layout = attrs.get("weight_layout", "oihw")
    if layout in ("blocks", "tap_panels", "winograd", "hwio_winograd"):  # opset/packed_weights.py
        if attrs.get("out_layout") != "nhwc":
            raise ValueError(f"conv2d weight_layout {layout!r} goes with out_layout 'nhwc' only")
        xs, attrs = [x, packed_weights.unpack(layout, w, shape[-1]), *xs[2:]], {**attrs, "weight_layout": "oihw"}
        w = xs[1]
    if attrs.get("weight_layout", "oihw") == "ihwo":  # packed [C_in, KH, KW, C_out]
        w = np.ascontiguousarray(w.transpose(3, 0, 1, 2))
    elif attrs.get("weight_layout", "oihw") != "oihw":
        raise ValueError(
            f"conv2d weight_layout {attrs['weight_layout']!r}: this loader knows oihw, ihwo, panels, blocks, tap_panels, winograd and hwio_winograd"
        )
    layout = attrs.get("out_layout", "nchw")
    if layout not in ("nchw", "cnhw", "nhwc"):
        raise ValueError(f"conv2d out_layout {layout!r}: this loader knows nchw, cnhw and nhwc")
    if layout == "nhwc":  # input [N, H, W, C_in], result [N, OH, OW, C_out] (Note [Channels-last chains])
        y = _conv2d([x.transpose(0, 3, 1, 2), *xs[1:]], {**attrs, "out_layout": "nchw"}, _nchw(shape), dt)
        return np.ascontiguousarray(y.transpose(0, 2, 3, 1))
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    g = attrs["groups"]
    out_hw = shape[2:]
    cnhw = layout == "cnhw"  # result dims [C_out, N, OH, OW]
    xp = _pad_hw(x, attrs["padding"], (kh, kw), attrs["stride"], attrs["dilation"], out_hw, 0.0)
    win = _windows(xp, (kh, kw), attrs["stride"], attrs["dilation"], out_hw)  # N C Ho Wo kh kw
    win = win.reshape(n, g, cg, *win.shape[2:])
    wg = w.reshape(g, o // g, cg, kh, kw)
    y = np.einsum("ngchwij,gocij->ngohw", win, wg, optimize=True).reshape(n, o, *out_hw)
    if attrs["has_bias"]:
        y = y + xs[2].reshape(1, o, 1, 1)
    if cnhw:
        y = np.ascontiguousarray(y.transpose(1, 0, 2, 3))
    return y.astype(dt, copy=False)


@op("max_pool2d")
@_channels_last
def _max_pool(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    x = xs[0]
    lowest = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    xp = _pad_hw(x, attrs["padding"], attrs["kernel"], attrs["stride"], attrs["dilation"], shape[2:], lowest)
    win = _windows(xp, attrs["kernel"], attrs["stride"], attrs["dilation"], shape[2:])
    return win.max(axis=(-2, -1)).astype(dt, copy=False)


@op("avg_pool2d")
@_channels_last
def _avg_pool(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    x = xs[0]
    k, s, p = attrs["kernel"], attrs["stride"], attrs["padding"]
    xp = _pad_hw(x, p, k, s, (1, 1), shape[2:], 0.0)
    total = _windows(xp, k, s, (1, 1), shape[2:]).sum(axis=(-2, -1))
    # The divisor counts window cells inside the padded input (count_include_pad) or the real input.
    ones = np.ones(
        (
            1,
            1,
            x.shape[2] + (2 * p[0] if attrs["count_include_pad"] else 0),
            x.shape[3] + (2 * p[1] if attrs["count_include_pad"] else 0),
        )
    )
    mask = _pad_hw(ones, (0, 0) if attrs["count_include_pad"] else p, k, s, (1, 1), shape[2:], 0.0)
    count = _windows(mask, k, s, (1, 1), shape[2:]).sum(axis=(-2, -1))
    return (total / count).astype(dt)


# --------------------------------------------------------------------------- float16


def _in_float32(impl: Impl) -> Impl:
    """float16 operands and results are computed in float32 and rounded once at the end (what real
    backends do: a float16 matmul or sum accumulates in float32)."""

    def wrapped(xs: Sequence[np.ndarray], attrs: dict[str, Any], shape: tuple[int, ...], dt: np.dtype) -> np.ndarray:
        if dt != np.float16 and all(x.dtype != np.float16 for x in xs):
            return impl(xs, attrs, shape, dt)
        up = [x.astype(np.float32) if x.dtype == np.float16 else x for x in xs]
        out = impl(up, attrs, shape, np.dtype(np.float32) if dt == np.float16 else dt)
        return np.asarray(out).astype(dt, copy=False)

    return wrapped


OPS.update({_name: _in_float32(_impl) for _name, _impl in OPS.items()})
