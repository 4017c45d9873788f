"""CPU channels-last convolution with many channels or taps (Note [Wide convolutions]).

In: a `CpuEmitter` whose spec is a "conv" kernel of a groups-1 convolution with out_layout "nhwc" on a
weight packed "tap_panels" ([ceil(C_out / 16) * KH, KW, C_in, 16]: passes/channels_last.py packs every
groups-1 convolution that `direct_conv` leaves, i.e. more than 64 output channels or more than 1152
taps per output). Out: the kernel body.

Note [Wide convolutions]: ResNet's 128- to 512-channel convolutions went through im2col and a BLAS
GEMM: a column buffer of 9 x C_in values per output pixel, the GEMM at 40-65% of the FMA peak, then a
separate pass for the batch norm / residual / ReLU. This kernel computes them channels-last in place,
as the small kernel does (a tile of CONV_TILE output pixels x a block of output channels in registers,
per tap a pointer to each pixel's input channels or to zeros, the epilogue chain evaluated on the
accumulators before the one store), with three changes for the size of their weights (a 512-channel
3x3 convolution has 9.4 MB):
- the weight is packed per panel of 16 output channels, and per tap within a panel (Note [Weight
  panels]), so a block of B = 64 output channels (4 panels) is one contiguous run;
- one parallel row per (block, image, group of up to TILE_GROUP tiles; an image of at most
  SMALL_IMAGE tiles is one group, its other rows empty), blocks outermost, so a thread's consecutive
  rows read the same block's weights;
- inside a row the input channels are walked in chunks of at most CHUNK_ROWS weight rows (input
  channel x tap, 256 KB of a 64-channel block: half the smallest L2 of the x86 cores served); each
  chunk serves every tile of the group before the next is read, and a tile's partial sums wait in a
  thread-local buffer between chunks. The last chunk evaluates the epilogue and stores.
An image's last tile with at most TAIL_PIXELS valid pixels computes only those (Note [Tail tiles]:
ResNet's maps of 7 x 7, 3 x 3 and 56 x 56 to 4 x 4 end in 1, 3 and 4 pixels; measured 1.03-1.05x on
ResNet-18 at 1 x 96 x 96 and 4 x 128 x 128, 1.00-1.01x at 224 x 224, both libraries, for 0.6 s more
build). Note [AVX2 weight prefetch]: an AVX2 tile of 16 channels read one 64-byte line of each
256-byte weight row (before Note [Weight panels], which made its rows contiguous; the prefetch was kept
and not measured again), a stride the hardware prefetchers followed too late (a third of ResNet-18's
layer-4 samples on that load); the tile prefetches AVX2_PREFETCH rows ahead: layer 4 1400 -> 1160
µs, the whole model 16.8 -> 15.9 ms (8 rows ahead measured 1228 µs, 24 and 32 within 1% of 16; in
the AVX-512 library, whose tile reads whole rows in order, prefetching measured no different); the
group's first tile also brings in whole rows (Note [AVX2 row touch] in cpu_conv_stream.py). The
pointer tables of a row's tiles are made once and serve every chunk. AVX-512 keeps 6 pixels x 64
channels (24 accumulator vectors); the AVX2 library, with 16 vector registers, walks a block 16
channels at a time (12 accumulators). Measured on ResNet-18 at 224 x 224, batch 1, 2 threads,
per-launch profiles before (im2col + GEMM + epilogue pass) and after, AMD EPYC
(bench/results/zoo_resnet18.md): AVX-512 library with OpenBLAS's own kernels, 128 channels 915 ->
500 µs, 256 channels 805 -> 505 µs, 512 channels 978 -> 640 µs (84%, 84% and 66% of the FMA peak; at
7 x 7 the 9.4 MB of weights come from memory once per call); AVX2 library with OpenBLAS's Haswell
kernels (an AVX2 machine's), 1302 -> 1003, 1149 -> 1022 and 1344 -> 1378 µs. Tried and dropped:
chunks of 16-128 input channels, groups of 4-64 tiles and balanced groups (within 5%, or slower
where a group's inputs and partial sums outgrow L2), no chunks (512 channels 10% slower), weights
[C_in, KH, KW, B] per block (the same), taps outside the chunk loop (partial sums per tap: 5-10%
slower), and AVX2 tiles of 3 pixels x 32 channels (much slower).

Note [Chunk streaming]: in a group of few tiles (a small image: ResNet-18's layers 3 and 4 at 1 x 96 x
96 are 6 x 6 and 3 x 3 pixels, 6 and 2 tiles) a chunk's weights came from memory during its first pass
and were then computed on from L2 with memory idle: the AVX2 library's first sub-block pass waited on
the chunk, its other three and the later tiles' passes found it in cache (on a Zen 4 EPYC its 512-channel
convolutions read 16 GB/s of weights, the AVX-512 library's, one pass per tile, 25). Now, in a group of
at most STREAM_TILES tiles, the passes over a chunk also prefetch the next chunk into L2, spread over
them: tile t < 2^j (2^j the largest power of two <= nt_) takes the rows whose input channel is t modulo
2^j, and an AVX2 sub-block pass takes its own line of each (the AVX-512 tile, all lines). The last
chunk streams in the first chunk of the thread's next row: this block's, unless the row ends the block's
last image, then the next block's (`next_row_weights`). The prefetches are `prefetcht2` (locality 1):
into L1 they evicted the pass's own lines and measured no faster than none. A group of more tiles
computes long enough per chunk for the hardware prefetchers (ResNet-18 at 224 x 224: 9 tiles at layer 4,
within 1% either way). The Winograd kernel streams the same way per transformed element (Note
[Winograd convolutions]). Measured on that Zen 4 (2 threads, per-launch profiles of the artifacts before
and after in one process, best of 30 rounds, outputs bitwise equal), ResNet-18 (samples/zoo.py), whole
call: x86-64-v3 library 3510 -> 2823 µs at 1 x 96 x 96 (layer 4 1583 -> 1104, layer 3 715 -> 588),
3610 -> 2792 at 2 x 64 x 64, 18745 -> 17201 at 4 x 128 x 128, 14186 -> 13884 at 1 x 224 x 224;
x86-64-v4 library 2692 -> 2432, 2484 -> 2312, 15624 -> 15405, 12292 -> 12310.

Note [Weight panels]: the AVX2 tile of 16 channels read one 64-byte line of each 256-byte row of a
block packed [KH, KW, C_in, 64], so a pass over a chunk's rows used a quarter of L1's sets (a 256-byte
stride maps to every fourth set of a 64-set, 8-way L1) and its weights could not stay in L1 between
tiles: on a Zen 4 EPYC (per-launch profiles, cpu-clock samples) a quarter of ResNet-18's layer-4 time
sat on the weight loads, and the kernel ran at 67% of the FMA peak where the AVX-512 library's ran at
82%; with its weights made L1-resident (a timing-only build) the AVX2 kernel matched the AVX-512 one.
Now each panel of 16 output channels is its own contiguous [KH, KW, C_in, 16] run ("tap_panels"), and
the AVX2 library walks a chunk sub-block outermost (for each panel, every tile of the group), in chunks
of AVX2_CHUNK_ROWS rows, so the panel's chunk (18 KB) stays in L1 while every tile of the group reads
it. The AVX-512 tile reads the four panels' rows (four streams) instead of one 256-byte row: the same
speed. Either change alone measured within 4%. Measured on that machine, ResNet-18 (samples/zoo.py),
per-launch profiles of the artifacts before and after in one process (best of 8-10 rounds), layer 4's
convolutions, x86-64-v3 library: 1 x 224 x 224 5473 -> 4669 µs, 1 x 96 x 96 1630 -> 1172, 4 x 128 x 128
6223 -> 5863; x86-64-v4 library 4446 -> 4477, 1162 -> 1046, 5081 -> 5027. Tried and dropped: packing
the tile's inputs as well ([tap][pixel][C_in] per tile: the same; transposed to [tap][C_in][pixel]:
slower), chunks of 16 input channels (slower), the tile's loop unswitched on its prefetch conditions
(2%).
"""

from __future__ import annotations

from collections.abc import Callable

from bladepack.codegen.c_render import CPU_MEMTYPE, CTYPE, Loop
from bladepack.codegen.cpu_conv_nhwc import (
    image_start,
    store_block,
    tap_pointers,
    zero_pixel,
)
from bladepack.codegen.cpu_conv_stream import next_row_weights, stream_line, touch_row
from bladepack.codegen.emitter import Emitter
from bladepack.ir.ops import CHANNEL_BLOCK, PANEL, Conv2dAttrs
from bladepack.ir.views import simplify

CONV_TILE = 6  # output pixels per register tile
TAIL_PIXELS = 4  # an image's last tile with at most this many pixels computes only these
TILE_GROUP = 16  # register tiles per parallel row
SMALL_IMAGE = 48  # an image of at most this many tiles is one group
CHUNK_ROWS = 1024  # weight rows (input channel x tap) per chunk: 1024 x 64 floats = 256 KB
AVX2_PREFETCH = 16  # weight rows ahead that the AVX2 tile prefetches (Note [AVX2 weight prefetch])
AVX2_CHUNK_ROWS = 288  # weight rows per AVX2 chunk: a panel's 288 x 16 floats (18 KB) stay in L1 (Note [Weight panels])
AVX2_BLOCK = 16  # output channels per AVX2 register tile: 6 pixels x 2 vectors
STREAM_TILES = 8  # groups of at most this many tiles stream the next chunk in (Note [Chunk streaming])


def _chunk(cin: int, rows: int, taps: int) -> int:
    """Input channels per chunk of at most `rows` weight rows: chunks of equal size (a last chunk of a
    few channels would pay a round of partial sums for little work), whole cache lines of each pixel's
    channels where they are 16 or more."""
    chunk = max(1, min(cin, rows // taps))
    return chunk - chunk % 16 if chunk > 16 else chunk


def _share_mask() -> str:
    """C: 2^j - 1 for the largest 2^j <= min(nt_, STREAM_TILES) (Note [Chunk streaming])."""
    text, k = "0", 2
    while k <= STREAM_TILES:
        text = f"nt_ >= {k} ? {k - 1} : {text}"
        k *= 2
    return text


def wide_conv_kernel(em: Emitter) -> None:
    """Note [Wide convolutions]."""
    n = em.ctx.nodes[em.spec.nodes[0]]
    root = em.spec.roots[0]
    a = n.attrs
    assert isinstance(a, Conv2dAttrs) and a.weight_layout == "tap_panels" and a.out_layout == "nhwc" and a.groups == 1
    xv, wv = em.ctx.view(n.inputs[0]), em.ctx.view(n.inputs[1])
    assert xv is not None and wv is not None and wv.is_contiguous()
    px, pw_ = em.ptr_load(xv.base), em.ptr_load(wv.base)
    nb, oh, ow, oc = n.type.shape
    _, h, w, cin = em.ctx.types[n.inputs[0]].shape
    kb, kw, _, panel = em.ctx.types[n.inputs[1]].shape
    assert isinstance(oc, int) and isinstance(cin, int) and isinstance(kb, int) and panel == PANEL
    block = min(oc, CHANNEL_BLOCK)
    kh = kb // -(-oc // PANEL)
    (sh, sw), (ph, pwd) = a.stride, a.padding
    t, mt = CTYPE[n.type.dtype], CPU_MEMTYPE[n.type.dtype]
    isz = n.type.dtype.itemsize
    r = em.args.ref
    sc = r(xv.strides[3])
    taps = kh * kw
    tile = CONV_TILE
    blocks = -(-oc // block)
    group = max(1, min(TILE_GROUP, 256 // taps))  # the row's pointer tables stay a few KB
    whole = max(group, min(SMALL_IMAGE, 512 // taps))
    chunk = _chunk(cin, CHUNK_ROWS, taps)
    # the AVX2 library's chunk where it walks the block in panels (Note [Weight panels])
    chunk_avx2 = _chunk(cin, AVX2_CHUNK_ROWS, taps) if t == "float" and block > AVX2_BLOCK else chunk
    pixels = simplify(oh * ow)
    tiles = simplify((pixels + tile - 1) // tile)
    groups = simplify((tiles + group - 1) // group)
    out = em.ptr_store(root)
    co, pix, oy, ox, cb = Loop("co"), Loop("px"), Loop("oy"), Loop("ox"), Loop("cb")

    def panel_lines(width: int) -> tuple[str, ...]:
        """The offsets (elements) of the panels of a block of `width` columns: one line of each row."""
        return tuple(str(q * taps * cin) for q in range(0, width, PANEL))

    def body(outer: tuple[Loop, ...]) -> None:
        i_b, i_n, i_g = outer
        sy, sx, image = image_start(em, n, xv, px, i_n)
        # the row's block of packed weights: [KH, KW, C_in, block], contiguous
        em.line(f"const {mt}* BPK_RESTRICT wp_ = {pw_} + {r(wv.offset)} + {i_b.name} * {cin * taps * block};")
        em.line(f"const int64_t cb_ = {i_b.name} * {block};")
        # a small image's tiles all in one row (its other rows are empty): one walk over the weights
        em.line(f"const int64_t gs_ = {r(tiles)} <= {whole} ? {r(tiles)} : {group};")
        em.line(f"const int64_t t0_ = {i_g.name} * gs_;")
        em.line("if (t0_ >= " + r(tiles) + ") continue;")
        em.line(f"const int64_t nt_ = std::min<int64_t>(gs_, {r(tiles)} - t0_);")
        # Note [Chunk streaming]: in a group of at most STREAM_TILES tiles, tile t < 2^j (2^j <= nt_ < 2^(j+1))
        # prefetches the next chunk's rows of the input channels equal to t mod 2^j
        em.line(f"const bool stream_ = nt_ <= {STREAM_TILES};")
        em.line(f"const int64_t share_ = {_share_mask()};")
        next_row_weights(em, f"{i_n.name} + 1 == {r(nb)} && t0_ + nt_ == {r(tiles)}", cin * taps * block * isz)
        em.line("#if defined(__AVX2__) && !defined(__AVX512F__)")
        em.line(f"constexpr int64_t ck_ = {chunk_avx2};")
        em.line("#else")
        em.line(f"constexpr int64_t ck_ = {chunk};")
        em.line("#endif")
        em.line(f"const {mt}* xp_[{whole}][{taps}][{tile}];  // per tile and tap, each pixel's input channels")
        em.line("for (int64_t t = 0; t < nt_; ++t) {")
        em.line(f"  const int64_t q0_ = (t0_ + t) * {tile};")
        em.line(f"  int64_t y_ = q0_ / {r(ow)}, x_ = q0_ - y_ * {r(ow)};")
        em.line(f"  for (int p = 0; p < {tile}; ++p) {{")
        em.line(f"    const int64_t iy0 = y_ * {sh} - {ph}, ix0 = x_ * {sw} - {pwd};")
        tap_pointers(em, a, (kh, kw), lambda k: f"xp_[t][{k}][p]", (sy, sx), (r(h), r(w)))
        em.line(f"    if (q0_ + p + 1 < {r(pixels)} && ++x_ == {r(ow)}) {{  // the tail repeats the last pixel")
        em.line("      x_ = 0;")
        em.line("      ++y_;")
        em.line("    }")
        em.line("  }")
        em.line("}")

        def tile_block(
            width: int, col: str, npx: int, prefetch: int = 0, touch_if: str = "", lines: tuple[str, ...] = ()
        ) -> None:
            """acc over output channels [cb, cb + width) of the first `npx` pixels of tile t for input
            channels [c0_, c1_): from zero or the partial sums, then back to them or, after the last
            chunk, stored. `touch_if`: the C condition under which each row read also touches the same
            row of the block's other panels (Note [AVX2 row touch]). `lines`: the offsets (elements) in a weight row of the lines this pass streams
            in of the next chunk's rows (Note [Chunk streaming])."""
            em.line(f"{t} acc[{npx}][{width}];")
            em.line(f"{t}* BPK_RESTRICT part_t_ = part_ + (t * {tile}) * {block} + {col};")
            em.line(f"#pragma GCC unroll {npx}")
            em.line(f"for (int p = 0; p < {npx}; ++p) {{")
            em.line("  #pragma omp simd")
            em.line(
                f"  for (int64_t co = 0; co < {width}; ++co) acc[p][co] = first_ ? {t}(0) : part_t_[p * {block} + co];"
            )
            em.line("}")
            em.line(f"for (int64_t k = 0; k < {taps}; ++k) {{")
            em.line(f"  const {mt}* const* BPK_RESTRICT xk_ = xp_[t][k];")
            em.line("  for (int64_t ci = c0_; ci < c1_; ++ci) {")
            # the row (tap k, input channel ci) of the panel holding column `col`: Note [Weight panels]
            em.line(f"    const {mt}* BPK_RESTRICT wc = wp_ + ({col}) * {taps * cin} + (k * {cin} + ci) * {PANEL};")
            if prefetch:  # Note [AVX2 weight prefetch]
                em.line(f"    __builtin_prefetch(wc + {prefetch * PANEL});")
            if touch_if:  # Note [AVX2 row touch] (cpu_conv_stream.py): the group's first tile, first
                # sub-block, where no chunk streamed this one in
                em.line(f"    if ({touch_if}) {{")
                touch_row(em, "wc", panel_lines(block)[1:])
                em.line("    }")
            if lines:  # Note [Chunk streaming]
                em.line("    if (stream_ && (ci & share_) == t) {")
                for ln in lines:
                    stream_line(em, "nb_", f"(k * {cin} + ci) * {PANEL} + {ln}", isz)
                em.line("    }")
            em.line(f"    #pragma GCC unroll {npx}")
            em.line(f"    for (int p = 0; p < {npx}; ++p) {{")
            em.line(f"      const {t} xv_ = xk_[p][ci * {sc}];")
            for q in range(0, width, PANEL):  # a panel's columns, contiguous
                em.line("      #pragma omp simd")
                em.line(
                    f"      for (int64_t co = 0; co < {min(PANEL, width - q)}; ++co) "
                    f"acc[p][{q} + co] += xv_ * {t}(wc[{q * taps * cin} + co]);"
                )
            em.line("    }")
            em.line("  }")
            em.line("}")
            em.line("if (!last_) {")
            em.line(f"  #pragma GCC unroll {npx}")
            em.line(f"  for (int p = 0; p < {npx}; ++p) {{")
            em.line("    #pragma omp simd")
            em.line(f"    for (int64_t co = 0; co < {width}; ++co) part_t_[p * {block} + co] = acc[p][co];")
            em.line("  }")
            em.line("}")

            def store_pixel() -> None:
                store_block(em, n.id, root, (i_n, oy, ox, cb + co), co, width)

            def store_tile() -> None:
                em.loop(
                    [f"#pragma GCC unroll {npx}", f"for (int px = 0; px < {npx}; ++px) {{"],
                    [pix, oy, ox],
                    store_pixel,
                    prologue=[
                        f"const int64_t q_ = (t0_ + t) * {tile} + px;",
                        f"if (q_ >= {r(pixels)}) break;",
                        f"const int64_t oy = q_ / {r(ow)}, ox = q_ - oy * {r(ow)};",
                        f"{mt}* BPK_RESTRICT orow_ = {out} + {image} + q_ * {oc};",
                    ],
                )

            # every region holding generated code is an emitter scope, so what it hoists lands
            # before the region, never inside another region's braces
            em.loop(["if (last_) {"], [], lambda: em.loop([f"{{ const int64_t cb = cb_ + {col};"], [cb], store_tile))

        def block_tiles(width: int) -> None:
            """Every chunk of input channels over every tile of the group, for a block of `width`."""

            def over_tiles(npx_body: Callable[[int], None]) -> None:
                def tile_body() -> None:
                    # Note [Tail tiles]: an image's last tile with at most TAIL_PIXELS valid pixels computes
                    # only those (at 7 x 7 the last of 9 tiles holds 1 pixel; at 3 x 3, 3 of 12)
                    em.line(f"const int64_t valid_ = {r(pixels)} - (t0_ + t) * {tile};")
                    em.loop([f"if (valid_ > {TAIL_PIXELS}) {{"], [], lambda: npx_body(tile))
                    em.loop(["else {"], [], lambda: npx_body(TAIL_PIXELS))

                em.loop(["for (int64_t t = 0; t < nt_; ++t) {"], [], tile_body)

            def whole_block() -> None:
                over_tiles(lambda npx: tile_block(width, "0", npx, lines=panel_lines(width)))

            def avx2() -> None:  # 16 vector registers: 6 pixels x 2 vectors of accumulators
                full = width - width % AVX2_BLOCK
                first = "sb_ == 0 && t == 0 && (first_ || !stream_)"

                def sub_blocks() -> None:  # each sub-block's pass streams in its own panel of the next chunk's rows
                    over_tiles(
                        lambda npx: tile_block(AVX2_BLOCK, "sb_", npx, AVX2_PREFETCH, first, (f"sb_ * {taps * cin}",))
                    )

                em.loop([f"for (int64_t sb_ = 0; sb_ < {full}; sb_ += {AVX2_BLOCK}) {{"], [], sub_blocks)
                if width % AVX2_BLOCK:
                    rest = width % AVX2_BLOCK
                    em.loop(
                        ["{"],
                        [],
                        lambda: over_tiles(
                            lambda npx: tile_block(rest, str(full), npx, AVX2_PREFETCH, lines=(str(full * taps * cin),))
                        ),
                    )

            def chunk_body() -> None:
                em.line(f"const int64_t c1_ = std::min<int64_t>({cin}, c0_ + ck_);")
                em.line(f"const bool first_ = c0_ == 0, last_ = c1_ == {cin};")
                # Note [Chunk streaming]: the address the next chunk's rows start at (the next row's first
                # chunk after the last), less this chunk's offset
                em.line(
                    f"const std::uintptr_t nb_ = last_ ? wn_ - std::uintptr_t(c0_) * {PANEL * isz} : "
                    f"reinterpret_cast<std::uintptr_t>(wp_) + ck_ * {PANEL * isz};"
                )
                if t != "float" or width <= AVX2_BLOCK:
                    whole_block()
                    return
                em.branch("#if defined(__AVX2__) && !defined(__AVX512F__)", avx2)
                em.branch("#else", whole_block)
                em.line("#endif")

            em.loop([f"for (int64_t c0_ = 0; c0_ < {cin}; c0_ += ck_) {{"], [], chunk_body)

        full = oc - oc % block
        if full:
            em.loop([f"if (cb_ < {full}) {{"], [], lambda: block_tiles(block))
        if oc % block:  # the last, narrower block
            em.loop([f"if (cb_ == {full}) {{"], [], lambda: block_tiles(oc % block))

    scratch = [
        f"static thread_local std::vector<{t}> part_buf_;",
        f"if (part_buf_.size() < size_t({whole * tile * block})) part_buf_.resize({whole * tile * block});",
        f"{t}* BPK_RESTRICT part_ = part_buf_.data();",
    ]
    scratch += zero_pixel(em, xv, cin, mt)
    macs = group * tile * taps * block * cin
    em.rows_loop([blocks, nb, groups], f"{macs // 2 + 1}", body, scratch)
