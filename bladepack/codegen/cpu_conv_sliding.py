"""The multiply-adds of an interior depthwise tile, each input vector loaded once (Note [Sliding taps]).

In: the emitter of a channels-last depthwise convolution kernel (cpu_conv_nhwc.py) inside one of its
interior tiles (Note [Interior tiles]: the tile's pixels on one output row, every tap inside the image),
with `x0_` the input at the tile's first window origin, `wp_` the packed weights ([taps, C] per tap) and
`acc[tile][width]` the accumulators of channel block `cb`. Out: the lines adding every tap into acc.
"""

from __future__ import annotations

from dataclasses import dataclass

from bladepack.codegen.emitter import Emitter

# Note [Sliding taps]: an interior tile of P pixels on one output row reads, per window row, the
# (P - 1) * stride + (kw - 1) * dilation + 1 input pixels its windows span; pixel p's tap kx is input
# column p * stride + kx * dilation. Walked per tap (for each tap, each pixel's input vector times the
# tap's weights) every multiply-add loaded its input vector, 9 loads for 9 multiply-adds per output
# vector of a 3x3 convolution. Walked per input column instead (the column loaded once, then added into
# every pixel whose window has it, with that tap's weights), a window row of a 6-pixel tile loads 8
# input vectors for 18 multiply-adds. Each pixel still adds its taps in (ky, kx) order, so the sums are
# the same, bitwise. The blocks are narrower than the per-tap walk's, so that a window row's weights
# stay in registers beside the accumulators: AVX2 (16 registers) 6 pixels x 1 vector of 8 channels
# plus 3 weight vectors (2 vectors left no room for the weights: 0.8x the per-tap walk at 1 x 56 x
# 56), AVX-512 6 x 2 vectors of 16 (of 32 registers). Tiles on the border keep their pointer tables
# and the per-tap walk, in the blocks they had. Measured on a Zen 4 EPYC, bench.peak's inverted
# residual (64 channels, ReLU6 / hardswish epilogues), the depthwise kernel per launch, against the
# per-tap walk in one process:
# x86-64-v3 1 x 56 x 56 52.3 -> 44.4 µs, 8 x 48 x 48 314 -> 275 µs, 2 x 17 x 17 10.2 -> 9.2 µs;
# x86-64-v4 41.9 -> 37.9, 254 -> 231, 10.3 -> 9.9 µs.
SLIDING_BLOCK = {"avx2": 8, "wide": 32}  # channels per block of an interior tile, per ISA library


@dataclass(frozen=True)
class DepthwiseWindow:
    """A depthwise convolution's geometry as the kernel's C text names it: kernel size, stride and
    dilation along W, dilation along H, the input's row / pixel / channel strides, the channel count."""

    kh: int
    kw: int
    sw: int
    dh: int
    dw: int
    strides: tuple[str, str, str]
    channels: int


def sliding_taps(em: Emitter, win: DepthwiseWindow, tile: int, width: int, ctype: str, memtype: str) -> None:
    """Note [Sliding taps]: acc[p][co] += every tap of pixel p of the interior tile at x0_, for the
    `width` channels of block cb, one load per input vector of each window row."""
    sy, sx, sc = win.strides
    span = (tile - 1) * win.sw + (win.kw - 1) * win.dw + 1  # the tile's input columns in one window row
    em.line(f"for (int64_t ky = 0; ky < {win.kh}; ++ky) {{")
    em.line(f"  const {memtype}* BPK_RESTRICT xr_ = x0_ + ky * {win.dh} * {sy} + cb * {sc};")
    em.line(f"  const {memtype}* BPK_RESTRICT wr_ = wp_ + ky * {win.kw * win.channels} + cb;")
    for c in range(span):
        # the (tap, pixel) pairs reading column c: pixel p's tap kx is column p * sw + kx * dw
        offsets = [(kx, c - kx * win.dw) for kx in range(win.kw)]
        uses = [(kx, d // win.sw) for kx, d in offsets if d >= 0 and d % win.sw == 0 and d // win.sw < tile]
        if not uses:
            continue
        em.line("  #pragma omp simd")
        em.line(f"  for (int64_t co = 0; co < {width}; ++co) {{")
        em.line(f"    const {ctype} xs_ = {ctype}(xr_[{c} * {sx} + co * {sc}]);")
        for kx, p in uses:
            em.line(f"    acc[{p}][co] += xs_ * {ctype}(wr_[{kx * win.channels} + co]);")
        em.line("  }")
    em.line("}")
