"""float16 and bfloat16 on the CPU: generated kernels that store 16-bit and compute in float registers.

The conversions of the CPU prelude (Note [16-bit floats on CPU] in codegen/cpu_runtime.h) are checked
exhaustively against numpy / torch; whole samples compiled with dtype="float16" / "bfloat16" run with
no reference step and are no further from a float64 reference than torch eager in that dtype (within
2x), at batch 1, odd and the largest test sizes; casts inside fused kernels round as torch's; the
loader's bfloat16 boundary (Note [bfloat16 on the host]) takes and returns torch, extension-dtype and
bit-pattern tensors.
"""

from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest
import torch

import bladepack
from bladepack.codegen import c_render
from bladepack.errors import InputError
from bladepack.inspect import manifest_summary
from bladepack.passes.mixed_precision import bfloat16_bits
from samples.registry import SAMPLES
from tests.helpers import narrowed, rel_err

_PROBE = """
extern "C" {
void to_float_f16(const uint16_t* h, float* f, int64_t n) { for (int64_t i = 0; i < n; ++i) f[i] = bpk::f16_to_float(h[i]); }
void from_float_f16(const float* f, uint16_t* h, int64_t n) { for (int64_t i = 0; i < n; ++i) h[i] = bpk::float_to_f16(f[i]); }
void to_float_bf16(const uint16_t* h, float* f, int64_t n) { for (int64_t i = 0; i < n; ++i) f[i] = bpk::bf16_to_float(h[i]); }
void from_float_bf16(const float* f, uint16_t* h, int64_t n) { for (int64_t i = 0; i < n; ++i) h[i] = bpk::float_to_bf16(f[i]); }
}
"""


@pytest.fixture(scope="module")
def conversions(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """The prelude's conversions, compiled as the kernel libraries are (-O3, vectorized at the host's ISA)."""
    d = tmp_path_factory.mktemp("half-probe")
    (d / "probe.cpp").write_text(c_render.prelude("cpu_runtime.h") + _PROBE)
    so = d / "probe.so"
    flags = ["-std=c++17", "-O3", "-march=native", "-shared", "-fPIC", "-fno-math-errno", "-fno-trapping-math"]
    subprocess.run(["g++", *flags, str(d / "probe.cpp"), "-o", str(so)], check=True, capture_output=True)
    return ctypes.CDLL(str(so))


def _call(lib: ctypes.CDLL, fn: str, src: np.ndarray, out_dtype: type) -> np.ndarray:
    out = np.empty(src.shape, out_dtype)
    getattr(lib, fn)(src.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(src.size))
    return out


def _float_patterns() -> np.ndarray:
    """float32 bit patterns: random ones, every pattern near float16's rounding boundaries (half-way
    points, the subnormal and overflow thresholds), and the specials."""
    rng = np.random.default_rng(0)
    near = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    near_bits = near[np.isfinite(near)].view(np.uint32)
    around = (near_bits[:, None] + np.arange(-2, 3, dtype=np.int64)[None, :]).astype(np.uint32).ravel()
    midpoints = (near_bits.astype(np.uint64) + (1 << 12)).astype(np.uint32)  # float16 half-way points (normals)
    specials = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001, 0, 0x80000000], np.uint32)
    rand = rng.integers(0, 1 << 32, 400_000, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([around, midpoints, midpoints - 1, midpoints + 1, specials, rand])


def test_float16_conversions_exact(conversions: ctypes.CDLL) -> None:
    bits = np.arange(1 << 16, dtype=np.uint16)
    want = bits.view(np.float16).astype(np.float32)
    got = _call(conversions, "to_float_f16", bits, np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"float16 -> float differs at {bits[~same][:8]}"

    f = _float_patterns().view(np.float32)
    with np.errstate(over="ignore"):
        want16 = f.astype(np.float16)
    got16 = _call(conversions, "from_float_f16", f, np.uint16).view(np.float16)
    nan = np.isnan(f)
    assert np.isnan(got16[nan]).all()
    bad = ~nan & (got16.view(np.uint16) != want16.view(np.uint16))
    assert not bad.any(), f"float -> float16 differs at {f[bad][:8]} ({f[bad][:8].view(np.uint32)})"


def test_bfloat16_conversions_exact(conversions: ctypes.CDLL) -> None:
    bits = np.arange(1 << 16, dtype=np.uint16)
    want = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).float().numpy()
    got = _call(conversions, "to_float_bf16", bits, np.float32)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all()

    f = _float_patterns().view(np.float32)
    got16 = _call(conversions, "from_float_bf16", f, np.uint16)
    want16 = torch.from_numpy(f).bfloat16().view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(f)
    assert np.isnan((got16[nan].astype(np.uint32) << 16).view(np.float32)).all()
    assert np.array_equal(got16[~nan], want16[~nan])
    assert np.array_equal(got16, bfloat16_bits(f)), "the kernels and the weight conversion round alike"


def _fp64_error(out: np.ndarray, ref64: np.ndarray) -> float:
    return float(np.abs(out.astype(np.float64) - ref64).max() / max(np.abs(ref64).max(), 1e-30))


def _as_float(x: object) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.float().numpy() if x.is_floating_point() else x.numpy()
    return np.asarray(x)


@pytest.mark.parametrize(
    "name, dtype", [("encoder", "float16"), ("cnn", "float16"), ("llama", "bfloat16"), ("mlp", "bfloat16")]
)
def test_samples_in_half_precision(name: str, dtype: str) -> None:
    """Every step native; outputs in the compute dtype, no further from float64 than eager in that dtype."""
    s = SAMPLES[name]
    model = s.build().eval()
    art = bladepack.optimize(model, s.export_samples(), s.dynamic_shapes, dtype=dtype)
    assert manifest_summary(art._parts()[0])["reference_steps"] == [], "every step has a CPU kernel"
    mod = bladepack.load(art.to_bytes(), executor="native")
    tdt = getattr(torch, dtype)
    m64, mh = s.build().eval().double(), s.build().eval().to(tdt)
    m64.load_state_dict(model.state_dict())
    mh.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(3)
    for dims in s.test_cases():
        args = s.make_inputs(g, **dims)
        if narrowed(art, dims):
            continue
        half = tuple(a.to(tdt) if a.is_floating_point() else a for a in args)
        # float16 through numpy, bfloat16 as torch tensors (numpy has no bfloat16)
        ours = mod(*(a.numpy() for a in half)) if dtype == "float16" else mod(*half)
        ours = ours if isinstance(ours, (list, tuple)) else [ours]
        with torch.no_grad():
            ref64 = m64(*(a.double() if a.is_floating_point() else a for a in args))
            eager = mh(*half)
        ref64 = ref64 if isinstance(ref64, (list, tuple)) else [ref64]
        eager = eager if isinstance(eager, (list, tuple)) else [eager]
        for o, r64, e in zip(ours, ref64, eager):
            if dtype == "float16":
                assert isinstance(o, np.ndarray) and o.dtype == np.float16
            else:
                assert isinstance(o, torch.Tensor) and o.dtype == torch.bfloat16
            r = r64.numpy()
            err, theirs = _fp64_error(_as_float(o), r), _fp64_error(_as_float(e), r)
            assert err <= 2 * theirs + 1e-3, f"{name} at {dims}: {dtype} error {err:.3g}, eager {theirs:.3g}"


class _Casts(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = (x * 3.0).half().float() * 7.0  # the cast rounds inside the fused kernel
        z = x.bfloat16().float() * 2.0 + 1.0
        return y, z, (x * 1000).half()


def test_casts_round_inside_fused_kernels() -> None:
    model = _Casts()
    art = bladepack.optimize(model, [(torch.randn(3, 5),), (torch.randn(4, 9),)])
    assert manifest_summary(art._parts()[0])["reference_steps"] == []
    mod = bladepack.load(art.to_bytes(), executor="native")
    g = torch.Generator().manual_seed(0)
    for shape in [(1, 1), (3, 17), (8, 1000)]:
        x = torch.randn(*shape, generator=g) * 10
        x[0, 0] = 70000.0 / 1000  # overflows float16 to inf after * 1000
        ours = mod(x)
        for o, e in zip(ours, model(x)):
            assert o.dtype == e.dtype and torch.equal(o, e), f"{shape}: {(o.float() - e.float()).abs().max()}"


class _Lin(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def test_bfloat16_at_the_loader_boundary() -> None:
    """Note [bfloat16 on the host]: torch in, torch out; uint16 bit patterns in, bit patterns out;
    anything else an InputError naming what is allowed; the reference executor refuses the artifact."""
    model = _Lin().eval()
    art = bladepack.optimize(model, [(torch.randn(2, 8),), (torch.randn(5, 8),)], dtype="bfloat16")
    mod = bladepack.load(art.to_bytes())
    x = torch.randn(7, 8).bfloat16()
    with torch.no_grad():
        want = model.bfloat16()(x)
    got = mod(x)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
    assert rel_err(got.float().numpy(), want.float().numpy()) <= 1e-2
    bits = x.view(torch.int16).numpy().view(np.uint16)
    out_bits = mod(bits)
    assert out_bits.dtype == np.uint16 and np.array_equal(out_bits, got.view(torch.int16).numpy().view(np.uint16))
    with pytest.raises(InputError, match="expected bfloat16 \\(a torch bfloat16 tensor"):
        mod(np.zeros((2, 8), np.float32))
    with pytest.raises(ValueError, match="numpy reference executor cannot"):
        bladepack.load(art.to_bytes(), executor="reference")


def test_float16_gemm_shapes() -> None:
    """16-bit GEMMs (Note [16-bit GEMMs]) over transposed, batched and small-M operands match eager
    float16 to its rounding: both accumulate in float32."""

    class Mm(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return a @ b, a @ a.transpose(-1, -2)

    art = bladepack.optimize(
        Mm(),
        [
            (torch.randn(2, 3, 4).half(), torch.randn(2, 4, 5).half()),
            (torch.randn(3, 6, 5).half(), torch.randn(3, 5, 7).half()),
        ],
    )
    assert manifest_summary(art._parts()[0])["reference_steps"] == []
    mod = bladepack.load(art.to_bytes(), executor="native")
    g = torch.Generator().manual_seed(1)
    for bsz, m, k, n in [(1, 1, 1, 1), (1, 2, 64, 100), (3, 33, 17, 5), (2, 130, 96, 70)]:
        a, b = torch.randn(bsz, m, k, generator=g).half(), torch.randn(bsz, k, n, generator=g).half()
        for o, e in zip(mod(a, b), Mm()(a.float(), b.float())):
            assert o.dtype == torch.float16
            assert rel_err(o.float().numpy(), e.half().float().numpy()) <= 1e-3, (bsz, m, k, n)


def test_bfloat16_device_tensor_metadata_passes_the_input_check() -> None:
    """A CUDA module reads a device tensor's shape and dtype through DLPack (cuda_module._Meta, dtype
    named bfloat16, not the host's uint16 bit patterns): a bfloat16 input must pass, another dtype must
    not. On an H200 every torch bfloat16 CUDA tensor was refused with "has dtype bfloat16; expected
    bfloat16" before the check knew the device name."""
    from bladepack.loader.cuda_module import _Dtype, _Meta
    from bladepack.loader.signature import Signature, SymbolSpec, TensorSpec, check_inputs

    sig = Signature((TensorSpec("x", "bfloat16", ("m", 8)),), (), (SymbolSpec("m", 1, 64),))
    check_inputs(sig, [_Meta((3, 8), _Dtype("bfloat16"))])
    check_inputs(sig, [np.zeros((3, 8), np.uint16)])
    with pytest.raises(InputError, match="input 'x' has dtype float16; expected bfloat16"):
        check_inputs(sig, [_Meta((3, 8), _Dtype("float16"))])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_weights_convert_alike_with_and_without_torch(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """passes/mixed_precision.py converts weights with torch where torch is loaded and with numpy
    where not: the same bits for every value but NaN (NaN either way), at rounding ties, subnormals,
    overflow, infinities and a strided array."""
    import sys

    from bladepack.dtypes import DType
    from bladepack.passes.mixed_precision import _convert

    g = np.random.default_rng(3)
    edges = np.array(
        [0.0, -0.0, 1.0, -1.0, 65504.0, 65520.0, 65536.0, 1e-8, -6e-8, 3e38, -3e38, np.inf, -np.inf, np.nan]
        + [1.0 + k * 2.0**-11 for k in range(8)]  # float16 ties around 1
        + [1.0 + k * 2.0**-8 for k in range(8)],  # bfloat16 ties around 1
        dtype=np.float32,
    )
    bits = g.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)  # every exponent
    values = np.concatenate([edges, bits, g.standard_normal(10_000).astype(np.float32)])
    for a in (values, values.reshape(2, -1)[:, ::3], values[::-1]):
        with_torch = _convert(a, DType(dtype))
        monkeypatch.setitem(sys.modules, "torch", None)  # as under the ONNX front end: numpy's
        without = _convert(a, DType(dtype))
        monkeypatch.undo()
        assert with_torch.dtype == without.dtype and with_torch.shape == without.shape
        as_float = (lambda u: u.astype(np.uint32) << 16) if dtype == "bfloat16" else (lambda u: u)
        nan = np.isnan(as_float(without).view(np.float32) if dtype == "bfloat16" else without)
        other = np.isnan(as_float(with_torch).view(np.float32) if dtype == "bfloat16" else with_torch)
        assert np.array_equal(nan, other)
        assert np.array_equal(with_torch.view(np.uint16)[~nan], without.view(np.uint16)[~nan])
