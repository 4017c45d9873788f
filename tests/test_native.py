"""The native CPU executor: agreement with the reference executor, runtime variants, the repeated-shape
fast path, fallbacks (no compiler, no BLAS) and libraries for every ISA level."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bladepack
from bladepack import InputError
from bladepack.cpu_features import cpu_flags
from bladepack.errors import ShapeGuardError
from bladepack.loader import ExecutionError
from bladepack.loader.native_cpu import NativeUnavailable
from bladepack.options import LoaderOptions
from tests.helpers import all_isas, no_dense_layers, refused_by_torch, rel_err


class _Softmax(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 2.0, -1) + x.sum(-1, keepdim=True)


@pytest.fixture(scope="module")
def softmax_art() -> bladepack.api.Artifact:
    return bladepack.optimize(_Softmax(), [(torch.randn(2, 5),), (torch.randn(3, 9),)])


def _native_and_reference(art: bladepack.api.Artifact) -> tuple[bladepack.LoadedModule, bladepack.LoadedModule]:
    return bladepack.load(art.to_bytes(), executor="native"), bladepack.load(art.to_bytes(), executor="reference")


@pytest.mark.parametrize("rows,n", [(1, 1), (2, 3), (5, 15), (3, 16), (2, 17), (7, 64), (1, 1023)])
def test_native_agrees_with_reference(softmax_art, rows: int, n: int) -> None:
    nat, ref = _native_and_reference(softmax_art)
    x = np.random.default_rng(n).standard_normal((rows, n), dtype=np.float32)
    assert rel_err(nat(x), ref(x)) <= 1e-6
    assert rel_err(nat(x), _Softmax()(torch.from_numpy(x))) <= 1e-5


def test_variant_chosen_by_row_length(softmax_art) -> None:
    nat = bladepack.load(softmax_art.to_bytes(), executor="native")
    (kernel,) = nat._manifest.kernels["cpu"]
    assert [v["name"] for v in kernel["variants"]] == ["k0_simd", "k0_scalar"]
    fns = [v["fn"] for v in kernel["variants"]]
    chosen, native = {}, {}
    for n in (1, 3, 8, 17, 64):
        nat(np.ones((2, n), np.float32))  # prepared by the kernel library (Note [Native preparation])
        native[n] = kernel["variants"][fns.index(int(nat._executor.fast._plans[((2, n),)].words[1]))]["name"]
        words = nat._executor.prepare(((2, n),)).native.segments[0].words  # the Python path's words
        chosen[n] = kernel["variants"][fns.index(int(words[1]))]["name"]
    assert chosen == native == {1: "k0_scalar", 3: "k0_scalar", 8: "k0_scalar", 17: "k0_simd", 64: "k0_simd"}


def test_fast_path_matches_full_path(mlp_artifact) -> None:
    nat = bladepack.load(mlp_artifact.to_bytes(), executor="native")
    ref = bladepack.load(mlp_artifact.to_bytes(), executor="reference")
    assert nat._executor.fast is not None
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((b, 64), dtype=np.float32) for b in (3, 3, 7, 3)]
    first = nat(xs[0])
    assert ((3, 64),) in nat._executor.fast._plans  # prepared by the kernel library
    again = [nat(x) for x in xs]  # numpy through the fast path
    assert rel_err(again[0], first) == 0.0
    for x, y in zip(xs, again):
        assert rel_err(y, ref(x)) <= 1e-6
    assert not np.shares_memory(again[0], again[3])  # fresh outputs, never a reused buffer
    assert rel_err(again[0], first) == 0.0  # later calls left the earlier result alone
    t = torch.from_numpy(xs[2])
    yt = nat(t)
    assert isinstance(yt, torch.Tensor) and rel_err(yt, ref(xs[2])) <= 1e-6
    yt2 = nat(t.clone().requires_grad_(True))
    assert isinstance(yt2, torch.Tensor) and not yt2.requires_grad and rel_err(yt2, yt) == 0.0
    frozen = xs[1].copy()
    frozen.flags.writeable = False  # Note [Array addresses]: a read-only input takes the general route
    assert nat._executor.fast([frozen]) is not None and rel_err(nat(frozen), again[1]) == 0.0


def test_array_addresses() -> None:
    """Note [Array addresses]: the fast path's address of an array is numpy's own, for writable,
    read-only, empty and offset (sliced) arrays."""
    from bladepack.loader.fast_call import _address

    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    frozen = a.copy()
    frozen.flags.writeable = False
    for x in (a, frozen, np.zeros((0, 4), np.float32), a[1:], np.zeros((), np.int64)):
        assert _address(x) == x.ctypes.data


def test_fast_path_leaves_unusual_inputs_to_the_full_path(mlp_artifact) -> None:
    nat = bladepack.load(mlp_artifact.to_bytes(), executor="native")
    ref = bladepack.load(mlp_artifact.to_bytes(), executor="reference")
    x = np.random.default_rng(1).standard_normal((64, 5), dtype=np.float32)
    nat(np.ascontiguousarray(x.T))
    assert rel_err(nat(x.T), ref(np.ascontiguousarray(x.T))) <= 1e-6  # strided numpy
    assert rel_err(nat(torch.from_numpy(x).T), ref(np.ascontiguousarray(x.T))) <= 1e-6  # strided torch
    with pytest.raises(InputError, match="dtype float64"):
        nat(np.ascontiguousarray(x.T, dtype=np.float64))
    with pytest.raises(InputError, match="dtype"):
        nat(torch.zeros(5, 64, dtype=torch.float16))
    with pytest.raises(InputError, match="rank"):
        nat(np.zeros((5, 64, 1), np.float32))


def test_native_index_error_after_the_shape_is_prepared() -> None:
    emb = torch.nn.Embedding(10, 4)
    art = bladepack.optimize(emb, [(torch.tensor([[1, 2]]),), (torch.tensor([[1, 2, 3]]),)])
    m = bladepack.load(art.to_bytes(), executor="native")
    ok = np.array([[1, 9, 0]])
    assert rel_err(m(ok), emb(torch.from_numpy(ok))) == 0.0
    assert m(ok).shape == (1, 3, 4)  # now on the fast path
    with pytest.raises(ExecutionError, match=r"index out of range.*12 is not in \[0, 9\]"):
        m(np.array([[1, 12, 0]]))
    with pytest.raises(ExecutionError, match=r"index out of range.*-1 is not in \[0, 9\]"):
        m(np.array([[-1, 2, 3]]))  # eager's embedding raises on a negative id (Note [Negative indices])
    assert rel_err(m(ok), emb(torch.from_numpy(ok))) == 0.0  # the fast path still runs after an error


class _EmbedNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)  # the lookup an out-of-range id fails in
        return self.norm(x)


def test_index_error_names_the_lookup_not_the_kernel_root() -> None:
    """The embedding fuses into the layer norm's kernel: the message names the lookup's source line."""
    art = bladepack.optimize(_EmbedNorm().eval(), [(torch.tensor([[1, 2]]),), (torch.tensor([[1, 2, 3]]),)])
    for executor in ("native", "reference"):
        m = bladepack.load(art.to_bytes(), executor=executor)
        with pytest.raises(ExecutionError, match=r"index out of range.*\[0, 9\]") as e:
            m(np.array([[1, 12, 0]]))
        assert "test_native.py" in str(e.value) and "x = self.emb(ids)" in str(e.value), str(e.value)
        assert "sparse.py" not in str(e.value), str(e.value)  # torch's own line is not the model's


def test_portable_gemm_without_blas(mlp_artifact) -> None:
    nat = bladepack.load(mlp_artifact.to_bytes(), executor="native", options=LoaderOptions.from_env(blas="none"))
    assert nat._executor.native.blas is None
    ref = bladepack.load(mlp_artifact.to_bytes(), executor="reference")
    for b in (1, 5, 64):
        x = np.random.default_rng(b).standard_normal((b, 64), dtype=np.float32)
        assert rel_err(nat(x), ref(x)) <= 1e-5


def test_no_compiler_warns_and_runs_on_the_reference_executor(monkeypatch, caplog) -> None:
    monkeypatch.setattr("bladepack.backends.cpu.find_compiler", lambda preferred=None: None)
    art = bladepack.optimize(_Softmax(), [(torch.randn(2, 5),), (torch.randn(3, 9),)])
    assert "no C++ compiler found (set CXX or install g++)" in caplog.text
    assert art.cpu_libraries == []
    m = bladepack.load(art.to_bytes())
    assert m.executor == "reference"
    x = torch.randn(4, 6)
    assert rel_err(m(x), _Softmax()(x)) <= 1e-5
    with pytest.raises(NativeUnavailable, match="no CPU kernel library"):
        bladepack.load(art.to_bytes(), executor="native")


class _Linears(torch.nn.Module):
    """Linear layers (B^T [N, K]) in float32 on contiguous and strided rows, and in float64."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(k + n)
        self.w = torch.nn.Parameter(torch.randn(n, k, generator=g) / k**0.5)
        self.w64 = torch.nn.Parameter(torch.randn(n, k, generator=g, dtype=torch.float64) / k**0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return x[:, 0] @ self.w.t(), x[:, 1] @ self.w.t(), x[:, 0].double() @ self.w64.t()


@pytest.mark.slow
@pytest.mark.parametrize("k,n", [(256, 256), (261, 259), (1024, 67)])
def test_mid_m_gemms(k: int, n: int) -> None:
    """Note [Mid-M GEMMs]: linear layers with W of 64K elements and more at 4 rows up to min(64, K / 8)
    run on the library's register-blocked kernel — a K tail shorter than a vector (261), column blocks
    cut short (259, 67), strided rows, float64 — against eager, below and across the bounds (3 and 4
    rows, K / 8 and one more, 64 and 65), in the library of every ISA level this CPU runs (the AVX-512
    and AVX2 blockings and the portable one)."""
    model = _Linears(k, n)
    art = bladepack.optimize(model, [(torch.randn(2, 2, k),), (torch.randn(5, 2, k),)], options=all_isas())
    have = cpu_flags()
    rows = sorted({3, 4, 5, 7, 13, k // 8, k // 8 + 1, 64, 65} - {0})
    for lib in art.cpu_libraries:
        if not set(lib[1]) <= have:
            continue
        nat = bladepack.load(art.to_bytes(), executor="native", options=LoaderOptions(cpu_isa=lib[0]))
        for m in rows:
            x = torch.randn(m, 2, k, generator=torch.Generator().manual_seed(m))
            for got, ref in zip(nat(x), model(x)):
                assert rel_err(got, ref) <= (1e-12 if ref.dtype == torch.float64 else 1e-5), (lib[0], m, k, n)


@pytest.mark.slow
def test_every_isa_level_builds_and_the_ones_this_cpu_has_run() -> None:
    art = bladepack.optimize(_Softmax(), [(torch.randn(2, 5),), (torch.randn(3, 9),)], options=all_isas())
    levels = [isa for isa, _, _ in art.cpu_libraries]
    assert levels == ["x86-64", "x86-64-v3", "x86-64-v4"]
    x = np.random.default_rng(0).standard_normal((3, 37), dtype=np.float32)
    want = _Softmax()(torch.from_numpy(x))
    have = cpu_flags()
    for lib in art.cpu_libraries:
        if not set(lib[1]) <= have:
            continue
        m = bladepack.load(art.to_bytes(), executor="native", options=LoaderOptions(cpu_isa=lib[0]))
        assert m.executor == f"native ({lib[0]})"
        assert rel_err(m(x), want) <= 1e-5


class _NanOps(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.relu(x),
            torch.clamp(x, -0.5, 0.5),
            torch.nn.functional.max_pool2d(x, 3, 2, 1),
            x.amax(-1),
            torch.maximum(x, x[..., :1]),
            torch.softmax(x, -1),
        )


def test_nan_and_inf_propagate_like_torch() -> None:
    art = bladepack.optimize(_NanOps(), [(torch.randn(1, 2, 5, 6),), (torch.randn(2, 2, 7, 9),)])
    m = bladepack.load(art.to_bytes(), executor="native")
    x = torch.randn(2, 2, 7, 9)
    x[0, 0, 1, 2] = float("nan")
    x[1, 1, 3, 4] = float("inf")
    x[1, 0, 0, 0] = float("-inf")
    for got, want in zip(m(x), _NanOps()(x)):
        assert torch.equal(torch.isnan(got), torch.isnan(want))
        fin = ~torch.isnan(want)
        assert torch.allclose(got[fin], want[fin], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "pool",
    [
        torch.nn.MaxPool2d(3, 2, 1),
        torch.nn.MaxPool2d(2, 2),
        torch.nn.MaxPool2d(3, 1, 1, dilation=2),
        torch.nn.AvgPool2d(3, 2, 1),
        torch.nn.AvgPool2d(3, 2, 1, count_include_pad=False),
        torch.nn.AvgPool2d((3, 2), (1, 2), (1, 1)),
    ],
    ids=repr,
)
def test_pooling_windows_at_borders(pool: torch.nn.Module) -> None:
    art = bladepack.optimize(pool, [(torch.randn(1, 3, 8, 9),), (torch.randn(2, 3, 11, 7),)])
    m = bladepack.load(art.to_bytes(), executor="native")
    for shape in [(1, 3, 5, 5), (2, 3, 6, 7), (3, 3, 13, 4), (1, 3, 31, 17)]:
        x = torch.randn(*shape)
        try:
            assert rel_err(m(x), pool(x)) <= 1e-6, shape
        except ShapeGuardError as e:
            assert refused_by_torch(art.notes, e), e


@pytest.mark.parametrize(
    "conv",
    [
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1),
        torch.nn.Conv2d(5, 7, 3, padding=2, dilation=2, bias=False),
        torch.nn.Conv2d(4, 1, (3, 2), stride=(1, 2), padding=(0, 1)),
        torch.nn.Conv2d(4, 3, (3, 2), stride=(2, 1), padding=(1, 0)),
        torch.nn.Conv2d(8, 64, 5, padding=2),
        torch.nn.Conv2d(8, 65, 3, padding=1),  # above the direct kernel's channel limit: Note [Wide convolutions]
        torch.nn.Conv2d(6, 6, 3, padding=1, groups=2),  # grouped: im2col + GEMM per group
        torch.nn.Conv2d(6, 9, 1),  # pointwise: GEMM on x itself
    ],
    ids=repr,
)
def test_convolution_paths(conv: torch.nn.Module) -> None:
    conv = conv.eval()
    art = bladepack.optimize(
        conv, [(torch.randn(1, conv.in_channels, 9, 8),), (torch.randn(2, conv.in_channels, 11, 13),)]
    )
    m = bladepack.load(art.to_bytes(), executor="native")
    kinds = {k["kind"] for k in m._manifest.kernels["cpu"]}
    direct = conv.groups == 1 and conv.kernel_size != (1, 1)
    assert ("conv" in kinds) == direct, kinds
    for shape in [(1, 9, 8), (3, 5, 5), (2, 17, 6), (1, 31, 40)]:
        x = torch.randn(shape[0], conv.in_channels, *shape[1:])
        assert rel_err(m(x), conv(x)) <= 1e-5, shape


class _ConvBlock(torch.nn.Module):
    """A CNN block whose convolutions end in elementwise chains (Note [Convolution epilogue]): bias, batch
    norm, ReLU, a residual, a literal scale, GELU; a stride-2 stem and a dilated convolution."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.stem = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(16)
        self.conv = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(16)
        self.wide = torch.nn.Conv2d(16, 24, 3, padding=2, dilation=2)
        for bn in (self.bn1, self.bn2):
            bn.running_mean.copy_(0.1 * torch.randn(16, generator=g))
            bn.running_var.copy_(0.5 + torch.rand(16, generator=g))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.bn1(self.stem(x)))
        y = torch.relu(y + self.bn2(self.conv(y)) * 0.5)
        return y, torch.nn.functional.gelu(self.wide(y))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_convolution_epilogues(dtype: torch.dtype) -> None:
    """Note [Convolution epilogue] and Note [Padded rows]: every direct convolution stores its chain's
    end, equal to eager at widths below, at and above a register tile, at size 1 and odd sizes."""
    model = _ConvBlock().eval().to(dtype)
    art = bladepack.optimize(
        model, [(torch.randn(2, 3, 9, 8, dtype=dtype),), (torch.randn(3, 3, 11, 13, dtype=dtype),)]
    )
    m = bladepack.load(art.to_bytes(), executor="native")
    # three convolution kernels and nothing else: every chain runs in a convolution's store
    assert [k["kind"] for k in m._manifest.kernels["cpu"]] == ["conv"] * 3
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for shape in [(1, 1, 1), (2, 5, 5), (1, 9, 8), (3, 17, 6), (1, 2, 33), (2, 31, 40)]:
        x = torch.randn(shape[0], 3, *shape[1:], dtype=dtype)
        with torch.no_grad():
            want = model(x)
        got = m(x)
        for g_, w_ in zip(got, want):
            assert rel_err(g_, w_) <= tol, shape


class _Linear(torch.nn.Module):
    """nn.Linear layers (packed [K, N] at optimize time) on contiguous and strided rows."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        torch.manual_seed(k * 1000 + n)
        self.a = torch.nn.Linear(k, n)
        self.b = torch.nn.Linear(k, n, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a(x[:, 0]), torch.relu(self.b(x[:, 1]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k,n", [(64, 256), (7, 33), (65, 100), (300, 100)])
def test_packed_linear_layers(k: int, n: int, dtype: torch.dtype) -> None:
    """Note [Dense layers]: linear layers read [K, 1, 1, N] copies of their weights (column panels where N
    is a multiple of 64: Note [Dense weight panels]), equal to eager from 1 row through every register
    tile to 130 rows, K and column tails included (a strided row view: x[:, 0] is every other row of x)."""
    model = _Linear(k, n).to(dtype).eval()
    art = bladepack.optimize(model, [(torch.randn(2, 2, k, dtype=dtype),), (torch.randn(5, 2, k, dtype=dtype),)])
    nat = bladepack.load(art.to_bytes(), executor="native")
    suffix = ".panels" if n % 64 == 0 else ".dense"
    packed = {w["name"] for w in nat._manifest.weight_rows if w["name"].endswith((".dense", ".panels"))}
    assert packed == {f"a.weight{suffix}", f"b.weight{suffix}"}
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for m in (1, 2, 3, 4, 5, 8, 17, 63, 64, 65, 130):
        x = torch.randn(m, 2, k, dtype=dtype, generator=torch.Generator().manual_seed(m))
        with torch.no_grad():
            want = model(x)
        for got, ref in zip(nat(x), want):
            assert rel_err(got, ref) <= tol, (m, k, n)


class _Products(torch.nn.Module):
    """A linear layer (B^T [N, K]) and a matmul with a [K, N] weight, on rows that may be a strided view."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(k * 1000 + n)
        self.w_nt = torch.nn.Parameter(torch.randn(n, k, generator=g))
        self.w_nn = torch.nn.Parameter(torch.randn(k, n, generator=g))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = x[:, 1]  # rows a stride apart: lda > K
        return x[:, 0] @ self.w_nt.t(), rows @ self.w_nn, (x[:, 0] @ self.w_nn).double() @ self.w_nt.double()


@pytest.mark.parametrize("k,n", [(64, 100), (300, 31), (300, 33), (256, 256), (7, 1000)])
def test_small_m_gemms(k: int, n: int) -> None:
    """Note [Small-M GEMMs]: products of 1-3 rows run on the library's own kernels (B and B^T layouts,
    a column tail shorter than a chunk, strided rows, float64), B [K, N] products up to 64 rows too
    (register blocks of 4 rows and a tail block); more rows, and 4 and more of B^T, on BLAS. (Weights
    this small would be dense kernels, Note [Dense layers]: the GEMM path serves larger ones.)"""
    model = _Products(k, n)
    art = bladepack.optimize(model, [(torch.randn(2, 2, k),), (torch.randn(5, 2, k),)], options=no_dense_layers())
    nat = bladepack.load(art.to_bytes(), executor="native")
    for m in (1, 2, 3, 4, 9, 63, 64, 65):
        x = torch.randn(m, 2, k, generator=torch.Generator().manual_seed(m))
        want = model(x)
        for got, ref in zip(nat(x), want):
            assert rel_err(got, ref) <= 1e-5, (m, k, n)


@pytest.mark.parametrize("k,n", [(512, 1024), (1024, 1024)])
def test_small_m_gemms_on_large_weights(k: int, n: int) -> None:
    """Note [Small-M GEMMs]: on B [K, N] of 2 MB (4 MB) and more the small-M kernel takes up to 16 (8)
    rows per thread and BLAS the rest; both sides of each cap at one and two threads match eager."""
    model = _Products(k, n)
    art = bladepack.optimize(model, [(torch.randn(2, 2, k),), (torch.randn(5, 2, k),)], options=no_dense_layers())
    for threads in (1, 2):
        nat = bladepack.load(art.to_bytes(), executor="native", options=LoaderOptions.from_env(num_threads=threads))
        for m in (8, 9, 16, 17, 32, 33):
            x = torch.randn(m, 2, k, generator=torch.Generator().manual_seed(m))
            want = model(x)
            for got, ref in zip(nat(x), want):
                assert rel_err(got, ref) <= 1e-5, (threads, m, k, n)


def test_arena_released_after_a_huge_call(mlp_artifact) -> None:
    """Note [Arena high-water mark]: a thread's arena shrinks back once calls need far less."""
    from bladepack.loader.native_cpu import ARENA_KEEP

    m = bladepack.load(mlp_artifact.to_bytes(), executor="native")
    native = m._executor.native
    buf, _ = native.arena(ARENA_KEEP * 2)
    assert buf.nbytes >= ARENA_KEEP * 2
    assert native.arena(ARENA_KEEP * 2 - 100)[0] is buf  # a similar need keeps it
    small, _ = native.arena(1 << 10)
    assert small.nbytes < 1 << 12  # released: far above the mark and the need
    assert native.arena(1 << 9)[0] is small  # small arenas are kept
    x = np.ones((3, 64), np.float32)
    want = bladepack.load(mlp_artifact.to_bytes(), executor="reference")(x)
    assert rel_err(m(x), want) <= 1e-6
    # the fast path (Note [Fast path]) follows an arena the full path replaced: grown, then released
    # (a fast call into the released one would write freed memory)
    for need in (ARENA_KEEP * 2, 1 << 10):
        assert rel_err(m(x), want) <= 1e-6 and m._executor.fast([x]) is not None
        replaced = native.arena(need)[0]
        assert rel_err(m(x), want) <= 1e-6
        held = native.arenas.arena  # the huge one released again by the small call (Note [Arena high-water mark])
        assert int(m._executor.fast._local.state.slots[0]) == held[1]
        assert (held[0] is replaced) == (need == 1 << 10)
