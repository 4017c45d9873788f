"""The CUTLASS GEMM configuration space: which kernels bladepack may instantiate, per dtype and arch.

In: nothing (a fixed catalogue). Out: `GemmConfig` rows — tile, warp and instruction shapes, pipeline
stages, operand alignment, math (tensor-op, 3xTF32 tensor-op, SIMT, Hopper warpgroup MMA), cluster and
kernel schedule — and `candidates(dtype, arch)`, the configs `select` chooses among, plus
`fallback(dtype)`, the one that runs any operand alignment.

Note [GEMM config space]: the "sm80" configs are CUTLASS 2.x `GemmUniversal`s (cp.async multistage
mainloop, mma.sync tensor cores) compiled to sm_80 and sm_90 cubins plus compute_90 PTX (an sm_80 cubin
also runs on sm_86 / sm_89: SASS is compatible within a major version), so they run on every GPU the
artifact supports. Split-K is not part of a config: the same kernel runs serial split-K when launched
with more K slices, so the dispatch table picks the slice count per bucket at no compile cost. float32
GEMMs use 3xTF32 (`OpMultiplyAddFastF32`: each operand split into a TF32 high and low part, three
tensor-core products) so they keep float32 accuracy (torch's default forbids TF32 for matmul); float64
runs SIMT. The SIMT configs with alignment 1 are the fallback for operands whose leading dims, K / N
extents or addresses are not multiples of the vector width.

The "sm90" configs are CUTLASS 3.x kernels built by the collective builders for sm_90a only (Note
[Hopper GEMMs] in library_ops/cutlass/emitter.py): TMA loads into a shared-memory pipeline with as many
stages as fit next to the epilogue (`stages` 0), warpgroup MMA (wgmma) issued by two consumer
warpgroups while a producer warpgroup drives TMA, a persistent tile scheduler, and thread-block
clusters that multicast operand tiles. "cooperative" splits each tile between the two consumer
warpgroups; "pingpong" gives each its own tile so one's epilogue overlaps the other's MMAs (the better
schedule for small tiles). They exist for float16 / bfloat16 (wgmma has no 3xTF32 path, and TF32 alone
would cost float32 accuracy), need 16-byte-aligned operands (TMA) and run serial split-K never: a plan
keeps an sm80 dispatch table for every GPU and, when it targets sm_90a, a second one for compute
capability 9.0 that mixes both kinds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bladepack.dtypes import DType

# bytes of shared memory per SM a CTA may use on sm_80 / sm_90 (A100: 164 KiB, H100: 227 KiB)
SMEM_LIMIT = 163 * 1024
SMEM_LIMIT_SM90 = 227 * 1024
ARCHES = ("sm80", "sm90")


@dataclass(frozen=True)
class GemmConfig:
    dtype: DType  # A, B and D element type
    math: str  # "tensorop" | "tensorop_3xtf32" | "simt" | "wgmma"
    tile: tuple[int, int, int]  # threadblock M, N, K
    warp: tuple[int, int, int]  # a warp's tile (sm90: a consumer warpgroup's)
    inst: tuple[int, int, int]
    stages: int  # 0: as many as fit (sm90)
    align: int  # elements per vector access of A, B and D
    arch: str = "sm80"  # Note [GEMM config space]
    cluster: tuple[int, int, int] = (1, 1, 1)
    schedule: str = ""  # sm90: "cooperative" | "pingpong"

    @property
    def name(self) -> str:
        t, w, c = self.tile, self.warp, self.cluster
        if self.arch == "sm90":
            return (
                f"{_SHORT[self.dtype]}_wgmma_{t[0]}x{t[1]}x{t[2]}_c{c[0]}x{c[1]}x{c[2]}_{self.schedule}_a{self.align}"
            )
        return (
            f"{_SHORT[self.dtype]}_{self.math}_{t[0]}x{t[1]}x{t[2]}_{w[0]}x{w[1]}x{w[2]}_s{self.stages}_a{self.align}"
        )

    @property
    def warps(self) -> int:
        """Warps computing the tile (sm90: the two consumer warpgroups)."""
        if self.arch == "sm90":
            return 8
        return (self.tile[0] // self.warp[0]) * (self.tile[1] // self.warp[1]) * (self.tile[2] // self.warp[2])

    @property
    def threads(self) -> int:
        return 384 if self.arch == "sm90" else 32 * self.warps  # sm90: a producer warpgroup too

    @property
    def smem_bytes(self) -> int:
        """The mainloop's shared memory (the epilogue reuses it): stages x (A tile + B tile); an sm90
        kernel fills the SM's."""
        if self.arch == "sm90":
            return SMEM_LIMIT_SM90
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


_HOPPER_TILES = (  # (tile, cluster, schedule) for 16-bit wgmma configs
    ((128, 256, 64), (2, 1, 1), "cooperative"),
    ((256, 128, 64), (1, 2, 1), "cooperative"),
    ((128, 128, 64), (2, 1, 1), "cooperative"),
    ((128, 128, 64), (1, 1, 1), "pingpong"),
    ((64, 128, 64), (1, 1, 1), "pingpong"),
)


def _hopper(dt: DType, tile: tuple[int, int, int], cluster: tuple[int, int, int], schedule: str) -> GemmConfig:
    m, n, k = tile
    wm = m // 2 if schedule == "cooperative" else m  # a consumer warpgroup's share of the tile
    return GemmConfig(dt, "wgmma", tile, (wm, n, k), (64, n, 16), 0, 8, "sm90", cluster, schedule)


def _catalogue() -> dict[tuple[DType, str], tuple[GemmConfig, ...]]:
    out: dict[tuple[DType, str], tuple[GemmConfig, ...]] = {}
    for dt in (DType.FLOAT16, DType.BFLOAT16):
        out[dt, "sm80"] = tuple(GemmConfig(dt, "tensorop", t, w, (16, 8, 16), s, 8) for t, w, s in _HALF_TILES)
        out[dt, "sm90"] = tuple(_hopper(dt, t, c, s) for t, c, s in _HOPPER_TILES)
    out[DType.FLOAT32, "sm80"] = tuple(
        GemmConfig(DType.FLOAT32, "tensorop_3xtf32", t, w, (16, 8, 8), s, 4) for t, w, s in _F32_TILES
    )
    out[DType.FLOAT32, "sm90"] = ()
    out[DType.FLOAT64, "sm80"] = out[DType.FLOAT64, "sm90"] = ()
    return out


CATALOGUE = _catalogue()

# The dtypes whose CUTLASS GEMMs have run correctly on a GPU (an NVIDIA H200, 2026-11-26: every sm80-class
# float16 config, the bfloat16 one and the [K, N] layout at M 1 to 16384, split-K 1 and 2, the bucketed
# dispatch and the float16 epilogues). A float32 plan's fused epilogues (3xTF32 kernels) returned NaN at every
# M there and float64 never ran: their GEMMs go to cuBLAS unless BLADEPACK_CUTLASS_UNVERIFIED=1.
VERIFIED_DTYPES = frozenset({DType.FLOAT16, DType.BFLOAT16})


def candidates(dtype: DType, arch: str = "sm80") -> tuple[GemmConfig, ...]:
    """The aligned configs of `arch` for `dtype` (empty when only the fallback exists)."""
    if arch not in ARCHES:
        raise ValueError(f"no CUTLASS GEMM configs for arch {arch!r}; the arches are {list(ARCHES)}")
    if (dtype, arch) not in CATALOGUE:
        dtypes = sorted({d.value for d, _ in CATALOGUE})
        raise ValueError(f"no CUTLASS GEMM configs for {dtype.value}; CUTLASS GEMMs take {dtypes}")
    return CATALOGUE[dtype, arch]


def fallback(dtype: DType) -> GemmConfig:
    """The SIMT config that runs any alignment (and every float64 GEMM)."""
    if dtype is DType.FLOAT64:
        return GemmConfig(dtype, "simt", (64, 64, 8), (32, 32, 8), (1, 1, 1), 2, 1)
    return GemmConfig(dtype, "simt", (128, 128, 8), (32, 64, 8), (1, 1, 1), 2, 1)


def check(cfg: GemmConfig) -> None:
    """Raise ValueError when a config cannot be instantiated (tile not a multiple of the warp and
    instruction shapes, too many threads, too much shared memory; sm90: a tile CUTLASS's builders reject)."""
    if cfg.arch == "sm90":
        m, n, k = cfg.tile
        ok = (
            cfg.dtype in (DType.FLOAT16, DType.BFLOAT16)
            and m in ((128, 256) if cfg.schedule == "cooperative" else (64, 128))
            and n % 16 == 0
            and 16 <= n <= 256
            and k * cfg.dtype.itemsize == 128  # one 128-byte swizzle atom of K per stage
            and cfg.schedule in ("cooperative", "pingpong")
            and math.prod(cfg.cluster) <= 2  # portable cluster sizes that divide the persistent grid
        )
        if not ok:
            raise ValueError(f"{cfg.name}: not a Hopper config the CUTLASS 3.x builders instantiate")
        return
    for k in range(3):
        if cfg.tile[k] % cfg.warp[k] or cfg.warp[k] % cfg.inst[k]:
            raise ValueError(
                f"{cfg.name}: tile {cfg.tile} is not a multiple of warp {cfg.warp} and instruction {cfg.inst}"
            )
    if cfg.threads > 1024:
        raise ValueError(f"{cfg.name}: {cfg.threads} threads per block (at most 1024)")
    if cfg.smem_bytes > SMEM_LIMIT:
        raise ValueError(f"{cfg.name}: {cfg.smem_bytes} bytes of shared memory (at most {SMEM_LIMIT})")
