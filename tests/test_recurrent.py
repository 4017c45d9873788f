"""Recurrent layers (RecurrentAttrs, Note [Recurrent kernel] in codegen/recurrent_kernel.py): torch's
nn.LSTM / GRU / RNN kept whole through torch.export with a dynamic sequence length (Note [Recurrent
layers through export]) and ONNX's LSTM / GRU / RNN, in generated kernels on CPU (and their CUDA
source through nvcc), against eager and onnx's reference at sequence lengths 1 to 40, batch 1 to 5."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from torch import nn

import bladepack
from bladepack.errors import ExportError
from bladepack.loader.reference import OPS
from bladepack.options import LoaderOptions
from bladepack.target import PTX_ARCH
from tests.helpers import all_isas, runnable_levels


class _Stack(nn.Module):
    """Every torch form at once: a 2-layer bidirectional batch_first LSTM with given states, a GRU
    over its output (sequence-major), a bidirectional ReLU RNN without biases, and an unbatched LSTM call."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 8, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(16, 7)
        self.rnn = nn.RNN(7, 5, nonlinearity="relu", bias=False, bidirectional=True)
        self.solo = nn.LSTM(6, 3)

    def forward(self, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y, (h, c) = self.lstm(x, (h0, c0))
        g, gh = self.gru(y.transpose(0, 1))
        r, rh = self.rnn(g)
        s, (sh, sc) = self.solo(x[0])
        return y, h, c, g, gh, r, rh, s, sh, sc


def _inputs(b: int, s: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    return torch.randn(b, s, 6, generator=g), torch.randn(4, b, 8, generator=g), torch.randn(4, b, 8, generator=g)


@pytest.fixture(scope="module")
def stack() -> tuple[nn.Module, bladepack.Artifact]:
    torch.manual_seed(0)
    model = _Stack().eval()
    g = torch.Generator().manual_seed(1)
    return model, bladepack.optimize(model, [_inputs(2, 5, g), _inputs(3, 9, g)])


def test_recurrent_layers_run_in_generated_kernels(stack: tuple[nn.Module, bladepack.Artifact]) -> None:
    """Eight layer directions, each one RECURRENT kernel; the sequence length stays dynamic."""
    _, art = stack
    plan = art.sources.fusion_text("cpu")
    assert "0 reference steps" in plan and plan.count(": recurrent[") == 8, plan
    assert "x_dim1 in [1, inf]" in str(bladepack.load(art.to_bytes()).signature)


@pytest.mark.parametrize("executor", ["native", "reference"])
def test_torch_recurrent_layers_match_eager(stack: tuple[nn.Module, bladepack.Artifact], executor: str) -> None:
    model, art = stack
    loaded = bladepack.load(art.to_bytes(), executor=executor)
    g = torch.Generator().manual_seed(2)
    for b, s in [(1, 1), (1, 2), (5, 3), (2, 17), (4, 40)]:
        args = _inputs(b, s, g)
        with torch.no_grad():
            want = model(*args)
        got = loaded(*(a.numpy() for a in args))
        for w, o in zip(want, got, strict=True):
            np.testing.assert_allclose(o, w.numpy(), rtol=1e-5, atol=2e-6, err_msg=f"batch {b}, seq {s}")


class _Odd(nn.Module):
    """Hidden sizes whose gate columns leave tails of every panel width (37 * 4, 50 * 3)."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(5, 37, bidirectional=True)
        self.gru = nn.GRU(74, 50)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gru(self.lstm(x)[0])[0]


def _check_levels(
    path: Path, levels: list[str], threads: tuple[int, ...], cases: list[torch.Tensor], wants: list[np.ndarray]
) -> None:
    """The artifact at `path` in each ISA library of `levels` at each thread count matches eager's
    `wants` on `cases` (rtol 1e-5, atol 2e-6)."""
    for isa in levels:
        for n in threads:
            loaded = bladepack.load(path, executor="native", options=LoaderOptions(cpu_isa=isa, num_threads=n))
            for x, want in zip(cases, wants, strict=True):
                np.testing.assert_allclose(
                    loaded(x.numpy()), want, rtol=1e-5, atol=2e-6, err_msg=f"{isa}, {n} threads, {tuple(x.shape)}"
                )


def test_recurrent_blocks_at_every_isa_and_thread_count(tmp_path: Path) -> None:
    """Note [Recurrent products]: blocks of 1 to 16 sequences (the batch split over 1-4 threads), panel
    tails, in every ISA library this CPU runs, against eager."""
    torch.manual_seed(3)
    model = _Odd().eval()
    art = bladepack.optimize(model, [(torch.randn(4, 2, 5),), (torch.randn(6, 3, 5),)], options=all_isas())
    path = tmp_path / "odd.bpk"
    path.write_bytes(art.to_bytes())
    levels = runnable_levels(art)
    assert len(levels) >= 2, art.cpu_libraries
    g = torch.Generator().manual_seed(4)
    cases = [torch.randn(s, b, 5, generator=g) for s, b in ((3, 1), (2, 5), (4, 9), (1, 33))]
    with torch.no_grad():
        wants = [model(x).numpy() for x in cases]
    _check_levels(path, levels, (1, 2, 3, 4), cases, wants)


class _Wide(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 256)
        self.gru = nn.GRU(256, 96)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gru(self.lstm(x)[0])[0]


def test_recurrent_panel_remainders(tmp_path: Path) -> None:
    """Note [Vector remainders] (codegen/cpu_gemm.h): a team member's share of 256 or 96 hidden units'
    gate columns, at 1-3 threads and blocks of 1-5 sequences, leaves every remainder a full panel does
    not cover (AVX2's panels of 96 and 24 columns, AVX-512's of 80) in whole-vector panels; against
    eager in every ISA library this CPU runs."""
    torch.manual_seed(5)
    model = _Wide().eval()
    art = bladepack.optimize(model, [(torch.randn(3, 2, 8),), (torch.randn(4, 3, 8),)], options=all_isas())
    path = tmp_path / "wide.bpk"
    path.write_bytes(art.to_bytes())
    levels = runnable_levels(art)
    g = torch.Generator().manual_seed(6)
    cases = [torch.randn(s, b, 8, generator=g) for s, b in ((3, 1), (2, 3), (3, 5), (2, 9))]
    with torch.no_grad():
        wants = [model(x).numpy() for x in cases]
    _check_levels(path, levels, (1, 2, 3), cases, wants)


class _Projected(nn.Module):
    """Note [LSTM projections]: two bidirectional layers with proj_size, batch_first, given and zero
    states, and an unbatched call of a one-layer projected LSTM."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(12, 24, num_layers=2, proj_size=6, bidirectional=True, batch_first=True)
        self.single = nn.LSTM(12, 10, proj_size=3)

    def forward(self, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y, (h, c) = self.lstm(x, (h0, c0))
        z, (hz, cz) = self.lstm(x)
        u, (hu, cu) = self.single(x[0])
        return y, h, c, z, hz, cz, u, hu, cu


@pytest.mark.parametrize("executor", ["native", "reference"])
def test_lstm_projections_match_eager(executor: str) -> None:
    torch.manual_seed(0)
    model = _Projected().eval()

    def make(b: int, s: int) -> tuple[torch.Tensor, ...]:
        return torch.randn(b, s, 12), torch.randn(4, b, 6), torch.randn(4, b, 24)

    b, s = torch.export.Dim("b", min=1, max=8), torch.export.Dim("s", min=1, max=64)
    art = bladepack.optimize(model, [make(2, 5), make(3, 7)], ({0: b, 1: s}, {1: b}, {1: b}))
    loaded = bladepack.load(art.to_bytes(), executor=executor)
    for shape in [(1, 1), (2, 5), (5, 17), (8, 64)]:
        args = make(*shape)
        for k, (o, w) in enumerate(zip(loaded(*(a.numpy() for a in args)), model(*args), strict=True)):
            np.testing.assert_allclose(o, w.detach().numpy(), rtol=1e-5, atol=2e-6, err_msg=f"output {k} at {shape}")


def test_refused_recurrent_forms_are_named() -> None:
    from bladepack.export.recurrent import recurrent_layers

    lstm = nn.LSTM(4, 3).eval()
    packed = nn.utils.rnn.pack_padded_sequence(torch.randn(5, 2, 4), torch.tensor([5, 3]))
    with recurrent_layers(lstm), pytest.raises(ExportError, match="over a PackedSequence"):
        lstm(packed)


def _onnx_model(lengths: bool = False) -> tuple[object, int]:
    """LSTM (bidirectional, given states, layout 0), GRU (reverse, linear_before_reset 0, layout 1),
    GRU (linear_before_reset 1, no bias), RNN (bidirectional) and a reverse LSTM with peepholes, all
    over one input; with `lengths`, each reads sequence_lens from the input "lens"."""
    rng = np.random.default_rng(0)
    inp, hid = 6, 5
    nodes, inits = [], []
    outputs: list[str] = []

    def weights(name: str, dirs: int, gates: int, bias: bool = True) -> list[str]:
        arrays = {
            "W": rng.standard_normal((dirs, gates * hid, inp)),
            "R": rng.standard_normal((dirs, gates * hid, hid)),
            "B": rng.standard_normal((dirs, 2 * gates * hid)),
        }
        names = []
        for k, a in arrays.items():
            if k == "B" and not bias:
                names.append("")
                continue
            inits.append(numpy_helper.from_array((a * 0.5).astype(np.float32), f"{name}_{k}"))
            names.append(f"{name}_{k}")
        return names

    def add(op: str, name: str, ins: list[str], n_out: int, **attrs: object) -> None:
        outs = [f"{name}_{k}" for k in ("y", "h", "c")[:n_out]]
        if lengths:
            ins = [*ins, *[""] * (5 - len(ins))]
            ins[4] = "lens"
        nodes.append(helper.make_node(op, ins, outs, hidden_size=hid, **attrs))
        outputs.extend(outs)

    add("LSTM", "lstm", ["xs", *weights("lstm", 2, 4), "", "h0", "c0"], 3, direction="bidirectional")
    add("GRU", "gru0", ["xb", *weights("gru0", 1, 3)], 2, direction="reverse", layout=1)
    add("GRU", "gru1", ["xs", *weights("gru1", 1, 3, bias=False)], 2, linear_before_reset=1)
    add("RNN", "rnn", ["xs", *weights("rnn", 2, 1)], 2, direction="bidirectional")
    inits.append(numpy_helper.from_array(rng.standard_normal((1, 3 * hid)).astype(np.float32), "peep_P"))
    add("LSTM", "peep", ["xs", *weights("peep", 1, 4), "", "", "", "peep_P"], 3, direction="reverse")
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["xs"], ["xb"], perm=[1, 0, 2]), *nodes],
        "recurrent",
        [
            vi("xs", TensorProto.FLOAT, ["s", "b", inp]),
            *(vi(n, TensorProto.FLOAT, [2, "b", hid]) for n in ("h0", "c0")),
            *([vi("lens", TensorProto.INT32, ["b"])] if lengths else []),
        ],
        [vi(n, TensorProto.FLOAT, None) for n in outputs],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), len(outputs)


def test_onnx_recurrent_nodes_match_the_reference() -> None:
    model, n_out = _onnx_model()
    art = bladepack.optimize(model)
    assert art.sources.fusion_text("cpu").count(": recurrent[") == 7
    loaded = bladepack.load(art.to_bytes())
    ref = ReferenceEvaluator(model)
    rng = np.random.default_rng(1)
    for b, s in [(1, 1), (3, 2), (2, 23)]:
        feeds = {"xs": rng.standard_normal((s, b, 6)).astype(np.float32)}
        feeds |= {n: rng.standard_normal((2, b, 5)).astype(np.float32) for n in ("h0", "c0")}
        want = ref.run(None, feeds)
        got = loaded(**feeds)
        assert len(got) == len(want) == n_out
        for w, o in zip(want, got, strict=True):
            np.testing.assert_allclose(o, w, rtol=1e-5, atol=2e-6, err_msg=f"batch {b}, seq {s}")


def test_onnx_sequence_lens_stop_each_sequence_at_its_length() -> None:
    """Note [Recurrent lengths]: sequence_lens given at run time, every direction and layout, lengths
    1 to the full one and 0: each sequence's Y, Y_h and Y_c equal onnx's reference run on that sequence
    alone, cut to its length (a reverse direction starts at its own last step), Y is 0 past it and a
    sequence of no steps has zero states (as ONNX Runtime gives); both executors. optimize's own
    reference cases pass through the oracle's per-sequence runs (Note [sequence_lens in the oracle])."""
    model, n_out = _onnx_model(lengths=True)
    plain, _ = _onnx_model()
    art = bladepack.optimize(model)
    ref = ReferenceEvaluator(plain)
    rng = np.random.default_rng(2)
    outputs = [o.name for o in model.graph.output]  # type: ignore[attr-defined]
    for executor in ("native", "reference"):
        loaded = bladepack.load(art.to_bytes(), executor=executor)
        for s, lens in [(1, [1]), (5, [5, 1, 3]), (7, [2, 7, 0, 4])]:
            b = len(lens)
            feeds = {"xs": rng.standard_normal((s, b, 6)).astype(np.float32)}
            feeds |= {n: rng.standard_normal((2, b, 5)).astype(np.float32) for n in ("h0", "c0")}
            got = loaded(**feeds, lens=np.asarray(lens, np.int32))
            assert len(got) == n_out
            for k, n in enumerate(lens):
                one = {
                    "xs": feeds["xs"][:n, k : k + 1],
                    "h0": feeds["h0"][:, k : k + 1],
                    "c0": feeds["c0"][:, k : k + 1],
                }
                want = ref.run(None, one) if n else None
                for j, name in enumerate(outputs):
                    first = name.startswith("gru0")  # layout 1: the batch first
                    mine = got[j][k] if first else (got[j][:, :, k] if name.endswith("_y") else got[j][:, k])
                    if name.endswith("_y"):
                        assert np.all(mine[n:] == 0), (name, lens)
                        if n:
                            alone = want[j][0] if first else want[j][:, :, 0]  # type: ignore[index]
                            np.testing.assert_allclose(mine[:n], alone, rtol=1e-5, atol=2e-6, err_msg=f"{name} {lens}")
                    elif n:
                        alone = want[j][0] if first else want[j][:, 0]  # type: ignore[index]
                        np.testing.assert_allclose(mine, alone, rtol=1e-5, atol=2e-6, err_msg=f"{name} {lens}")
                    else:  # no step: zero states, as ONNX Runtime gives
                        np.testing.assert_array_equal(mine, np.zeros_like(mine), err_msg=f"{name} {lens}")


def test_the_reference_gru_variants_differ() -> None:
    """linear_before_reset changes the answer (so the ONNX test above tells the two apart)."""
    rng = np.random.default_rng(3)
    xs = [
        rng.standard_normal((4, 2, 9)),
        rng.standard_normal((3, 9)),
        rng.standard_normal(9),
        rng.standard_normal((2, 3)),
    ]
    shape = (4, 2, 3)
    after = OPS["recurrent"](xs, {"cell": "gru", "hidden": 3}, shape, np.dtype(np.float64))
    before = OPS["recurrent"](
        xs, {"cell": "gru", "hidden": 3, "linear_before_reset": False}, shape, np.dtype(np.float64)
    )
    assert np.abs(after - before).max() > 1e-3


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc")
def test_the_cuda_recurrent_kernels_compile(tmp_path: Path) -> None:
    from bladepack.codegen.cuda_toolchain import build_images

    model, _ = _onnx_model()
    art = bladepack.optimize(model, targets=("cuda",), reference_cases=False)
    assert art.sources.fusion_text("cuda").count(": recurrent[") == 7
    assert build_images(art.sources.unit("cuda"), tmp_path, arches=[PTX_ARCH])


_VTANH = """
extern "C" void vtanh_all(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bpk::vtanh(x[i]);
}
"""


@pytest.mark.parametrize("march", ["x86-64", "native"])
def test_vtanh_is_within_two_ulp(tmp_path: Path, march: str) -> None:
    """The cells' tanh (scalar_ops.h, vectorized with the loop) against tanh in float64: within 2 float
    ulp of the rounded value everywhere (a dense sweep of [-12, 12], both sides of the 0.5 switch,
    every float below 1e-3 by powers), the limits and NaN."""
    import ctypes
    import subprocess

    from bladepack.codegen import c_render

    src = tmp_path / "vtanh.cpp"
    src.write_text(c_render.prelude("cpu_runtime.h") + _VTANH)
    so = tmp_path / "vtanh.so"
    flags = ["-std=c++17", "-O3", f"-march={march}", "-shared", "-fPIC", "-fno-math-errno", "-fno-trapping-math"]
    subprocess.run(["g++", *flags, str(src), "-o", str(so)], check=True, capture_output=True)
    lib = ctypes.CDLL(str(so))
    x = np.concatenate(
        [
            np.linspace(-12, 12, 2_000_001, dtype=np.float32),
            np.nextafter(np.float32(0.5), np.float32([-1, 2])),
            np.float32(0.5) * np.float32([1, -1]),
            np.float32(2.0) ** -np.arange(10, 130, dtype=np.float32),
            -(np.float32(2.0) ** -np.arange(10, 130, dtype=np.float32)),
            np.float32([0.0, -0.0, 100.0, -100.0, np.inf, -np.inf, np.nan]),
        ]
    ).astype(np.float32)
    y = np.empty_like(x)
    lib.vtanh_all(x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(x.size))
    want = np.tanh(x.astype(np.float64)).astype(np.float32)
    finite = np.isfinite(x)
    ulp = np.spacing(np.abs(want[finite]))
    assert np.max(np.abs(y[finite] - want[finite]) / ulp) <= 2.0
    assert list(y[-5:-1]) == [1.0, -1.0, 1.0, -1.0] and np.isnan(y[-1])
    assert y[-7] == 0 and not np.signbit(y[-7]) and y[-6] == 0 and np.signbit(y[-6])  # tanh(-0) is -0
