"""Note [Conditioned cases]: reference cases whose order decisions (top-k, argmax, sort) rest on
rounding are drawn again, so a correct artifact never fails optimize's self-check on a near-tie."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import bladepack
from bladepack.errors import IllConditionedCase
from bladepack.export.oracle import torch_oracle
from bladepack.ir.order_margins import OrderCall, OrderLog, ill_conditioned
from bladepack.reference_record import SEED_TRIES


def _log(op: str, x: np.ndarray, dim: int | None, lead: int | None, descending: bool, used: bool = True) -> OrderLog:
    log = OrderLog()
    log.decided(OrderCall(op, x, x.shape, dim, lead, descending), object())
    if used:
        log.used.add(0)
    return log


def _pair(
    f32: list[float], f64: list[float], op: str = "topk", lead: int | None = 2, used: bool = True, dim: int = -1
) -> str | None:
    lo = np.asarray(f32, dtype=np.float64).astype(np.float32)
    hi = np.asarray(f64, dtype=np.float64)
    return ill_conditioned(_log(op, lo, dim, lead, True, used), _log(op, hi, dim, lead, True, used))


def test_orders_within_rounding_of_a_tie_are_found() -> None:
    # the 2nd and 3rd values are 2.5e-7 apart, and float32 moved the line's values by up to 1e-7
    near = [1.0, 0.5000002, 0.5, 0.1]
    exact = [1.0, 0.50000015, 0.4999999, 0.1]
    why = _pair(near, exact)
    assert why == "topk over values 2.5e-07 apart, which float32 rounding moves by up to 1e-07 in their line", why
    assert _pair(near, exact, lead=1) is None  # top-1 decides only 1.0 against the rest
    assert _pair(near, exact, op="sort", lead=None) is not None
    assert _pair(near, exact, used=False) is None  # the indices unused: the values are the same
    assert _pair([1.0, 0.6, 0.5, 0.1], [1.0, 0.6000001, 0.4999999, 0.1]) is None  # 0.1 apart
    # exact values (an input sorted as it is): no rounding moved them, whatever the gaps
    assert _pair([1.0, 0.5000002, 0.5], [1.0, 0.5000002, 0.5]) is None
    # ties the model makes (zeros after a ReLU) are equal in both precisions: broken stably anywhere
    assert _pair([0.3, 0.0, 0.0, 0.0], [0.30000001, 0.0, 0.0, 0.0], lead=3) is None
    # a tie in float32 that float64 tells apart is rounding's choice
    assert _pair([0.3, 0.2, 0.2], [0.3, 0.2000000001, 0.2], lead=2) is not None
    # non-finite values order by themselves
    assert _pair([np.nan, 0.5000002, 0.5], [np.nan, 0.50000015, 0.4999999], lead=1) is None


def test_lines_follow_the_decision_axis() -> None:
    # columns are the lines: only column 1 holds a near pair
    f32 = [[1.0, 0.5000002], [0.0, 0.5]]
    f64 = [[1.00000001, 0.50000015], [0.0, 0.4999999]]
    assert _pair(f32, f64, lead=1, dim=0) is not None  # type: ignore[arg-type]
    assert _pair(f32, f64, lead=1, dim=1) is None  # type: ignore[arg-type]
    # argmax over the flattened tensor: 1.0 against 0.5000002
    lo = np.asarray(f32, dtype=np.float32)
    hi = np.asarray(f64, dtype=np.float64)
    assert ill_conditioned(_log("argmax", lo, None, 1, True), _log("argmax", hi, None, 1, True)) is None
    # a twin that took another path (other shapes) tells nothing
    assert ill_conditioned(_log("argmax", lo, None, 1, True), _log("argmax", hi[:1], None, 1, True)) is None


def _folds(x: torch.Tensor) -> torch.Tensor:
    """The sum of x's 8 columns from the left and from the right: equal in exact arithmetic."""
    left, right = x[..., 0], x[..., 7]
    for k in range(1, 8):
        left, right = left + x[..., k], right + x[..., 7 - k]
    return torch.stack([left, right], -1)


class _EqualSums(torch.nn.Module):
    """Two sums equal in exact arithmetic, added in opposite orders: float32 rounding picks the winner."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.scale = torch.nn.Parameter(torch.tensor(1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * self.scale
        sums = _folds(x)
        if self.how == "argmax":
            return sums.argmax(-1)
        if self.how == "max_values":
            return sums.max(-1).values  # indices unused: the value is the same either way
        if self.how == "max_indices":
            return sums.max(-1).indices + 0  # an op reads them
        return sums.float() @ torch.ones(2, 1, dtype=torch.float32)  # a float32-only model


def test_oracle_refuses_cases_whose_orders_rest_on_rounding() -> None:
    x = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)
    sums = _folds(torch.from_numpy(x))
    assert bool((sums[:, 0] != sums[:, 1]).any())  # the premise: float32 tells the two sums apart
    for how in ("argmax", "max_indices"):
        with pytest.raises(IllConditionedCase, match=r"(argmax|max) over values .* apart"):
            torch_oracle(_EqualSums(how).eval())([x])
    torch_oracle(_EqualSums("max_values").eval())([x])
    torch_oracle(_EqualSums("float32 only").eval())([x])  # no float64 twin: the case stands
    # an order the values decide by far is no reason
    torch_oracle(_EqualSums("argmax").eval())([np.abs(x) * np.array([1] + [0] * 7, dtype=np.float32)])


def test_optimize_leaves_out_cases_no_draw_conditions() -> None:
    model = _EqualSums("argmax").eval()
    b = torch.export.Dim("b", min=1, max=8)
    art = bladepack.optimize(
        model,
        [(torch.randn(3, 8),)],
        ({0: b},),
        options=bladepack.CompileOptions(cpu_isas="x86-64", quiet=True),
    )
    cases = art._parts()[0]["reference_cases"]["cases"]
    kept = {c["dims"]["b"] for c in cases}
    notes = " ".join(art.notes)
    assert f"left out: in each of {SEED_TRIES} draws of its inputs an order rests on rounding" in notes, notes
    assert 8 not in kept  # 8 rows: some pair of sums rounds apart in every draw


class _Decoder(torch.nn.Module):
    """A transposed convolution, a bicubic resize and a top-k over 5 channels: near-ties in its top-k
    occur at some draws (the model of test_cuda_backend's decoder test)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.ConvTranspose2d(4, 5, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.nn.functional.interpolate(self.up(x), scale_factor=1.5, mode="bicubic")
        v, i = torch.topk(y, 3, dim=1)
        return v, i


def test_a_near_tie_in_top_k_draws_the_case_again() -> None:
    # with these weights the first draw of the 32 x 4 x 5 x 7 case holds two channels 3.5e-7 apart,
    # and the x86-64 library's top-k took them in the other order than eager (a CompileError before)
    torch.manual_seed(55)
    model = _Decoder().eval()
    b, h, w = (torch.export.Dim(n, min=1, max=32) for n in ("b", "h", "w"))
    art = bladepack.optimize(
        model,
        [(torch.randn(2, 4, 5, 7),)],
        ({0: b, 2: h, 3: w},),
        options=bladepack.CompileOptions(cpu_isas="x86-64", quiet=True),
    )
    cases = art._parts()[0]["reference_cases"]["cases"]
    seeds = {tuple(sorted(c["dims"].items())): c["inputs"][0]["seed"] for c in cases}
    assert seeds[(("b", 32), ("h", 5), ("w", 7))] != 2 * 1000003  # drawn again
    assert bladepack.load(art.to_bytes()).verify()["passed"]


def _onnx_equal_columns(keep_indices: bool = True) -> Any:
    """y = [x @ w, (x @ 3w) / 3]: equal columns in exact arithmetic, a rounding apart in float32; then
    ArgMax over them (or a TopK whose values alone are read)."""
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(1).standard_normal((8, 1)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"]),
        helper.make_node("MatMul", ["x", "w3"], ["b3"]),
        helper.make_node("Div", ["b3", "three"], ["b"]),
        helper.make_node("Concat", ["a", "b"], ["ab"], axis=1),
        helper.make_node("Cast", ["ab"], ["ab32"], to=TensorProto.FLOAT),
    ]
    if keep_indices:
        nodes.append(helper.make_node("ArgMax", ["ab32"], ["y"], axis=1, keepdims=0))
        out = helper.make_tensor_value_info("y", TensorProto.INT64, ["b"])
    else:
        nodes.append(helper.make_node("TopK", ["ab32", "one"], ["y", "unused"], axis=1))
        out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 1])
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(w * 3, "w3"),
        numpy_helper.from_array(np.array(3, np.float32), "three"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8])
    graph = helper.make_graph(nodes, "equal_columns", [x], [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_onnx_oracle_refuses_cases_whose_orders_rest_on_rounding() -> None:
    from onnx import TensorProto, numpy_helper

    from bladepack.onnx_import.oracle import onnx_oracle
    from bladepack.onnx_import.oracle_orders import float64_twin

    x = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)
    proto = _onnx_equal_columns()
    w = numpy_helper.to_array(proto.graph.initializer[0])
    assert ((x @ w) != (x @ (w * 3)) / np.float32(3)).any()  # the premise: float32 tells the columns apart
    with pytest.raises(IllConditionedCase, match=r"ArgMax over values .* apart"):
        onnx_oracle(proto)([x])
    assert onnx_oracle(_onnx_equal_columns(keep_indices=False))([x])[0].shape == (64, 1)  # indices unread
    twin = float64_twin(proto)
    assert twin is not None
    assert {t.data_type for t in twin.graph.initializer} == {TensorProto.DOUBLE, TensorProto.INT64}
    assert [a.i for n in twin.graph.node if n.op_type == "Cast" for a in n.attribute] == [TensorProto.DOUBLE]
    assert proto.graph.node[4].attribute[0].i == TensorProto.FLOAT  # the model itself untouched


def test_onnx_optimize_leaves_out_cases_no_draw_conditions(tmp_path: Any) -> None:
    import onnx

    path = tmp_path / "equal_columns.onnx"
    onnx.save(_onnx_equal_columns(), str(path))
    x = np.random.default_rng(2).standard_normal((5, 8)).astype(np.float32)
    art = bladepack.optimize(str(path), [(x,)], options=bladepack.CompileOptions(cpu_isas="x86-64", quiet=True))
    notes = " ".join(art.notes)
    assert f"left out: in each of {SEED_TRIES} draws of its inputs an order rests on rounding" in notes, notes
    assert "ArgMax over values" in notes


def test_order_calls_read_every_argument_form() -> None:
    from bladepack.export.oracle import order_call

    x = torch.randn(3, 5)
    forms: list[tuple[str, tuple[Any, ...], dict[str, Any], tuple[Any, ...]]] = [
        ("sort", (x,), {}, ("sort", -1, None, False)),
        ("sort", (x, 0, True), {}, ("sort", 0, None, True)),
        ("argsort", (x,), {"dim": 1, "descending": True}, ("argsort", 1, None, True)),
        ("topk", (x, 2), {}, ("topk", -1, 2, True)),
        ("topk", (x,), {"k": 3, "dim": 0, "largest": False}, ("topk", 0, 3, False)),
        ("argmax", (x,), {}, ("argmax", None, 1, True)),
        ("argmin", (x, 1), {}, ("argmin", 1, 1, False)),
        ("max", (x, 1), {}, ("max", 1, 1, True)),
        ("min", (x,), {"dim": 0}, ("min", 0, 1, False)),
    ]
    for name, args, kwargs, want in forms:
        call = order_call(name, args, kwargs)
        assert call is not None and (call.op, call.dim, call.lead, call.descending) == want, (name, args, kwargs)
        assert call.x is not None and call.x.dtype == np.float64 and np.array_equal(call.x, x.double().numpy())
        unkept = order_call(name, args, kwargs, keep=False)
        assert unkept is not None and unkept.x is None and unkept.shape == (3, 5)
    assert order_call("max", (x,), {}) is None  # the whole tensor's maximum: a value only
    assert order_call("max", (x, x), {}) is None  # elementwise
    assert order_call("argmax", (torch.arange(5),), {}) is None  # integers round nowhere


def test_only_used_decisions_keep_their_values() -> None:
    """A first pass logs decisions without their values (a softmax's row maxima over attention scores
    are never copied); the pass that keeps them keeps only the used ones."""
    from bladepack.export.oracle import _StableOrders

    def model() -> torch.Tensor:
        scores = torch.randn(4, 6, generator=torch.Generator().manual_seed(3))
        _ = scores - scores.max(-1, keepdim=True).values  # a softmax's maximum: indices unused
        return scores.argmax(-1) + 1  # indices read

    log = OrderLog()
    with _StableOrders(log, frozenset()):
        model()
    assert [c.op for c in log.calls] == ["max", "argmax"] and log.used == {1}
    assert all(c.x is None for c in log.calls)
    kept = OrderLog()
    with _StableOrders(kept, frozenset(log.used)):
        model()
    assert kept.calls[0].x is None and kept.calls[1].x is not None and kept.calls[1].x.shape == (4, 6)
