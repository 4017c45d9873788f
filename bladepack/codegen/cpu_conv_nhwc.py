"""CPU convolution, pooling and global-pooling kernels on channels-last values (Note [Channels-last
chains]).

In: a `CpuEmitter` whose spec is a "conv" kernel of a convolution with out_layout "nhwc" (groups 1 or
depthwise), a "pool" kernel of a pooling with layout "nhwc", or a "reduce" kernel over H and W of an
[N, H, W, C] value (passes/channels_last.py). Out: the kernel body. Every value
here has dims [N, H, W, C]; a pixel's channels are contiguous, so the channel loops are the vector
loops whatever the image's width.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import sympy

from bladepack.codegen.c_render import CPU_MEMTYPE, CTYPE, Loop
from bladepack.codegen.cpu_conv_band import StagedBand
from bladepack.codegen.cpu_conv_sliding import SLIDING_BLOCK, DepthwiseWindow, sliding_taps
from bladepack.codegen.emitter import Emitter
from bladepack.codegen.kernel import FLOATS, reduce_init, store_offset
from bladepack.ir import Node, OpKind
from bladepack.ir.ops import CHANNEL_BLOCK, Conv2dAttrs, Pool2dAttrs, ReduceAttrs
from bladepack.ir.types import TensorType
from bladepack.ir.views import View, simplify, sym_eq


def conv_tile_pixels(oc: int) -> int:
    """Output pixels per register tile of `oc` output channels (AVX-512 vectors of 16 floats): 8 for one or two
    vectors of channels, else about 24 accumulator vectors, which leaves the 32 registers room for a block's
    weight vectors and the broadcast input. Measured against 12 accumulators (bench/results/profiles.md
    "Convolution register tiles"): a pointwise 256 -> 256 convolution over 4096 pixels 1.4x faster, as fast as
    OpenBLAS's GEMM; at 32 channels a tile of 12 pixels wasted its repeated tail pixels on small images."""
    vectors = (oc + 15) // 16
    return max(2, 24 // vectors) if vectors > 2 else 8


def store_block(em: Emitter, conv: int, root: int, idx: tuple[sympy.Expr, ...], co: Loop, width: int) -> None:
    """A tile row's vector loop over `width` channels: acc[px][co], the convolution's value at `idx`,
    through the epilogue chain up to `root` (Note [Convolution epilogue]), stored at orow_[cb + co]."""

    def store_channel() -> None:
        value = "acc[px][co]"
        if root != conv:  # the accumulator is the convolution's value
            em.bind(conv, idx, value)
            value = em.eval(root, idx)
        em.line(f"orow_[cb + co] = {value};")

    em.loop(["#pragma omp simd", f"for (int64_t co = 0; co < {width}; ++co) {{"], [co], store_channel)


def image_start(em: Emitter, conv: Node, xv: View, px: str, i_n: Loop) -> tuple[str, str, str]:
    """For image `i_n` of a channels-last convolution: defines `xn_`, the image's input; returns the input's row
    and pixel strides and the image's output offset."""
    base = em.args.index(sympy.expand(xv.offset + i_n * xv.strides[0]))
    sy, sx = em.args.ref(xv.strides[1]), em.args.ref(xv.strides[2])
    zero = sympy.Integer(0)
    image = em.args.index(store_offset(conv.type.shape, (i_n, zero, zero, zero)))
    em.line(f"const {CPU_MEMTYPE[conv.type.dtype]}* BPK_RESTRICT xn_ = {px} + {base};")
    return sy, sx, image


def tap_pointers(
    em: Emitter,
    a: Conv2dAttrs,
    kernel: tuple[int, int],
    slot: Callable[[str], str],
    strides: tuple[str, str],
    in_hw: tuple[str, str],
) -> None:
    """For the pixel whose window starts at input (iy0, ix0) of image `xn_`: `slot(tap)` = a pointer to
    the tap's input channels, or `zeros_` where it is in the padding, with bitwise tests and a select
    per tap (no branch to mispredict)."""
    (kh, kw), (dh, dw), (sy, sx), (h, w) = kernel, a.dilation, strides, in_hw
    em.line(f"#pragma GCC unroll {kh}")
    em.line(f"for (int64_t ky = 0; ky < {kh}; ++ky) {{")
    em.line(f"  const int64_t iy = iy0 + ky * {dh};")
    em.line(f"  const bool in_y_ = uint64_t(iy) < uint64_t({h});")
    em.line(f"  #pragma GCC unroll {kw}")
    em.line(f"  for (int64_t kx = 0; kx < {kw}; ++kx) {{")
    em.line(f"    const int64_t ix = ix0 + kx * {dw};")
    em.line(f"    const bool in_ = in_y_ & (uint64_t(ix) < uint64_t({w}));")
    em.line(f"    {slot(f'ky * {kw} + kx')} = in_ ? xn_ + iy * {sy} + ix * {sx} : zeros_;")
    em.line("  }")
    em.line("}")


def zero_pixel(em: Emitter, xv: View, cin: int, mt: str) -> list[str]:
    """Chunk statements defining `zeros_`, what a tap in the padding reads: C_in zeros, as far apart as
    the input's channels (an NCHW input read in place has them a plane apart)."""
    if sym_eq(xv.strides[3], 1):
        return [f"static const {mt} zeros_[{cin}] = {{}};"]
    return [
        "static thread_local std::vector<" + mt + "> zbuf_;",
        f"const int64_t zn_ = {cin - 1} * {em.args.ref(xv.strides[3])} + 1;",
        f"if (int64_t(zbuf_.size()) < zn_) zbuf_.assign(size_t(zn_), {mt}{{}});",
        f"const {mt}* zeros_ = zbuf_.data();",
    ]


def nhwc_conv_kernel(em: Emitter) -> None:
    """Note [Channels-last convolution]: one parallel row per (image, tile of `conv_tile_pixels`
    consecutive output pixels, rows included). Per block of CHANNEL_BLOCK output channels,
    acc[pixel][channel] stays in registers: with groups 1, per tap and input channel one broadcast of
    each pixel's value times the tap's packed weights (one contiguous vector run); depthwise (groups =
    C_in, MobileNet's), each pixel's channel vector times the tap's per-channel weights. The tile
    stores each pixel's block as contiguous vectors, the epilogue chain (Note [Convolution epilogue])
    evaluated in the same vector loop. An image's last tile of at most half a tile of pixels computes
    only those (Note [Tail tiles] in cpu_conv_wide.py).

    Groups 1 (Note [Window origins] and Note [Staged bands] in cpu_conv_band.py): each pixel of the
    tile gets one pointer, its window's origin, in the input or, when the convolution is padded, in a
    zero-padded band of the input rows that the chunk stages once; tap (ky, kx) is the origin plus a
    fixed offset, so the multiply-add loops have no bounds tests and no border cases.

    Depthwise: for each tap (ky, kx), each pixel of the tile gets a pointer to its input pixel's
    channels, or to a row of zeros when the tap falls in the padding, made once per tile (a band would
    double a depthwise convolution's memory traffic, which is what it is bound by).

    Note [Interior tiles]: a depthwise tile whose pixels lie on one output row with every tap inside
    the image (most tiles of an image wider than a few tiles) makes no pointer table: tap k of pixel p
    is tap k of pixel 0 plus p input strides. The table (9 taps x 6-8 pixels, each bounds-tested) cost
    as much as the multiply-adds of a depthwise convolution, whose work per pixel is only taps x
    channel vectors.

    Note [Channel multipliers]: a depthwise convolution with C_out = m x C_in reads input channel
    co / m for output channel co. Read per output vector that index is a gather (one per tap, pixel and
    vector); instead a block holds whole input channels (its width a multiple of m) and each pixel's
    block of inputs is first repeated m times into a small array by m interleaved stores, which the
    vectorizer turns into one permute per vector. The zoo's MobileNet downsampling (16 -> 32 channels,
    groups 16): 236 -> 21 µs at 8 x 96 x 96."""
    n = em.ctx.nodes[em.spec.nodes[0]]
    root = em.spec.roots[0]
    a = n.attrs
    assert isinstance(a, Conv2dAttrs) and a.weight_layout in ("ihwo", "hwio_winograd") and a.out_layout == "nhwc"
    ws, hwio = em.ctx.types[n.inputs[1]].shape, a.weight_layout == "hwio_winograd"  # [3, 3, C_in, C_out] first
    cg, kh, kw, oc = (ws[2], 3, 3, ws[3]) if hwio else ws
    assert isinstance(oc, int) and isinstance(cg, int)
    xv, wv = em.ctx.view(n.inputs[0]), em.ctx.view(n.inputs[1])
    assert xv is not None and wv is not None and wv.is_contiguous()
    px, pw_ = em.ptr_load(xv.base), em.ptr_load(wv.base)
    nb, oh, ow, _ = n.type.shape
    h, w = em.ctx.types[n.inputs[0]].shape[1:3]
    depthwise = a.groups > 1
    assert not depthwise or (cg == 1 and oc % a.groups == 0), "grouped convolutions other than depthwise"
    cin = a.groups if depthwise else cg  # channels of one input pixel
    mult = oc // a.groups  # depthwise: output channels per input channel (channel c reads c / mult)
    (sh, sw), (ph, pwd), (dh, dw) = a.stride, a.padding, a.dilation
    t, mt = CTYPE[n.type.dtype], CPU_MEMTYPE[n.type.dtype]
    r = em.args.ref
    sc = r(xv.strides[3])
    block = min(oc, CHANNEL_BLOCK)
    if depthwise and 1 < mult <= CHANNEL_BLOCK:  # Note [Channel multipliers]: whole input channels per block
        block = min(oc, CHANNEL_BLOCK // mult * mult)
    tile = conv_tile_pixels(block)
    taps = kh * kw
    pixels = simplify(oh * ow)
    tiles = simplify((pixels + tile - 1) // tile)
    out = em.ptr_store(root)
    co, pix, oy, ox, cb = Loop("co"), Loop("px"), Loop("oy"), Loop("ox"), Loop("cb")

    based = not depthwise  # Note [Window origins]
    band = StagedBand(em, xv, a, (kh, kw), cin, (r(h), r(w)), n.type.dtype) if based and (ph or pwd) else None

    def body(outer: tuple[Loop, ...]) -> None:
        i_n, i_t = outer
        sy, sx, image = image_start(em, n, xv, px, i_n)
        em.line(f"const {mt}* BPK_RESTRICT wp_ = {pw_} + {r(wv.offset)};")
        em.line(f"const int64_t q0_ = {i_t.name} * {tile};")
        em.line(f"const int64_t np_ = std::min<int64_t>({tile}, {r(pixels)} - q0_);")
        em.line(f"int64_t oy_[{tile}], ox_[{tile}];")
        # one division per tile: the pixels' rows and columns advance from the first's
        em.line(f"int64_t y_ = q0_ / {r(ow)}, x_ = q0_ - y_ * {r(ow)};")
        if not based:
            em.line(f"const {mt}* xp_[{taps}][{tile}];  // per tap, each pixel's input channels (or zeros)")
            # Note [Interior tiles]: the tile's pixels on one output row, each tap of each inside the image
            em.line(f"const int64_t ty_ = y_ * {sh} - {ph}, tx_ = x_ * {sw} - {pwd};")
            em.line(
                f"const bool inner_ = x_ + {tile} <= {r(ow)} && ty_ >= 0 && ty_ + {(kh - 1) * dh} < {r(h)}"
                f" && tx_ >= 0 && tx_ + {(tile - 1) * sw + (kw - 1) * dw} < {r(w)};"
            )
        em.line(f"for (int p = 0; p < {tile}; ++p) {{")
        em.line("  oy_[p] = y_;")
        em.line("  ox_[p] = x_;")
        em.line(f"  if (q0_ + p + 1 < {r(pixels)} && ++x_ == {r(ow)}) {{  // the tail repeats the last pixel")
        em.line("    x_ = 0;")
        em.line("    ++y_;")
        em.line("  }")
        if not based:
            em.line("  if (inner_) continue;")
            em.line(f"  const int64_t iy0 = oy_[p] * {sh} - {ph}, ix0 = ox_[p] * {sw} - {pwd};")
            tap_pointers(em, a, (kh, kw), lambda k: f"xp_[{k}][p]", (sy, sx), (r(h), r(w)))
        em.line("}")
        window_of_taps = DepthwiseWindow(kh, kw, sw, dh, dw, (sy, sx, sc), oc)  # Note [Sliding taps]
        window: tuple[str, str, str] | None = None  # the windows' (row, pixel, channel) strides
        if based:  # Note [Window origins]
            if band is not None:
                band.stage(i_n.name, r(tiles), tile, (r(oh), r(ow)), sy, sx, sc)
                origin, row0, window = "band_", " - band_r0_", band.strides
            else:
                origin, row0, window = "xn_", "", (sy, sx, sc)
            em.line(f"const {mt}* pb_[{tile}];  // each pixel's window origin")
            em.line(f"#pragma GCC unroll {tile}")
            em.line(f"for (int p = 0; p < {tile}; ++p)")
            em.line(f"  pb_[p] = {origin} + (oy_[p] * {sh}{row0}) * {window[0]} + ox_[p] * {sw} * {window[1]};")

        def accumulate(width: int, pixel: str, npx: int = tile) -> None:
            """The taps' multiply-adds into acc for `npx` pixels; `pixel` is the input channels of tap k
            of pixel p. Through window origins (Note [Window origins]) the taps are walked as (ky, kx),
            each tap's offset ko_ a sum, not a division of k, and a pixel's channels are `window`'s
            channel stride apart (a band's may differ from the input's)."""
            sc_ = sc
            if window is not None:
                ty, tx, sc_ = window
                em.line(f"for (int64_t ky = 0; ky < {kh}; ++ky)")
                em.line(f"for (int64_t kx = 0; kx < {kw}; ++kx) {{")
                em.line(f"  const int64_t k = ky * {kw} + kx, ko_ = ky * {dh} * {ty} + kx * {dw} * {tx};")
            else:
                em.line(f"for (int64_t k = 0; k < {taps}; ++k) {{")
            if depthwise:
                em.line(f"  const {mt}* BPK_RESTRICT wc = wp_ + k * {oc} + cb;")
                em.line(f"  #pragma GCC unroll {tile}")
                em.line(f"  for (int p = 0; p < {tile}; ++p) {{")
                if mult == 1:
                    em.line(f"    const {mt}* BPK_RESTRICT xq_ = {pixel} + cb * {sc};")
                    xin = f"xq_[co * {sc}]"
                elif block % mult == 0:  # Note [Channel multipliers]
                    em.line(f"    const {mt}* BPK_RESTRICT xq_ = {pixel} + cb / {mult} * {sc};")
                    em.line(f"    {t} xe_[{width}];")
                    em.line("    #pragma omp simd")
                    em.line(f"    for (int64_t c = 0; c < {width // mult}; ++c) {{")
                    em.line(f"      #pragma GCC unroll {mult}")
                    em.line(f"      for (int j = 0; j < {mult}; ++j) xe_[c * {mult} + j] = {t}(xq_[c * {sc}]);")
                    em.line("    }")
                    xin = "xe_[co]"
                else:
                    em.line(f"    const {mt}* BPK_RESTRICT xq_ = {pixel};")
                    xin = f"xq_[(cb + co) / {mult} * {sc}]"
                em.line("    #pragma omp simd")
                em.line(f"    for (int64_t co = 0; co < {width}; ++co) acc[p][co] += {t}({xin}) * {t}(wc[co]);")
                em.line("  }")
            else:
                em.line(f"  for (int64_t ci = 0; ci < {cin}; ++ci) {{")
                w_row = f"k * {cin} + ci" if hwio else f"ci * {taps} + k"
                em.line(f"    const {mt}* BPK_RESTRICT wc = wp_ + ({w_row}) * {oc} + cb;")
                em.line(f"    #pragma GCC unroll {npx}")
                em.line(f"    for (int p = 0; p < {npx}; ++p) {{")
                em.line(f"      const {t} xv_ = {pixel}[ci * {sc_}];")
                em.line("      #pragma omp simd")
                em.line(f"      for (int64_t co = 0; co < {width}; ++co) acc[p][co] += xv_ * {t}(wc[co]);")
                em.line("    }")
                em.line("  }")
            em.line("}")

        def channel_block(width: int, npx: int, p0: int = 0, part: str = "") -> None:
            """One block of `width` output channels starting at channel cb for the tile's pixels p0 to
            p0 + npx (only window-origin tiles start past pixel 0): accumulate, then store. A depthwise
            `part` ("inner" or "edge") emits only that branch of Note [Interior tiles] (the caller tests)."""
            assert based or p0 == 0
            em.line(f"{t} acc[{npx}][{width}] = {{}};")
            if based:
                accumulate(width, f"(pb_[p + {p0}] + ko_)" if p0 else "(pb_[p] + ko_)", npx)
            elif part == "inner":  # Note [Sliding taps]
                em.line(f"const {mt}* BPK_RESTRICT x0_ = xn_ + ty_ * {sy} + tx_ * {sx};")
                sliding_taps(em, window_of_taps, tile, width, t, mt)
            elif part == "edge":
                accumulate(width, "xp_[k][p]")
            else:
                em.line("if (inner_) {  // Note [Interior tiles]: tap k of pixel p is tap k of pixel 0, p strides on")
                em.line(f"  const {mt}* BPK_RESTRICT x0_ = xn_ + ty_ * {sy} + tx_ * {sx};")
                em.line(f"  const int64_t ps_ = {sw} * {sx};")
                accumulate(width, f"(x0_ + k / {kw} * {dh} * {sy} + k % {kw} * {dw} * {sx} + p * ps_)")
                em.line("} else {")
                accumulate(width, "xp_[k][p]")
                em.line("}")

            def store_pixel() -> None:
                store_block(em, n.id, root, (i_n, oy, ox, cb + co), co, width)

            # the pixel loop has a constant trip count and is unrolled, so acc[px] is a register, never memory
            q = f"px + {p0}" if p0 else "px"  # the pixel's place in the tile
            em.loop(
                [f"#pragma GCC unroll {npx}", f"for (int px = 0; px < {npx}; ++px) {{"],
                [pix, oy, ox],
                store_pixel,
                prologue=[
                    f"if ({q} >= np_) break;",
                    f"const int64_t oy = oy_[{q}], ox = ox_[{q}];",
                    f"{mt}* BPK_RESTRICT orow_ = {out} + {image} + (q0_ + {q}) * {oc};",
                ],
            )

        def blocks(blk: int, npx: int, halves: bool = False, part: str = "") -> None:
            """The tile's `npx` pixels over every block of `blk` output channels; `halves`: each block
            wider than 8 channels in two halves of the pixels (Note [AVX2 pixel halves])."""
            full = oc - oc % blk

            def block_of(width: int) -> None:
                if not (halves and width > 8):
                    channel_block(width, npx, part=part)
                    return
                em.loop(["{"], [], lambda: channel_block(width, npx // 2))
                em.loop(["{"], [], lambda: channel_block(width, npx - npx // 2, npx // 2))

            em.loop([f"for (int64_t cb = 0; cb < {full}; cb += {blk}) {{"], [cb], lambda: block_of(blk))
            if oc % blk:  # the last, narrower block
                em.loop([f"{{ const int64_t cb = {full};"], [cb], lambda: block_of(oc % blk))

        # Note [Convolution tiles per ISA] (cpu_conv.py) for this kernel: AVX2's 16 vector registers
        # hold 8-12 accumulators (8 pixels x 8 channels, 6 x 16), so the AVX2 library walks the
        # channels in such narrower blocks (acc[6][64] is 48 vectors, which GCC spilled). Measured in
        # the AVX2 library: ResNet-18's 64-channel 3x3 convolutions 1265 -> 895 µs (65% -> 91% of its
        # FMA peak), the CNN sample 1.06-1.24x. Depthwise convolutions too (their acc[6][64] spilled
        # the same way): the zoo MobileNet's 64-channel depthwise layers at 8 x 96 x 96 448 -> 363 µs,
        # bitwise the same sums; their interior tiles now walk Note [Sliding taps]'s narrower blocks
        # (cpu_conv_sliding.py), their border tiles these. Not those with a channel multiplier (Note
        # [Channel multipliers]): its downsampling (16 -> 32 channels) took 54 -> 579 µs in blocks of 8,
        # so they stay whole.
        # Note [AVX2 pixel halves]: a window-origin tile of 8 pixels (16 to 48 output channels) walked
        # its channels in blocks of 8 in the AVX2 library (8 pixels x 1 vector: 8 accumulators, each of
        # a channel block's multiply-adds a load, 9 loads per 8 FMAs, every input value broadcast once per
        # block). Blocks of 16 channels with the tile's pixels in two halves (4 pixels x 2 vectors: also
        # 8 accumulators, 6 loads per 8 FMAs) measured faster on a Zen 4 EPYC, x86-64-v3 library, the CNN
        # sample at 6 x 24 x 30 (bench.peak's shapes are larger): its 16-channel 3x3 convolutions 8.0-8.3
        # -> 7.1-7.4 µs, the 3 -> 16 stem 7.6 -> 6.6, the 32-channel ones 8.1-8.2 -> 7.6-7.8, the whole
        # model 1.06-1.12x over its shapes (the MobileNet zoo model's stem 41.9 -> 35.4 µs at 4 x 64 x
        # 64); the sums are the same, bitwise. Tried: 6 + 2 pixels (12 and 4 accumulators) and, at 32
        # channels, 3 + 3 + 2 pixels of all 32: no faster than blocks of 8. A block of at most 8 channels
        # (the last of 24 or 40) keeps all 8 pixels.
        def per_isa(npx: int) -> None:
            sub = 8 * max(1, 12 // npx)
            if based and t == "float" and npx == 8 and block > 8:  # Note [AVX2 pixel halves]
                em.branch("#if defined(__AVX2__) && !defined(__AVX512F__)", lambda: blocks(16, npx, halves=True))
                em.branch("#else", lambda: blocks(block, npx))
                em.line("#endif")
            elif depthwise and mult == 1 and t == "float":  # Note [Sliding taps] in cpu_conv_sliding.py

                def split(inner: int, edge: int) -> None:
                    em.loop(["if (inner_) {"], [], lambda: blocks(min(block, inner), npx, part="inner"))
                    em.loop(["if (!inner_) {"], [], lambda: blocks(min(block, edge), npx, part="edge"))

                em.branch("#if defined(__AVX2__) && !defined(__AVX512F__)", lambda: split(SLIDING_BLOCK["avx2"], sub))
                em.branch("#else", lambda: split(SLIDING_BLOCK["wide"], block))
                em.line("#endif")
            elif (not depthwise or mult == 1) and t == "float" and block > sub:
                em.branch("#if defined(__AVX2__) && !defined(__AVX512F__)", lambda: blocks(sub, npx))
                em.branch("#else", lambda: blocks(block, npx))
                em.line("#endif")
            else:
                blocks(block, npx)

        # Note [Tail tiles] (cpu_conv_wide.py) for this kernel: an image's last tile with at most half
        # a tile of pixels computes only those (a 3 x 4 image's 12 pixels are a tile of 8 and one of 4,
        # not two of 8)
        tail = tile // 2
        if based and tail >= 2:
            em.loop([f"if (np_ > {tail}) {{"], [], lambda: per_isa(tile))
            # not an `else`: the emitter may hoist the epilogue's invariants between the two blocks
            em.loop([f"if (np_ <= {tail}) {{"], [], lambda: per_isa(tail))
        else:
            per_isa(tile)

    scratch = band.chunk_setup() if band is not None else [] if based else zero_pixel(em, xv, cin, mt)
    macs = tile * taps * oc * (1 if depthwise else cin)
    em.rows_loop([nb, tiles], f"{macs // 2 + 1}", body, scratch)


def nhwc_pool_kernel(em: Emitter) -> None:
    """Max / average pooling of channels-last values: one parallel row per (image, output row); per
    output pixel the valid window taps are computed once and each tap combines a whole pixel's
    channels (a contiguous vector run) into the accumulators.

    Note [Interior windows]: in an output row whose window rows all lie inside the input, the columns
    whose whole window does too take every tap in constant-trip loops, unrolled, over blocks of
    CHANNEL_BLOCK channels, so the accumulators stay in registers; the window bounds of the others
    vary and their accumulators live in memory. ResNet-18's 3x3 stride-2 max pooling of 64 channels at
    112 x 112: 96 -> 65 µs on 2 threads."""
    n = em.ctx.nodes[em.spec.roots[0]]
    a = n.attrs
    assert isinstance(a, Pool2dAttrs) and a.layout == "nhwc"
    x = n.inputs[0]
    view = em.ctx.view(x)
    assert view is not None
    p = em.ptr_load(view.base)
    nb, oh, ow, c = n.type.shape
    assert isinstance(c, int)
    h, w = em.ctx.types[x].shape[1:3]
    dt = n.type.dtype
    t, mt = CTYPE[dt], CPU_MEMTYPE[dt]
    is_max = n.op is OpKind.MAX_POOL2D
    floats = dt in FLOATS
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = a.kernel, a.stride, a.padding, a.dilation
    r = em.args.ref
    if is_max:
        init = f"-std::numeric_limits<{t}>::infinity()" if floats else f"std::numeric_limits<{t}>::lowest()"
        comb = f"bpk::fmax_nan<{t}>(acc_[ch], {t}(src_[ch * {r(view.strides[3])}]))"
        if not floats:
            comb = f"std::max<{t}>(acc_[ch], {t}(src_[ch * {r(view.strides[3])}]))"
    else:
        init = f"{t}(0)"
        comb = f"acc_[ch] + {t}(src_[ch * {r(view.strides[3])}])"

    def count() -> str:
        if is_max:
            return ""
        if a.count_include_pad:  # window cells inside the padded input
            hi_h, hi_w = f"{r(h)} + {ph}", f"{r(w)} + {pw}"
            return (
                "int64_t cnt_ = 0;\n"
                f"for (int64_t ki = 0; ki < {kh}; ++ki) {{ const int64_t hh = hh0 + ki * {dh};\n"
                f"  for (int64_t kj = 0; kj < {kw}; ++kj) {{ const int64_t ww = ww0 + kj * {dw};\n"
                f"    cnt_ += (hh >= -{ph} && hh < {hi_h} && ww >= -{pw} && ww < {hi_w}); }} }}"
            )
        return "const int64_t cnt_ = (ki1 - ki0) * (kj1 - kj0);"  # window cells inside the input

    def body(outer: tuple[Loop, ...]) -> None:
        i_n, i_h = outer
        base = em.args.index(sympy.expand(view.offset + i_n * view.strides[0]))
        sy, sx = r(view.strides[1]), r(view.strides[2])
        store_row = em.args.index(store_offset(n.type.shape, (i_n, i_h, sympy.Integer(0), sympy.Integer(0))))
        em.line(f"const {mt}* BPK_RESTRICT plane_ = {p} + {base};")
        em.line(f"{mt}* BPK_RESTRICT out_ = {em.ptr_store(n.id)} + {store_row};")
        em.line(f"const int64_t hh0 = {i_h.name} * {sh} - {ph};")
        em.line(f"const int64_t ki0 = hh0 < 0 ? std::min<int64_t>({kh}, (-hh0 + {dh} - 1) / {dh}) : 0;")
        em.line(
            f"const int64_t ki1 = std::max<int64_t>(ki0, std::min<int64_t>({kh}, ({r(h)} - hh0 + {dh} - 1) / {dh}));"
        )
        # Note [Interior windows]: the columns whose whole window lies inside the input, in a row whose
        # window rows do, take every tap in a constant-trip loop (unrolled, the accumulators in registers)
        em.line(f"const bool rows_in_ = ki0 == 0 && ki1 == {kh};")
        em.line(f"const int64_t ja_ = rows_in_ ? std::min<int64_t>({r(ow)}, ({pw} + {sw} - 1) / {sw}) : {r(ow)};")
        em.line(f"const int64_t jb_num_ = {r(w)} - 1 + {pw} - {(kw - 1) * dw};")
        em.line(
            f"const int64_t jb_ = std::max<int64_t>(ja_, jb_num_ < 0 ? 0 : std::min<int64_t>({r(ow)}, jb_num_ / {sw} + 1));"
        )

        def interior_block(width: int, c0: str) -> None:
            """Channels [c0, c0 + width) of output column j, every tap inside the input."""
            em.line(f"    {t} acc_[{width}];")
            em.line("    #pragma omp simd")
            em.line(f"    for (int64_t ch = 0; ch < {width}; ++ch) acc_[ch] = {init};")
            em.line(f"    #pragma GCC unroll {kh}")
            em.line(f"    for (int64_t ki = 0; ki < {kh}; ++ki) {{")
            em.line(f"      #pragma GCC unroll {kw}")
            em.line(f"      for (int64_t kj = 0; kj < {kw}; ++kj) {{")
            em.line(
                f"        const {mt}* BPK_RESTRICT src_ = win_ + ki * {dh} * {sy} + kj * {dw} * {sx}"
                f" + {c0} * {r(view.strides[3])};"
            )
            em.line("        #pragma omp simd")
            em.line(f"        for (int64_t ch = 0; ch < {width}; ++ch) acc_[ch] = {comb};")
            em.line("      }")
            em.line("    }")
            scale = "" if is_max else f" / {t}({kh * kw})"
            em.line("    #pragma omp simd")
            em.line(f"    for (int64_t ch = 0; ch < {width}; ++ch) out_[j * {c} + {c0} + ch] = acc_[ch]{scale};")

        for lo, hi in (("0", "ja_"), ("jb_", r(ow))):
            em.line(f"for (int64_t j = {lo}; j < {hi}; ++j) {{")
            em.line(f"  const int64_t ww0 = j * {sw} - {pw};")
            em.line(f"  {t} acc_[{c}];")
            em.line("  #pragma omp simd")
            em.line(f"  for (int64_t ch = 0; ch < {c}; ++ch) acc_[ch] = {init};")
            em.line(f"  const int64_t kj0 = ww0 < 0 ? std::min<int64_t>({kw}, (-ww0 + {dw} - 1) / {dw}) : 0;")
            em.line(
                f"  const int64_t kj1 = std::max<int64_t>(kj0, std::min<int64_t>({kw}, ({r(w)} - ww0 + {dw} - 1) / {dw}));"
            )
            em.line("  for (int64_t ki = ki0; ki < ki1; ++ki) {")
            em.line("    for (int64_t kj = kj0; kj < kj1; ++kj) {")
            em.line(
                f"      const {mt}* BPK_RESTRICT src_ = plane_ + (hh0 + ki * {dh}) * {sy} + (ww0 + kj * {dw}) * {sx};"
            )
            em.line("      #pragma omp simd")
            em.line(f"      for (int64_t ch = 0; ch < {c}; ++ch) acc_[ch] = {comb};")
            em.line("    }")
            em.line("  }")
            scale = ""
            if not is_max:
                for ln in count().split("\n"):
                    em.line("  " + ln)
                scale = f" / {t}(cnt_)"
            em.line("  #pragma omp simd")
            em.line(f"  for (int64_t ch = 0; ch < {c}; ++ch) out_[j * {c} + ch] = acc_[ch]{scale};")
            em.line("}")
            if lo != "0":
                continue
            em.line("for (int64_t j = ja_; j < jb_; ++j) {")
            em.line(f"  const {mt}* BPK_RESTRICT win_ = plane_ + hh0 * {sy} + (j * {sw} - {pw}) * {sx};")
            block = min(c, CHANNEL_BLOCK)
            full = c - c % block
            em.line(f"  for (int64_t c0 = 0; c0 < {full}; c0 += {block}) {{")
            interior_block(block, "c0")
            em.line("  }")
            if c % block:
                em.line("  {")
                interior_block(c % block, str(full))
                em.line("  }")
            em.line("}")

    em.rows_loop([nb, oh], f"{r(ow)} * {kh * kw * c} + 64", body)


def spatial_reduction(nodes: Mapping[int, Node], types: Mapping[int, TensorType], root: int) -> bool:
    """Whether the reduction `root` sums / averages / maxes / mins a channels-last value over H and W
    with a constant channel count (passes/channels_last.py's global pooling)."""
    n = nodes[root]
    a = n.attrs
    xt = types[n.inputs[0]]
    return (
        n.op in (OpKind.SUM, OpKind.MEAN, OpKind.AMAX, OpKind.AMIN)
        and isinstance(a, ReduceAttrs)
        and xt.rank == 4
        and sorted(ax % 4 for ax in a.axes) == [1, 2]
        and isinstance(xt.shape[3], int)
        and xt.dtype in FLOATS
    )


SPATIAL_CHANNELS = 16  # channels per parallel row of a spatial reduction (one or two vectors)


def nhwc_spatial_reduce_kernel(em: Emitter) -> None:
    """A global pooling of [N, H, W, C] over H and W: one parallel row per (image, block of
    SPATIAL_CHANNELS channels); the pixels are walked in memory order and each one's block of channels
    is combined into vector accumulators (in the reduction's accumulator type, as the generic reduction
    kernel does), so every load is a contiguous run whatever H and W are."""
    n = em.ctx.nodes[em.spec.roots[0]]
    a = n.attrs
    assert isinstance(a, ReduceAttrs)
    x = n.inputs[0]
    xt = em.ctx.types[x]
    nb, h, w, c = xt.shape
    assert isinstance(c, int)
    acc_t = em.accumulator(n)
    t = CTYPE[acc_t]
    dt = n.type.dtype
    kind = {OpKind.AMAX: "max", OpKind.AMIN: "min"}.get(n.op, "sum")
    init = reduce_init(kind, acc_t)
    blocks = (c + SPATIAL_CHANNELS - 1) // SPATIAL_CHANNELS
    ch, yy, xx = Loop("ch"), Loop("yy"), Loop("xx")
    r = em.args.ref

    c0 = Loop("c0")

    def block(i_n: Loop) -> None:
        em.line(f"const int64_t nc_ = std::min<int64_t>({SPATIAL_CHANNELS}, {c} - c0);")
        em.line(f"{t} acc_[{SPATIAL_CHANNELS}];")
        em.line(f"for (int64_t ch = 0; ch < {SPATIAL_CHANNELS}; ++ch) acc_[ch] = {init};")

        def step() -> None:
            v = em._as(em.eval(x, (i_n, yy, xx, c0 + ch)), xt.dtype, acc_t)
            if kind == "sum":
                em.line(f"acc_[ch] = acc_[ch] + {v};")
            else:
                em.line(f"acc_[ch] = bpk::f{kind}_nan<{t}>(acc_[ch], {v});")

        em.for_loop(
            yy,
            h,
            lambda: em.for_loop(
                xx, w, lambda: em.loop(["#pragma omp simd", "for (int64_t ch = 0; ch < nc_; ++ch) {"], [ch], step)
            ),
        )
        val = f"acc_[ch] / {t}({r(simplify(h * w))})" if n.op is OpKind.MEAN else "acc_[ch]"
        zero = sympy.Integer(0)
        out_idx = (i_n, zero, zero, c0 + ch) if a.keepdim else (i_n, c0 + ch)
        em.loop(
            ["for (int64_t ch = 0; ch < nc_; ++ch) {"],
            [ch],
            lambda: em.store(n.id, store_offset(n.type.shape, out_idx), f"{CTYPE[dt]}({val})"),
        )

    def body(outer: tuple[Loop, ...]) -> None:
        i_n, i_b = outer
        em.loop([f"{{ const int64_t c0 = {i_b.name} * {SPATIAL_CHANNELS};"], [c0], lambda: block(i_n))

    em.rows_loop([nb, blocks], f"{r(simplify(h * w))} * {SPATIAL_CHANNELS} + 16", body)
