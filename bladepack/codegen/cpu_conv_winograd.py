"""CPU channels-last 3x3 convolutions by Winograd's minimal filtering (Note [Winograd convolutions]).

In: a `CpuEmitter` whose spec is a "conv" kernel of a groups-1, 3x3, stride-1, undilated float32
convolution with out_layout "nhwc" on a weight packed "winograd" ([ceil(C_out / B) * 4, 4, C_in, B], B
= min(C_out, CHANNEL_BLOCK): per block of B output channels, per element e of the 4x4 transformed
filter, the [C_in, B] matrix of U = G g G^T; passes/winograd_conv.py). Out: the kernel body.

Note [Winograd convolutions]: F(2x2, 3x3) (Lavin and Gray, 2016) computes a 2x2 tile of output pixels
from the 4x4 input tile d under it as Y = A^T [U ⊙ (B^T d B)] A: per input channel the 16 transformed
inputs V = B^T d B, per output channel the 16 sums over input channels of U[e] V[e], then 2x2 outputs
from those 16. The sums are 16 matrix products [tiles, C_in] x [C_in, C_out], 4 multiply-adds per
output pixel and channel pair where the direct kernels do 9, and the transforms (additions only) are
linear in the channels, so they cost little beside the products from 64 channels on. Its rounding
error measured below the direct kernels' (fewer terms per sum; every transform coefficient is 0, ±1 or
±1/2, and U is computed in float64 and rounded once).

The kernel: one parallel row per (block of B output channels, RT consecutive output tiles), blocks
outermost so a thread's consecutive rows read one block's weights (at most 4 MB: the pass takes up to 256 x
256 channels). A row first transforms its tiles' inputs, all input channels, into V_ [16][RT][C_in] (each
tile's 16 input pixels are pointers, to zeros where a pixel is in the padding or past the image, so the
transform has no bounds tests; a row of another block transforms them again, about 6% of the block's
products). Then per element e, acc[RT][B] stays in registers while the input channels are walked (a broadcast
of V times a vector run of U[e], as in the direct kernels), into M_ [16][RT][B]; the output transform turns
each tile's 16 vectors into its 2x2 outputs, and each output pixel inside the image goes through the epilogue
chain (Note [Convolution epilogue]) to its store. A tile past the image's last row or column (odd sizes)
computes values no pixel stores. The AVX2 library walks a block 16 channels at a time (RT x 2 vectors: 12
accumulators in its 16 registers), inside the loop over e, so the sub-blocks share the element's weights in
L2; the first sub-block's pass of the first element brings in whole rows (Note [AVX2 row touch] in
cpu_conv_stream.py), and every pass streams its share of the next element's rows into L2 (Note [Chunk
streaming] in cpu_conv_wide.py: ResNet-18's 256-channel layer at 6 x 6, x86-64-v3, 175-181 -> 141-149 µs
per convolution). Measured
on ResNet-18 (2 threads, AMD EPYC, bench/results/zoo_resnet18.md), per 3x3 layer at 224 x 224, direct ->
Winograd, AVX-512 library: 64 channels 438-456 -> 289-318 µs, 128 channels 503-521 -> 291-305, 256
channels 504-509 -> 391-393; AVX2 library: 897-907 -> 491-507, 983-992 -> 540-552, 985-1014 -> 840-849. Tried:
rows of 2-6 register tiles sharing one pass over a block's weights (each e's [C_in, B] matrix reused from L1
across them) measured 5-15% slower overall, fewer rows to share among the threads; 7 tiles per register tile
(28 accumulators) 3-6% slower; 512 x 512 channels (layer 4) 1.1x at 7 x 7 but 0.6x at 3 x 3, where its 16.8 MB
of transformed weights, read once per call, bound it.

Note [Tiles across images]: a row's RT tiles are consecutive in (image, tile row, tile column) order, so
they run on from one image into the next: images of a few tiles (a 3 x 4 image has 4) fill whole register
tiles and give every thread rows. The row steps each tile's coordinates from the first's (one pair of
divisions per row). The CNN sample's 32-channel convolutions at 11 images of 3 x 4, x86-64-v3, 2 threads:
15.5-16.0 -> 12.5-12.7 µs per convolution.

Note [Winograd at few channels]: from 16 channels on, F(2x2, 3x3) pays for its transforms once a call holds
enough tiles; on a few it loses, every row multiplying RT tiles' worth (the register tile is fixed) and
fewer rows than threads. So a 3x3 convolution of 16 to 64 output channels (the direct kernel's, passes/
direct_conv.py) keeps its weight both ways ("hwio_winograd": the filter [3, 3, C_in, C_out], then its
transform; 25/9 of the filter's bytes) and its kernel has two variants, chosen per call by
`paired_winograd`: Winograd from MIN_TILES output tiles (all images together) where C_in x C_out is at
least WIDE_PAIRS, from MIN_TILES_NARROW below (the transforms weigh more beside fewer products), else the
direct kernel (Note [Channels-last convolution], reading the filter tap-major). A convolution whose chain
ends at a graph output stays with the NCHW direct kernel (no copy at the exit). The thresholds come from
a build that always took Winograd on the CNN sample: one tile of 32 channels ran 2.2x the direct
kernel's time, 8 tiles of 3 x 3 images 0.76-0.90x at 16 channels but 1.05-1.14x at 32. Against the
direct kernel alone (bench/results/winograd_variants_x86-64-v3.md, _v4.md: 1-8 images of 1 x 1 to 12 x
12 pixels, 2 threads, Zen 4), where the plan takes Winograd a pair of convolutions runs 1.05-1.85x
(x86-64-v3) and 1.06-1.87x (x86-64-v4) as fast; over the 32 shapes the whole call 1.15x at both levels.

Note [Accumulator stores]: GCC lowers the plain copy of the accumulator array into M_ (acc[p][co]
for every p and co) to a block copy through the stack, and so keeps the array in memory: one
accumulator spilled in the multiply-add loop and 24 stack moves after it (AVX2), 34 stack references
(AVX-512). Storing acc[p][co] + 0 is a vector add and store per register instead; the add changes only
a zero's sign. ResNet-18's 64-channel layers at 224 x 224 in the AVX2 library: 807 -> 520 µs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sympy

from bladepack.codegen.c_render import CPU_MEMTYPE, CTYPE, Loop
from bladepack.codegen.cpu_conv_nhwc import (
    image_start,
    tap_pointers,
    zero_pixel,
)
from bladepack.codegen.cpu_conv_stream import next_row_weights, row_lines, stream_line, touch_row
from bladepack.codegen.emitter import Emitter
from bladepack.codegen.kernel import store_offset
from bladepack.ir import Node
from bladepack.ir.ops import CHANNEL_BLOCK, Conv2dAttrs
from bladepack.ir.types import TensorType
from bladepack.ir.views import simplify

RT = 6  # output tiles per parallel row and register tile (AVX-512: 6 x 4 accumulator vectors)
# Note [Winograd at few channels]: the Winograd variant from MIN_TILES output tiles a call (C_in x C_out
# of WIDE_PAIRS and more), from MIN_TILES_NARROW below that
MIN_TILES, MIN_TILES_NARROW, WIDE_PAIRS = 8, 12, 32 * 32
AVX2_BLOCK = 16  # output channels per AVX2 register tile
# B^T (input) and A^T (output) of F(2x2, 3x3); every coefficient is 0 or ±1
B_T = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))
A_T = ((1, 1, 1, 0), (0, 1, -1, -1))


def _combine(row: Sequence[int], terms: Sequence[str]) -> str:
    """sum(row[k] * terms[k]) in C, for coefficients 0 and ±1."""
    out = ""
    for c, term in zip(row, terms):
        if c == 1:
            out += f" + {term}" if out else term
        elif c == -1:
            out += f" - {term}" if out else f"-{term}"
    return out


def paired_winograd(n: Node, types: Mapping[int, TensorType]) -> Any:
    """For a convolution on a weight packed "hwio_winograd": the predicate on its shapes under which the
    Winograd variant runs, the direct one otherwise (Note [Winograd at few channels]); else None."""
    a = n.attrs
    if not isinstance(a, Conv2dAttrs) or a.weight_layout != "hwio_winograd":
        return None
    nb, oh, ow, oc = (sympy.sympify(d) for d in n.type.shape)
    cin = types[n.inputs[1]].shape[2]
    tiles = nb * sympy.floor((oh + 1) / 2) * sympy.floor((ow + 1) / 2)
    return sympy.Ge(tiles, MIN_TILES if oc * cin >= WIDE_PAIRS else MIN_TILES_NARROW)


def winograd_conv_kernel(em: Emitter) -> None:
    """Note [Winograd convolutions]."""
    n = em.ctx.nodes[em.spec.nodes[0]]
    root = em.spec.roots[0]
    a = n.attrs
    assert isinstance(a, Conv2dAttrs) and a.weight_layout in ("winograd", "hwio_winograd") and a.out_layout == "nhwc"
    assert a.groups == 1 and a.stride == (1, 1) and a.dilation == (1, 1)
    xv, wv = em.ctx.view(n.inputs[0]), em.ctx.view(n.inputs[1])
    assert xv is not None and wv is not None and wv.is_contiguous()
    px, pw_ = em.ptr_load(xv.base), em.ptr_load(wv.base)
    nb, oh, ow, oc = n.type.shape
    _, h, w, cin = em.ctx.types[n.inputs[0]].shape
    block = em.ctx.types[n.inputs[1]].shape[3]
    # "hwio_winograd" (one block): the transform after the filter [3, 3, C_in, C_out]
    skip = 9 * cin * block if a.weight_layout == "hwio_winograd" else 0
    assert isinstance(oc, int) and isinstance(cin, int) and block == min(oc, CHANNEL_BLOCK)
    t, mt = CTYPE[n.type.dtype], CPU_MEMTYPE[n.type.dtype]
    isz = n.type.dtype.itemsize
    assert t == "float" and mt == "float"
    ph, pwd = a.padding
    r = em.args.ref
    sc = r(xv.strides[3])
    blocks = -(-oc // block)
    tiles = simplify(((oh + 1) // 2) * ((ow + 1) // 2))  # per image
    all_tiles = simplify(nb * tiles)
    groups = simplify((all_tiles + RT - 1) // RT)
    v_stride = RT * cin  # floats between V_'s elements e
    out = em.ptr_store(root)
    co, oy, ox, cb = Loop("co"), Loop("oy"), Loop("ox"), Loop("cb")
    tile_image = Loop("n_")  # the image of tile t (input transform) or p (outputs)

    def input_transform() -> None:
        """V_[e][t][c] for the row's tiles t and every input channel c."""
        em.line("for (int64_t t = 0; t < nt_; ++t) {")
        em.line("  const int64_t n_ = tn_[t];")
        sy, sx, _ = image_start(em, n, xv, px, tile_image)
        em.line(f"  const int64_t iy0 = 2 * ty_[t] - {ph}, ix0 = 2 * tx_[t] - {pwd};")
        em.line(f"  const {mt}* dp_[16];  // the tile's input pixels (or zeros), row-major")
        tap_pointers(em, a, (4, 4), lambda k: f"dp_[{k}]", (sy, sx), (r(h), r(w)))
        em.line(f"  {t}* BPK_RESTRICT v_ = V_ + t * {cin};")
        em.line("  #pragma omp simd")
        em.line(f"  for (int64_t c = 0; c < {cin}; ++c) {{")
        d = [f"d{k}" for k in range(16)]
        for k in range(16):
            em.line(f"    const {t} d{k} = dp_[{k}][c * {sc}];")
        # rows first (B^T d), then columns ((B^T d) B)
        for i in range(4):
            for j in range(4):
                col = [d[4 * k + j] for k in range(4)]
                em.line(f"    const {t} r{i}{j} = {_combine(B_T[i], col)};")
        for i in range(4):
            for j in range(4):
                row = [f"r{i}{k}" for k in range(4)]
                em.line(f"    v_[{(4 * i + j) * v_stride} + c] = {_combine(B_T[j], row)};")
        em.line("  }")
        em.line("}")

    def products(width: int, col: str, touch: bool = False, lines: tuple[str, ...] = ()) -> None:
        """M_[e][p][col + co] = sum over input channels of V_[e][p][ci] U[e][ci][col + co]; `touch`: the
        first sub-block of an AVX2 tile (Note [AVX2 row touch]); `lines`: the offsets (elements) in a
        weight row of the lines this pass streams in of the next element's rows (Note [Chunk streaming]
        in cpu_conv_wide.py)."""
        em.line(f"{t} acc[{RT}][{width}];")
        em.line(f"#pragma GCC unroll {RT}")
        em.line(f"for (int p = 0; p < {RT}; ++p) {{")
        em.line("  #pragma omp simd")
        em.line(f"  for (int64_t co = 0; co < {width}; ++co) acc[p][co] = {t}(0);")
        em.line("}")
        em.line(f"const {mt}* BPK_RESTRICT ue_ = wp_ + e * {cin * block} + {col};")
        em.line(f"for (int64_t ci = 0; ci < {cin}; ++ci) {{")
        em.line(f"  const {mt}* BPK_RESTRICT wc = ue_ + ci * {block};")
        if touch:  # the row's first element: the ones after it were streamed in
            em.line("  if (e == 0) {")
            touch_row(em, "wc", row_lines(block, isz)[1:])
            em.line("  }")
        for ln in lines:
            stream_line(em, "un_", f"ci * {block} + {ln}", isz)
        em.line(f"  #pragma GCC unroll {RT}")
        em.line(f"  for (int p = 0; p < {RT}; ++p) {{")
        em.line(f"    const {t} xv_ = ve_[p * {cin} + ci];")
        em.line("    #pragma omp simd")
        em.line(f"    for (int64_t co = 0; co < {width}; ++co) acc[p][co] += xv_ * wc[co];")
        em.line("  }")
        em.line("}")
        em.line(f"{t}* BPK_RESTRICT me_ = M_ + e * {RT * block} + {col};")
        # Note [Accumulator stores]: `+ 0` keeps each accumulator a register (a zero's sign is all it
        # can change, and no output transform or store tells them apart)
        em.line(f"#pragma GCC unroll {RT}")
        em.line(f"for (int p = 0; p < {RT}; ++p) {{")
        em.line("  #pragma omp simd")
        em.line(f"  for (int64_t co = 0; co < {width}; ++co) me_[p * {block} + co] = acc[p][co] + {t}(0);")
        em.line("}")

    def per_isa(width: int) -> None:
        """Every element's products for the row's register tile; the AVX2 library's in sub-blocks of
        AVX2_BLOCK channels, inside the loop over elements (a sub-block reads the element's weights
        that the one before it brought into L2)."""
        em.line("for (int64_t e = 0; e < 16; ++e) {")
        em.line(f"  const {t}* BPK_RESTRICT ve_ = V_ + e * {v_stride};")
        # Note [Chunk streaming] (cpu_conv_wide.py): the next element's weights, after the last the next row's first
        em.line(
            f"  const std::uintptr_t un_ = e < 15 ? reinterpret_cast<std::uintptr_t>(wp_) + "
            f"std::uintptr_t(e + 1) * {cin * block * isz} : wn_;"
        )
        if width <= AVX2_BLOCK:
            products(width, "0", lines=row_lines(width, isz))
            em.line("}")
            return
        full = width - width % AVX2_BLOCK

        def avx2() -> None:  # each sub-block's pass streams in its own line of the next element's rows
            em.line("{")
            products(AVX2_BLOCK, "0", touch=True, lines=("0",))
            em.line("}")
            em.line(f"for (int64_t sb_ = {AVX2_BLOCK}; sb_ < {full}; sb_ += {AVX2_BLOCK}) {{")
            products(AVX2_BLOCK, "sb_", lines=("sb_",))
            em.line("}")
            if width % AVX2_BLOCK:
                em.line("{")
                products(width % AVX2_BLOCK, str(full), lines=(str(full),))
                em.line("}")

        em.branch("#if defined(__AVX2__) && !defined(__AVX512F__)", avx2)
        em.branch("#else", lambda: products(width, "0", lines=row_lines(width, isz)))
        em.line("#endif")
        em.line("}")

    def output_pixel(k: int, width: int, image: str) -> None:
        """Output (dy, dx) = divmod(k, 2) of the tile, through the epilogue chain, where it is in the image."""
        dy, dx = divmod(k, 2)

        def store_channel() -> None:
            value = f"y_[{k}][co]"
            if root != n.id:  # the value is the convolution's; the kernel stores the chain's end
                em.bind(n.id, (tile_image, oy, ox, cb + co), value)
                value = em.eval(root, (tile_image, oy, ox, cb + co))
            em.line(f"orow_[cb + co] = {value};")

        em.loop(
            [f"if (2 * ty_[p] + {dy} < {r(oh)} && 2 * tx_[p] + {dx} < {r(ow)}) {{"],
            [oy, ox],
            lambda: em.loop(["#pragma omp simd", f"for (int64_t co = 0; co < {width}; ++co) {{"], [co], store_channel),
            prologue=[
                f"const int64_t oy = 2 * ty_[p] + {dy}, ox = 2 * tx_[p] + {dx};",
                f"{mt}* BPK_RESTRICT orow_ = {out} + {image} + (oy * {r(ow)} + ox) * {oc};",
            ],
        )

    def output_tile(width: int) -> None:
        """Tile p's 2x2 outputs from its 16 vectors of M_."""
        image = em.args.index(store_offset(n.type.shape, (tile_image, 0, 0, 0)))  # the tile's image's output
        em.line(f"const {t}* BPK_RESTRICT mp_ = M_ + p * {block};")
        em.line(f"{t} y_[4][{width}];")
        em.line("#pragma omp simd")
        em.line(f"for (int64_t co = 0; co < {width}; ++co) {{")
        for e in range(16):
            em.line(f"  const {t} m{e} = mp_[{e * RT * block} + co];")
        for i in range(2):  # A^T M
            for j in range(4):
                em.line(f"  const {t} s{i}{j} = {_combine(A_T[i], [f'm{4 * k + j}' for k in range(4)])};")
        for i in range(2):  # (A^T M) A
            for j in range(2):
                em.line(f"  y_[{2 * i + j}][co] = {_combine(A_T[j], [f's{i}{k}' for k in range(4)])};")
        em.line("}")
        for k in range(4):
            output_pixel(k, width, image)

    def block_body(width: int) -> None:
        """The row's tiles for a block of `width` output channels: products, then outputs."""
        per_isa(width)
        em.loop(
            ["for (int64_t p = 0; p < nt_; ++p) {"],
            [tile_image],
            lambda: output_tile(width),
            prologue=["const int64_t n_ = tn_[p];"],
        )

    def body(outer: tuple[Loop, ...]) -> None:
        i_b, i_g = outer
        em.line(f"const {mt}* BPK_RESTRICT wp_ = {pw_} + {r(wv.offset)} + {skip} + {i_b.name} * {16 * cin * block};")
        em.line(f"const int64_t tw_ = ({r(ow)} + 1) / 2, th_ = ({r(oh)} + 1) / 2;")
        em.line(f"const int64_t t0_ = {i_g.name} * {RT};")
        em.line(f"const int64_t nt_ = std::min<int64_t>({RT}, {r(all_tiles)} - t0_);")
        # Note [Tiles across images]: each tile's image, tile row and column, stepped from the first's
        em.line(f"int64_t tn_[{RT}], ty_[{RT}], tx_[{RT}];")
        em.line("{")
        em.line(f"  int64_t n_ = t0_ / {r(tiles)}, y_ = (t0_ - n_ * {r(tiles)}) / tw_;")
        em.line(f"  int64_t x_ = t0_ - n_ * {r(tiles)} - y_ * tw_;")
        em.line(f"  for (int p = 0; p < {RT}; ++p) {{")
        em.line("    tn_[p] = n_;")
        em.line("    ty_[p] = y_;")
        em.line("    tx_[p] = x_;")
        em.line("    if (++x_ == tw_) {")
        em.line("      x_ = 0;")
        em.line("      if (++y_ == th_) {")
        em.line("        y_ = 0;")
        em.line("        ++n_;")
        em.line("      }")
        em.line("    }")
        em.line("  }")
        em.line("}")
        next_row_weights(em, f"t0_ + nt_ == {r(all_tiles)}", 16 * cin * block * isz)
        input_transform()
        full = oc - oc % block

        def blocks_of_row() -> None:
            if full:
                em.loop([f"if (cb < {full}) {{"], [], lambda: block_body(block))
            if oc % block:  # the last, narrower block
                em.loop([f"if (cb == {full}) {{"], [], lambda: block_body(oc % block))

        em.loop([f"{{ const int64_t cb = {i_b.name} * {block};"], [cb], blocks_of_row)

    scratch = [
        f"static thread_local std::vector<{t}> wino_buf_;",
        f"if (wino_buf_.size() < size_t({16 * RT * (cin + block)})) wino_buf_.resize({16 * RT * (cin + block)});",
        f"{t}* BPK_RESTRICT V_ = wino_buf_.data();",
        f"{t}* BPK_RESTRICT M_ = V_ + {16 * RT * cin};",
    ]
    scratch += zero_pixel(em, xv, cin, mt)
    macs = RT * 16 * cin * block
    em.rows_loop([blocks, groups], f"{macs // 2 + 1}", body, scratch)
