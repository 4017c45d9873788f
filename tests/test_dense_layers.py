"""Note [Dense layers] (passes/dense_layers.py, codegen/cpu_dense.py): linear layers as channels-last
pointwise convolutions with their bias / activation / residual in the store, against eager at row
counts on both sides of every register tile (1, 2, the tile, odd sizes, the range's end), narrow and
ragged column counts (Note [Dense column tails]), 3-D inputs, shared weights and a product that is
itself a graph output, on the native and the reference executors."""

from __future__ import annotations

import copy
import textwrap

import numpy as np
import pytest
import torch

import bladepack
from bladepack import Dim


class _Layers(torch.nn.Module):
    """A 64 -> 200 layer (three whole blocks and a tail of 8), a residual 200 -> 200 one with GELU, a
    bias-free 200 -> 10 head (narrower than a vector) and a 200 -> 3 one reading the same hidden state."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 200)
        self.fc2 = torch.nn.Linear(200, 200)
        self.head = torch.nn.Linear(200, 10, bias=False)
        self.side = torch.nn.Linear(200, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.fc1(x))
        h = torch.nn.functional.gelu(self.fc2(h)) + h
        return torch.log_softmax(self.head(h), dim=-1), torch.tanh(self.side(h)) * 0.5


ROWS = [1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 31, 64, 97, 300]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dense_layers_match_eager(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = _Layers().eval().to(dtype)
    samples = [(torch.randn(2, 64, dtype=dtype),), (torch.randn(9, 64, dtype=dtype),)]
    art = bladepack.optimize(model, samples, {"x": {0: Dim("rows", 1, 300)}})
    m = bladepack.load(art.to_bytes(), executor="native")
    kernels = m._manifest.kernels["cpu"]
    assert [k["kind"] for k in kernels].count("conv") == 4, kernels
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for rows in ROWS:
        x = torch.randn(rows, 64, dtype=dtype)
        with torch.no_grad():
            want = [t.numpy() for t in model(x)]
        got = m(x.numpy())
        for g, w in zip(got, want):
            err = float(np.abs(np.asarray(g) - w).max() / (1 + np.abs(w).max()))
            assert err <= tol, (rows, err)


class _Tokens(torch.nn.Module):
    """Linear layers on [batch, seq, hidden] (rows = batch x seq): a shared weight read twice, a residual
    from the input, and a projection that is itself a graph output."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(48, 48)
        self.out = torch.nn.Linear(48, 20)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.proj(x)) + x
        y = self.proj(y) * torch.sigmoid(y)
        return self.out(y), self.proj(x)


def test_dense_layers_three_dims_and_reference_executor() -> None:
    torch.manual_seed(1)
    model = _Tokens().eval()
    samples = [(torch.randn(2, 5, 48),), (torch.randn(3, 7, 48),)]
    art = bladepack.optimize(model, samples, {"x": {0: Dim("batch", 1, 8), 1: Dim("seq", 1, 40)}})
    native = bladepack.load(art.to_bytes(), executor="native")
    ref = bladepack.load(art.to_bytes(), executor="reference")  # the plan's nhwc convolutions in numpy
    for b, s in [(1, 1), (1, 5), (2, 3), (3, 7), (8, 40), (5, 13)]:
        x = torch.randn(b, s, 48)
        with torch.no_grad():
            want = [t.numpy() for t in model(x)]
        for m in (native, ref):
            for g, w in zip(m(x.numpy()), want):
                err = float(np.abs(np.asarray(g) - w).max() / (1 + np.abs(w).max()))
                assert err <= 1e-5, ((b, s), err)


class _Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 40)
        self.head = torch.nn.Linear(40, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.head(torch.relu(self.fc(x))), dim=-1)


def test_dense_layers_golden() -> None:
    """Each linear layer is one kernel with its bias and activation in the store, on rows viewed as
    [1, 1, M, K]; the softmax reads the head's [1, 1, M, N] through its reshape. One variant per tile
    of rows, chosen by the run-time row count (Note [Dense tiles])."""
    from bladepack.backends import backend
    from bladepack.export import capture, to_program
    from bladepack.lowering.lower_native import fusion_for
    from bladepack.options import CompileOptions
    from bladepack.passes.pipeline import run_pipeline

    samples = [(torch.randn(2, 32),), (torch.randn(5, 32),)]
    p = run_pipeline(
        to_program(capture(_Head().eval(), samples, None)), CompileOptions.from_env(), [backend("cpu").caps]
    )
    assert fusion_for(p, backend("cpu")).text(p.graph) == textwrap.dedent("""\
        fusion plan: 1 kernels, 0 library calls, 2 direct convolutions, 0 reference steps
          conv2d%7 (direct kernel) -> %12 = {add%10 relu%12} (epilogue: inline)
          conv2d%15 (direct kernel) -> %18 = {add%18} (epilogue: inline)
          k0: row[x_dim0, 10] rows of 1 -> %20 = {reshape%19 softmax%20}
        """)
    art = bladepack.optimize(_Head().eval(), samples, {"x": {0: Dim("rows", 1, 64)}})
    m = bladepack.load(art.to_bytes(), executor="native")
    variants = [[v["name"] for v in k["variants"]] for k in m._manifest.kernels["cpu"] if k["kind"] == "conv"]
    tiles = ["t8", "t5", "t4", "t3", "t2", "t1"]
    assert variants == [[f"k{k}_{t}" for t in tiles] for k in (0, 1)], variants


@pytest.mark.parametrize("k,n", [(1, 17), (3, 20), (5, 64), (37, 192), (600, 300), (4097, 5), (4097, 40)])
def test_dense_layers_edges(k: int, n: int) -> None:
    """K below the k-pair and column-tail bounds (1, 3, 5: Note [Dense k pairs], Note [Dense column
    tails]) on the dense kernel; a weight above MAX_WEIGHT_BYTES (600 x 300 float32) on its panels
    walked by column blocks outer, one of N a multiple of 64 inside it (5 x 64, 37 x 192) on panels
    walked by row tiles outer (Note [Dense weight panels]); a K whose 64-column panel passes
    MAX_PANEL_BYTES (4097) in two pieces when its weight is over MAX_WEIGHT_BYTES (Note [Dense K
    pieces]), row-major and whole when not."""
    from bladepack.passes.dense_layers import MAX_WEIGHT_BYTES

    torch.manual_seed(k)
    model = torch.nn.Sequential(torch.nn.Linear(k, n), torch.nn.SiLU()).eval()
    art = bladepack.optimize(model, [(torch.randn(2, k),), (torch.randn(5, k),)], {"input": {0: Dim("rows", 1, 64)}})
    m = bladepack.load(art.to_bytes(), executor="native")
    dense = [kk for kk in m._manifest.kernels["cpu"] if kk["kind"] == "conv"]
    big = k * n * 4 > MAX_WEIGHT_BYTES
    assert len(dense) == (2 if big and k == 4097 else 1), dense
    assert art.ir_text.count("weight_layout='panels'") == len(dense) * (big or n % 64 == 0)
    for rows in (1, 2, 4, 6, 9, 64):
        x = torch.randn(rows, k)
        with torch.no_grad():
            want = model(x).numpy()
        got = np.asarray(m(x.numpy()))
        assert float(np.abs(got - want).max() / (1 + np.abs(want).max())) <= 1e-5, rows


def test_dense_layers_pass_golden() -> None:
    """The pass alone: each linear layer on constant weights becomes a 1x1 channels-last convolution on
    [1, B, S, K] (the batch and sequence dims stay dims: Note [Batch-like dims]), its bias and ReLU
    follow on [1, B, S, N] with the bias viewed [1, 1, 1, N], and the head reads the ReLU's result
    directly; the tied embedding table, also gathered from, keeps its matmul."""
    from bladepack.ir import print_graph
    from bladepack.passes.dense_layers import dense_layers
    from tests.test_passes import _Linears, _program

    p = _program(_Linears(), [(torch.randint(0, 40, (2, 5)),), (torch.randint(0, 40, (3, 7)),)])
    q = dense_layers(p)
    assert print_graph(q.graph, q.shape_env) == textwrap.dedent("""\
        symbols { ids_dim0: [1, inf], ids_dim1: [1, inf] }
        graph(%0 ids: i64[ids_dim0, ids_dim1]) weights(%1 emb.weight: f32[40, 16], %3 a.bias: f32[32], %5 head.bias: f32[10], %9 a.weight.dense: f32[16, 1, 1, 32], %17 head.weight.dense: f32[32, 1, 1, 10]) {
          %6: f32[ids_dim0, ids_dim1, 16] = take(%1, %0) {axis=0, wrap=False}
          %7: f32[ids_dim0, ids_dim1, 40] = matmul(%6, %1) {transpose_b=True}
          %8: f32[1, ids_dim0, ids_dim1, 16] = reshape(%6)
          %10: f32[1, ids_dim0, ids_dim1, 32] = conv2d(%8, %9) {stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, has_bias=False, out_layout='nhwc', weight_layout='ihwo'}
          %12: f32[1, 1, 1, 32] = reshape(%3)
          %13: f32[1, ids_dim0, ids_dim1, 32] = add(%10, %12)
          %15: f32[1, ids_dim0, ids_dim1, 32] = relu(%13)
          %18: f32[1, ids_dim0, ids_dim1, 10] = conv2d(%15, %17) {stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, has_bias=False, out_layout='nhwc', weight_layout='ihwo'}
          %20: f32[1, 1, 1, 10] = reshape(%5)
          %21: f32[1, ids_dim0, ids_dim1, 10] = add(%18, %20)
          %22: f32[ids_dim0, ids_dim1, 10] = reshape(%21)
          return %22, %7
        }
        """)
    w = np.asarray(p.weight_data["a.weight"])
    assert (np.asarray(q.weight_data["a.weight.dense"]) == w.T.reshape(16, 1, 1, 32)).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dense_layers_16_bit(dtype: torch.dtype) -> None:
    """16-bit weights and activations: read widened, accumulated in float32, each layer's result rounded
    once at its store; against the float32 model on the same (rounded) inputs, within the format's
    rounding of the result."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 40), torch.nn.GELU(), torch.nn.Linear(40, 10)).eval().to(dtype)
    samples = [(torch.randn(2, 32, dtype=dtype),), (torch.randn(5, 32, dtype=dtype),)]
    art = bladepack.optimize(model, samples, {"input": {0: Dim("rows", 1, 64)}})
    m = bladepack.load(art.to_bytes(), executor="native")
    assert [k["kind"] for k in m._manifest.kernels["cpu"]] == ["conv", "conv"]
    wide = torch.nn.Sequential(*(copy.deepcopy(layer) for layer in model)).float()
    tol = 2e-3 if dtype == torch.float16 else 1.6e-2
    for rows in (1, 3, 7, 64):
        x = torch.randn(rows, 32, dtype=dtype)
        with torch.no_grad():
            want = wide(x.float()).numpy()
        got = torch.as_tensor(m(x)).float().numpy()
        assert float(np.abs(got - want).max() / (1 + np.abs(want).max())) <= tol, rows


class _Repeated(torch.nn.Module):
    """Four identical residual blocks (their own weights): one block's kernels, four times."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(48, 48) for _ in range(4))
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(48) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for fc, norm in zip(self.blocks, self.norms):
            x = norm(torch.nn.functional.gelu(fc(x)) + x)
        return x


def test_repeated_blocks_share_kernel_code() -> None:
    """Note [Shared kernel code]: the library defines a repeated block's kernels once and names them
    again per block; every block still reads its own weights."""
    torch.manual_seed(0)
    model = _Repeated().eval()
    samples = [(torch.randn(3, 5, 48),), (torch.randn(2, 9, 48),)]
    art = bladepack.optimize(model, samples)
    source = art.sources.unit("cpu")
    aliased = source.count(" (the code of k")
    assert aliased >= 6, f"{aliased} kernels share code"  # blocks 2-4: their dense layer and their norm
    kernels = len(art.plan.kernels)
    defined = kernels - aliased
    assert defined <= 3, (kernels, aliased)
    loaded = bladepack.load(art.to_bytes())
    for shape in [(1, 1, 48), (4, 7, 48), (2, 33, 48)]:
        x = torch.randn(shape)
        with torch.no_grad():
            want = model(x)
        np.testing.assert_allclose(loaded(x).numpy(), want.numpy(), rtol=1e-4, atol=1e-5)


class _Residues(torch.nn.Module):
    """Column counts around every ISA's blocks (Note [Dense tiles per ISA]: 64 on AVX-512, 8 / 16 / 32 on
    AVX2, 4 / 8 / 16 on SSE) and K around their vectors: 64 -> 200 -> 17 -> 65 -> 9, and 64 -> 1, once
    in float32 and once in float64 (one model: one build of every ISA library)."""

    def __init__(self) -> None:
        super().__init__()

        def layers() -> torch.nn.ModuleList:
            shapes = ((64, 200), (200, 17), (17, 65), (65, 9), (64, 1))
            return torch.nn.ModuleList(torch.nn.Linear(k, n) for k, n in shapes)

        self.f32, self.f64 = layers(), layers().double()

    @staticmethod
    def _chain(fc: torch.nn.ModuleList, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = torch.relu(fc[0](x))
        b = fc[1](a)
        c = torch.nn.functional.gelu(fc[2](b))
        return a, b, c, fc[3](c), fc[4](x)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (*self._chain(self.f32, x), *self._chain(self.f64, y))


def test_dense_tiles_at_every_isa_level(tmp_path: pytest.TempPathFactory) -> None:
    """Every ISA library this CPU runs (each has its own column blocks, Note [Dense tiles per ISA]), at
    one and two threads, at row counts over each row tile's residues, against eager element by
    element (float32 within 1e-5 of the output's scale, float64 within 1e-12)."""
    from bladepack.options import LoaderOptions
    from tests.helpers import all_isas, runnable_levels

    torch.manual_seed(0)
    model = _Residues().eval()
    m = Dim("m", min=1, max=128)
    sample = (torch.randn(5, 64), torch.randn(5, 64, dtype=torch.float64))
    art = bladepack.optimize(model, [sample], ({0: m}, {0: m}), options=all_isas())
    levels = runnable_levels(art)
    assert len(levels) >= 2, art.cpu_libraries
    path = tmp_path / "residues.bpk"  # type: ignore[operator]
    art.save(path)
    for isa in levels:
        for threads in (1, 2):
            mod = bladepack.load(path, executor="native", options=LoaderOptions(cpu_isa=isa, num_threads=threads))
            assert mod.executor == f"native ({isa})"
            for rows in (1, 2, 3, 5, 6, 7, 8, 9, 13, 17, 31, 128):
                x, y = torch.randn(rows, 64), torch.randn(rows, 64, dtype=torch.float64)
                with torch.no_grad():
                    want = [w.numpy() for w in model(x, y)]
                for k, (got, ref) in enumerate(zip(mod(x.numpy(), y.numpy()), want, strict=True)):
                    tol = 1e-5 if ref.dtype == np.float32 else 1e-12
                    scale = max(1.0, float(np.abs(ref).max()))
                    bad = np.nonzero((np.abs(got - ref) > tol * scale).any(axis=0))[0]
                    assert bad.size == 0, f"{isa}, {threads} threads, {rows} rows: output {k} columns {bad.tolist()}"


class _Panels(torch.nn.Module):
    """Weights over 512 KB, read in column panels (Note [Dense weight panels]): 700 -> 200 (a tail
    panel of 8 columns after AVX-512's three blocks of 64), a residual 200 -> 200 on a 1000-wide GELU
    layer's output, 4501 -> 67 (two K pieces, Note [Dense K pieces]: the second of odd length; one
    block of all N), a shared 700 -> 200 weight, and in float64 300 -> 250 and 2100 -> 40 (two pieces
    of float64's shorter bound); on [batch, seq, K] inputs (the rows are pixels of a [1, B, S, K]
    image)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(700, 200)
        self.wide = torch.nn.Linear(200, 1000)
        self.down = torch.nn.Linear(1000, 200)
        self.narrow = torch.nn.Linear(4501, 67)
        self.f64 = torch.nn.Linear(300, 250).double()
        self.long64 = torch.nn.Linear(2100, 40).double()

    def forward(self, x: torch.Tensor, z: torch.Tensor, y: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = torch.relu(self.up(x))
        h = self.down(torch.nn.functional.gelu(self.wide(h))) + h
        return h, self.narrow(z), torch.tanh(self.f64(y)), self.up(x * 0.5), torch.relu(self.long64(u))


def test_dense_weight_panels_at_every_isa_level(tmp_path: pytest.TempPathFactory) -> None:
    """Every ISA library this CPU runs (each has its own column blocks over the same panels), at one
    and two threads, at row counts over the row tiles' residues, against eager element by element;
    the reference executor reads the panels too."""
    from bladepack.options import LoaderOptions
    from tests.helpers import all_isas, runnable_levels

    torch.manual_seed(0)
    model = _Panels().eval()
    b, s = Dim("b", min=1, max=4), Dim("s", min=1, max=40)
    shapes = {name: {0: b, 1: s} for name in ("x", "z", "y", "u")}

    def inputs(bb: int, ss: int) -> tuple[torch.Tensor, ...]:
        f64 = torch.float64
        return (
            torch.randn(bb, ss, 700),
            torch.randn(bb, ss, 4501),
            torch.randn(bb, ss, 300, dtype=f64),
            torch.randn(bb, ss, 2100, dtype=f64),
        )

    art = bladepack.optimize(model, [inputs(2, 5), inputs(3, 9)], shapes, options=all_isas())
    assert art.ir_text.count("weight_layout='panels'") == 9 and "'ihwo'" not in art.ir_text, art.ir_text
    levels = runnable_levels(art)
    assert len(levels) >= 2, art.cpu_libraries
    path = tmp_path / "panels.bpk"  # type: ignore[operator]
    art.save(path)
    cases = [(1, 1), (1, 2), (1, 3), (2, 2), (1, 5), (2, 3), (1, 7), (1, 13), (3, 7), (4, 40)]  # every row tile
    runs = [(isa, threads) for isa in levels for threads in (1, 2)]
    for isa, threads in runs:
        mod = bladepack.load(path, executor="native", options=LoaderOptions(cpu_isa=isa, num_threads=threads))
        for bb, ss in cases:
            xs = inputs(bb, ss)
            with torch.no_grad():
                want = [w.numpy() for w in model(*xs)]
            for k, (got, ref) in enumerate(zip(mod(*(t.numpy() for t in xs)), want, strict=True)):
                tol = 1e-5 if ref.dtype == np.float32 else 1e-12
                scale = max(1.0, float(np.abs(ref).max()))
                bad = np.nonzero((np.abs(got - ref) > tol * scale).reshape(-1, ref.shape[-1]).any(axis=0))[0]
                assert bad.size == 0, f"{isa}, {threads} threads, {(bb, ss)}: output {k} columns {bad.tolist()}"
    ref_mod = bladepack.load(path, executor="reference")
    xs = inputs(2, 3)
    with torch.no_grad():
        want = [w.numpy() for w in model(*xs)]
    for got, w in zip(ref_mod(*(t.numpy() for t in xs)), want, strict=True):
        np.testing.assert_allclose(np.asarray(got), w, rtol=1e-5, atol=1e-5)


def test_dense_weight_panels_16_bit() -> None:
    """A bfloat16 layer over 512 KB (1024 -> 300) reads its panels widened, as the row-major layout."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 300), torch.nn.GELU()).eval().to(torch.bfloat16)
    samples = [(torch.randn(2, 1024, dtype=torch.bfloat16),), (torch.randn(5, 1024, dtype=torch.bfloat16),)]
    art = bladepack.optimize(model, samples, {"input": {0: Dim("rows", 1, 64)}})
    assert art.ir_text.count("weight_layout='panels'") == 1, art.ir_text
    m = bladepack.load(art.to_bytes(), executor="native")
    wide = copy.deepcopy(model).float()
    for rows in (1, 3, 7, 64):
        x = torch.randn(rows, 1024, dtype=torch.bfloat16)
        with torch.no_grad():
            want = wide(x.float()).numpy()
        got = torch.as_tensor(m(x)).float().numpy()
        assert float(np.abs(got - want).max() / (1 + np.abs(want).max())) <= 1.6e-2, rows
