"""Zero-padded bands of a convolution's input rows, staged per chunk (Note [Staged bands]).

In: the channels-last convolution kernel's emitter (cpu_conv_nhwc.py) for a padded convolution with
groups 1. Out: the chunk statements that declare the band, the statements that stage the rows a tile
needs, and the band's strides, so that every tap of every pixel of the tile is its window origin plus
a fixed offset.

Note [Window origins]: a channels-last convolution with groups 1 addresses tap (ky, kx) of pixel p as
pb_[p] + ky * dh * row_stride + kx * dw * pixel_stride, pb_[p] the pixel's window origin: one pointer
per pixel and tile, in place of a pointer per tap and pixel. Unpadded, the origins point into the
input itself; padded, into a band.

Note [Staged bands]: a padded convolution's window can reach past the image's edge, and a tap there
must read zeros. The tile used to make a table of tap pointers (each bounds-tested, the padding's taps
pointing at a row of zeros) whenever any of its pixels had such a tap: on the small images of a CNN's
later layers that is every tile (an 8-wide row's first and last pixel), and the table (9 taps x 8
pixels) cost a third of a 16-channel tile's multiply-adds; a 3-channel stem's stride-2 tiles paid it
on every tile too. Instead each chunk copies the input rows its tiles read, with the padding's zero
rows and columns around them, into a band (a per-thread buffer, bpk::stage_scratch) and every tile
reads the band through its window origins. A band starts at the first tile's top window row and
reaches the chunk's last tile in the image, at most STAGE_BYTES (and at least one tile's rows): a
chunk restages when its tiles move past the band or to another image. The band has the input's
layout: channels-last inputs as [row][column][channel] (row copies), inputs read in place from NCHW
as [channel][row][column] (a plane per channel), any other layout gathered into channels-last.
Measured side by side in one process (AVX-512 library, one thread; bench/results/cpu_samples_amd_epyc.md
has the whole sample against its peers): the CNN sample at batch 11 x 24 x 30, its 3-channel stem
16.8 -> 13.2 µs, the 16-channel convolutions on 6 x 8 images 13.4 -> 11.6 µs (with Note [Tail tiles],
which took the 32-channel ones on 3 x 4 images 12.9 -> 9.9 µs), all kernels 73.5 -> 60.1 µs (the AVX2
library 135.8 -> 115.5); ResNet-18's 7 x 7 stem at 224 x 224 1114 -> 967 µs (74% -> 86% of one
core's FMA peak). As a bound, the same kernels with every tile's table dropped (wrong results,
timed only) took 61.3 µs where the tables took 73.4; bands without tail tiles 64.3: the copies cost a
quarter of what the tables did.
"""

from __future__ import annotations

from bladepack.codegen.c_render import CPU_MEMTYPE
from bladepack.codegen.emitter import Emitter
from bladepack.dtypes import DType
from bladepack.ir.ops import Conv2dAttrs
from bladepack.ir.views import View, sym_eq

STAGE_BYTES = 1 << 17  # a band's size when the chunk's tiles need more rows: half of a small L2


class StagedBand:
    """One padded convolution's band: `chunk_setup()` for the chunk's statements, `stage(...)` per tile
    (inside the row body) to restage when the tile's rows are not in the band, `strides` the band's
    (row, pixel, channel) strides as C expressions."""

    def __init__(
        self,
        em: Emitter,
        xv: View,
        a: Conv2dAttrs,
        kernel: tuple[int, int],
        cin: int,
        in_hw: tuple[str, str],
        dtype: DType,
    ) -> None:
        self.em, self.a, self.kernel, self.cin, self.in_hw = em, a, kernel, cin, in_hw
        self.mt, self.itemsize = CPU_MEMTYPE[dtype], dtype.itemsize
        # the band's layout follows the input's (module docstring)
        self.dense_channels = sym_eq(xv.strides[3], 1)
        self.planar = not self.dense_channels and sym_eq(xv.strides[2], 1)
        self.strides = ("bw_", "1", "bsc_") if self.planar else (f"bw_ * {cin}", str(cin), "1")

    def chunk_setup(self) -> list[str]:
        _, w = self.in_hw
        return [
            f"const int64_t bw_ = {w} + {2 * self.a.padding[1]};  // the band's width: the padded row",
            f"const int64_t band_rows_ = std::max<int64_t>(1, {STAGE_BYTES} / (bw_ * {self.cin * self.itemsize}));",
            "int64_t band_img_ = -1, band_r0_ = 0, band_r1_ = 0;  // the staged image and its padded rows",
            f"{self.mt}* BPK_RESTRICT band_ = nullptr;",
            *(["int64_t bsc_ = 0;  // the band's channel stride"] if self.planar else []),
        ]

    def stage(self, image: str, tiles: str, tile: int, out_hw: tuple[str, str], sy: str, sx: str, sc: str) -> None:
        """Restage (rows of image `image`, read through `xn_` with strides sy, sx, sc) when the tile's
        padded rows [oy_[0] * sh, oy_[tile - 1] * sh + (kh - 1) * dh] are not all in the band."""
        em, a, cin, mt = self.em, self.a, self.cin, self.mt
        (kh, _), (sh, _), (ph, pw), (dh, _) = self.kernel, self.a.stride, a.padding, a.dilation
        h, w = self.in_hw
        oh, ow = out_hw
        reach = (kh - 1) * dh + 1
        em.line(f"const int64_t tr0_ = oy_[0] * {sh}, tr1_ = oy_[{tile - 1}] * {sh} + {reach};")
        em.line(f"if ({image} != band_img_ || tr0_ < band_r0_ || tr1_ > band_r1_) {{")
        em.line(f"  const int64_t last_ = (hi_ - 1) / {tiles} == {image} ? (hi_ - 1) % {tiles} : {tiles} - 1;")
        em.line(f"  const int64_t ly_ = std::min<int64_t>({oh} - 1, (last_ * {tile} + {tile - 1}) / {ow});")
        em.line(f"  band_r1_ = std::max<int64_t>(tr1_, std::min<int64_t>(ly_ * {sh} + {reach}, tr0_ + band_rows_));")
        em.line("  band_r0_ = tr0_;")
        em.line(f"  band_img_ = {image};")
        em.line("  const int64_t nr_ = band_r1_ - band_r0_;")
        em.line(f"  band_ = static_cast<{mt}*>(bpk::stage_scratch(nr_ * bw_ * {cin} * int64_t(sizeof({mt}))));")
        if self.planar:
            em.line("  bsc_ = nr_ * bw_;")
        em.line("  for (int64_t r_ = 0; r_ < nr_; ++r_) {")
        em.line(f"    const int64_t iy = band_r0_ + r_ - {ph};")
        em.line(f"    const bool in_ = uint64_t(iy) < uint64_t({h});")
        if self.planar:  # [channel][row][column], each row copied from the input's contiguous row
            em.line(f"    for (int64_t c = 0; c < {cin}; ++c) {{")
            em.line(f"      {mt}* BPK_RESTRICT d_ = band_ + c * bsc_ + r_ * bw_;")
            em.line(f"      const {mt}* BPK_RESTRICT s_ = xn_ + c * {sc} + (in_ ? iy : 0) * {sy};")
            em.line(f"      for (int64_t e = 0; e < {pw}; ++e) d_[e] = {mt}{{}};")
            em.line("      if (in_) {")
            em.line("        #pragma omp simd")
            em.line(f"        for (int64_t e = 0; e < {w}; ++e) d_[{pw} + e] = s_[e];")
            em.line("      } else {")
            em.line(f"        for (int64_t e = 0; e < {w}; ++e) d_[{pw} + e] = {mt}{{}};")
            em.line("      }")
            em.line(f"      for (int64_t e = {pw} + {w}; e < bw_; ++e) d_[e] = {mt}{{}};")
            em.line("    }")
        else:  # [row][column][channel]
            em.line(f"    {mt}* BPK_RESTRICT d_ = band_ + r_ * bw_ * {cin};")
            em.line(f"    const {mt}* BPK_RESTRICT s_ = xn_ + (in_ ? iy : 0) * {sy};  // read only when in_")
            em.line(f"    for (int64_t e = 0; e < {pw * cin}; ++e) d_[e] = {mt}{{}};")
            em.line("    if (!in_) {")
            em.line(f"      for (int64_t e = 0; e < {w} * {cin}; ++e) d_[{pw * cin} + e] = {mt}{{}};")
            if self.dense_channels:
                em.line(f"    }} else if ({sx} == {cin}) {{  // contiguous pixels: one copy")
                em.line("      #pragma omp simd")
                em.line(f"      for (int64_t e = 0; e < {w} * {cin}; ++e) d_[{pw * cin} + e] = s_[e];")
            em.line("    } else {")
            em.line(f"      for (int64_t x = 0; x < {w}; ++x)")
            em.line(
                f"        for (int64_t c = 0; c < {cin}; ++c) d_[({pw} + x) * {cin} + c] = s_[x * {sx} + c * {sc}];"
            )
            em.line("    }")
            em.line(f"    for (int64_t e = ({pw} + {w}) * {cin}; e < bw_ * {cin}; ++e) d_[e] = {mt}{{}};")
        em.line("  }")
        em.line("}")
