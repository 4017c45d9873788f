"""The CUTLASS GEMM configuration space: which kernels bladepack may instantiate, per dtype.

In: nothing (a fixed catalogue). Out: `GemmConfig` rows — tile, warp and instruction shapes, pipeline
stages, operand alignment, math (tensor-op, 3xTF32 tensor-op, SIMT) — and `candidates(dtype)`, the
configs `gemm_select` chooses among, plus `fallback(dtype)`, the one that runs any operand alignment.

Note [GEMM config space]: every config is a CUTLASS 2.x `GemmUniversal` (sm80-class: cp.async
multistage mainloop, mma.sync tensor cores) compiled to sm_80 and sm_90 cubins plus compute_90 PTX
(an sm_80 cubin also runs on sm_86 / sm_89: SASS is compatible within a major version). Split-K is
not part of a config: the same kernel runs serial split-K when launched with more K slices, so the
dispatch table picks the slice count per bucket at no compile cost. float32 GEMMs use 3xTF32
(`OpMultiplyAddFastF32`: each operand split into a TF32 high and low part, three tensor-core products)
so they keep float32 accuracy (torch's default forbids TF32 for matmul); float64 runs SIMT. The SIMT
configs with alignment 1 are the fallback for operands whose leading dims, K / N extents or addresses
are not multiples of the vector width.
"""

from __future__ import annotations

from dataclasses import dataclass

from bladepack.dtypes import DType

# bytes of shared memory per SM a CTA may use on sm_80 / sm_90 (A100: 164 KiB, H100: 227 KiB)
SMEM_LIMIT = 163 * 1024


@dataclass(frozen=True)
class GemmConfig:
    dtype: DType  # A, B and D element type
    math: str  # "tensorop" | "tensorop_3xtf32" | "simt"
    tile: tuple[int, int, int]  # threadblock M, N, K
    warp: tuple[int, int, int]
    inst: tuple[int, int, int]
    stages: int
    align: int  # elements per vector access of A, B and D

    @property
    def name(self) -> str:
        t, w = self.tile, self.warp
        return (
            f"{_SHORT[self.dtype]}_{self.math}_{t[0]}x{t[1]}x{t[2]}_{w[0]}x{w[1]}x{w[2]}_s{self.stages}_a{self.align}"
        )

    @property
    def warps(self) -> int:
        return (self.tile[0] // self.warp[0]) * (self.tile[1] // self.warp[1]) * (self.tile[2] // self.warp[2])

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def smem_bytes(self) -> int:
        """The mainloop's shared memory (the epilogue reuses it): stages x (A tile + B tile)."""
        m, n, k = self.tile
        return self.stages * (m * k + k * n) * self.dtype.itemsize

    @property
    def accumulator(self) -> DType:
        return DType.FLOAT64 if self.dtype is DType.FLOAT64 else DType.FLOAT32


_SHORT = {DType.FLOAT16: "f16", DType.BFLOAT16: "bf16", DType.FLOAT32: "f32", DType.FLOAT64: "f64"}

_HALF_TILES = (  # (tile, warp, stages) for 16-bit tensor-op configs, mma 16x8x16
    ((128, 256, 32), (64, 64, 32), 3),
    ((256, 128, 32), (64, 64, 32), 3),
    ((128, 128, 32), (64, 64, 32), 4),
    ((128, 64, 32), (64, 32, 32), 4),
    ((64, 128, 32), (32, 64, 32), 4),
    ((64, 64, 64), (32, 32, 64), 4),
    ((32, 64, 64), (32, 32, 64), 5),
)
_F32_TILES = (  # 3xTF32, mma 16x8x8
    ((128, 128, 16), (64, 64, 16), 4),
    ((128, 64, 16), (64, 32, 16), 4),
    ((64, 64, 16), (32, 32, 16), 5),
)


def _catalogue() -> dict[DType, tuple[GemmConfig, ...]]:
    out: dict[DType, tuple[GemmConfig, ...]] = {}
    for dt in (DType.FLOAT16, DType.BFLOAT16):
        out[dt] = tuple(GemmConfig(dt, "tensorop", t, w, (16, 8, 16), s, 8) for t, w, s in _HALF_TILES)
    out[DType.FLOAT32] = tuple(
        GemmConfig(DType.FLOAT32, "tensorop_3xtf32", t, w, (16, 8, 8), s, 4) for t, w, s in _F32_TILES
    )
    out[DType.FLOAT64] = ()
    return out


CATALOGUE = _catalogue()


def candidates(dtype: DType) -> tuple[GemmConfig, ...]:
    """The aligned configs for `dtype` (empty when only the fallback exists)."""
    if dtype not in CATALOGUE:
        raise ValueError(
            f"no CUTLASS GEMM configs for {dtype.value}; CUTLASS GEMMs take {sorted(d.value for d in CATALOGUE)}"
        )
    return CATALOGUE[dtype]


def fallback(dtype: DType) -> GemmConfig:
    """The SIMT config that runs any alignment (and every float64 GEMM)."""
    if dtype is DType.FLOAT64:
        return GemmConfig(dtype, "simt", (64, 64, 8), (32, 32, 8), (1, 1, 1), 2, 1)
    return GemmConfig(dtype, "simt", (128, 128, 8), (32, 64, 8), (1, 1, 1), 2, 1)


def check(cfg: GemmConfig) -> None:
    """Raise ValueError when a config cannot be instantiated (tile not a multiple of the warp and
    instruction shapes, too many threads, too much shared memory)."""
    for k in range(3):
        if cfg.tile[k] % cfg.warp[k] or cfg.warp[k] % cfg.inst[k]:
            raise ValueError(
                f"{cfg.name}: tile {cfg.tile} is not a multiple of warp {cfg.warp} and instruction {cfg.inst}"
            )
    if cfg.threads > 1024:
        raise ValueError(f"{cfg.name}: {cfg.threads} threads per block (at most 1024)")
    if cfg.smem_bytes > SMEM_LIMIT:
        raise ValueError(f"{cfg.name}: {cfg.smem_bytes} bytes of shared memory (at most {SMEM_LIMIT})")
