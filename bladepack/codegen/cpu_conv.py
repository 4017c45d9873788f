"""CPU convolution and pooling kernels: pooling, the direct convolution of packed weights, im2col.

In: a `CpuEmitter` whose spec is a "pool" or "conv" kernel, or an im2col feeding a convolution's GEMM.
Out: the kernel body. Their CUDA counterparts are in cuda_conv.py.
"""

from __future__ import annotations

import sympy

from bladepack.codegen.c_render import CPU_MEMTYPE, CTYPE, Loop
from bladepack.codegen.cpu_conv_nhwc import nhwc_conv_kernel, nhwc_pool_kernel
from bladepack.codegen.cpu_conv_wide import wide_conv_kernel
from bladepack.codegen.cpu_conv_winograd import winograd_conv_kernel
from bladepack.codegen.emitter import Emitter
from bladepack.codegen.kernel import FLOATS, store_offset
from bladepack.ir import Node, OpKind
from bladepack.ir.ops import (
    Pool2dAttrs,
)
from bladepack.ir.views import View, simplify, sym_eq


def pool_kernel(em: Emitter) -> None:
    """Max / average pooling, one parallel row per (image, channel, output row).

    Note [Separable pooling]: the window is a box, so each output row first combines its input rows
    (max or sum over the valid kernel rows: contiguous, vectorized) into a scratch row, then combines
    columns from that row per output column (constant-trip tap loops for interior columns). Valid
    kernel rows and columns are computed once per row / column: no bounds tests in the inner loops."""
    n = em.ctx.nodes[em.spec.roots[0]]
    a = n.attrs
    assert isinstance(a, Pool2dAttrs)
    if a.layout == "nhwc":  # Note [Channels-last chains]
        nhwc_pool_kernel(em)
        return
    x = n.inputs[0]
    xt = em.ctx.types[x]
    view = em.ctx.view(x)
    assert view is not None
    p = em.ptr_load(view.base)
    nb, c, oh, ow = n.type.shape
    h, w = xt.shape[2], xt.shape[3]
    dt = n.type.dtype
    t, mt = CTYPE[dt], CPU_MEMTYPE[dt]
    is_max = n.op is OpKind.MAX_POOL2D
    floats = dt in FLOATS
    kh, kw = a.kernel
    sh, sw = a.stride
    ph, pw = a.padding
    dh, dw = a.dilation
    r = em.args.ref
    if is_max:
        init = f"-std::numeric_limits<{t}>::infinity()" if floats else f"std::numeric_limits<{t}>::lowest()"
    else:
        init = f"{t}(0)"

    def comb(acc: str, v: str) -> str:
        if not is_max:
            return f"{acc} + {v}"
        return f"bpk::fmax_nan<{t}>({acc}, {v})" if floats else f"({v} > {acc} ? {v} : {acc})"

    def body(outer: tuple[Loop, ...]) -> None:
        i_n, i_c, i_h = outer
        off = em.args.index(sympy.expand(view.offset + i_n * view.strides[0] + i_c * view.strides[1]))
        s2, s3 = r(view.strides[2]), r(view.strides[3])
        em.line(f"const {mt}* BPK_RESTRICT plane_ = {p} + {off};")
        store_row = em.args.index(store_offset(n.type.shape, (i_n, i_c, i_h, sympy.Integer(0))))
        em.line(f"{mt}* BPK_RESTRICT out_ = {em.ptr_store(n.id)} + {store_row};")
        em.line(f"const int64_t hh0 = {i_h.name} * {sh} - {ph};")
        em.line(f"const int64_t ki0 = hh0 < 0 ? std::min<int64_t>({kh}, (-hh0 + {dh} - 1) / {dh}) : 0;")
        em.line(
            f"const int64_t ki1 = std::max<int64_t>(ki0, std::min<int64_t>({kh}, ({r(h)} - hh0 + {dh} - 1) / {dh}));"
        )
        em.line("#pragma omp simd")
        em.line(f"for (int64_t x = 0; x < {r(w)}; ++x) vm_[x] = {init};")
        em.line("for (int64_t ki = ki0; ki < ki1; ++ki) {")
        em.line(f"  const {mt}* BPK_RESTRICT src_ = plane_ + (hh0 + ki * {dh}) * {s2};")
        em.line("  #pragma omp simd")
        em.line(f"  for (int64_t x = 0; x < {r(w)}; ++x) vm_[x] = {comb('vm_[x]', f'src_[x * {s3}]')};")
        em.line("}")
        j = "j"

        def cell(interior: bool) -> None:
            em.line(f"  const int64_t ww0 = {j} * {sw} - {pw};")
            if interior:
                em.line(f"  constexpr int64_t kj0 = 0, kj1 = {kw};")
            else:
                em.line(f"  const int64_t kj0 = ww0 < 0 ? std::min<int64_t>({kw}, (-ww0 + {dw} - 1) / {dw}) : 0;")
                em.line(
                    f"  const int64_t kj1 = std::max<int64_t>(kj0, std::min<int64_t>({kw}, ({r(w)} - ww0 + {dw} - 1) / {dw}));"
                )
            em.line(f"  {t} acc_ = {init};")
            em.line(f"  for (int64_t kj = kj0; kj < kj1; ++kj) acc_ = {comb('acc_', f'vm_[ww0 + kj * {dw}]')};")
            if not is_max:
                if a.count_include_pad and (dh, dw) == (1, 1):  # window cells inside the padded input
                    em.line(
                        f"  const int64_t cnt_ = (std::min<int64_t>(hh0 + {kh}, {r(h)} + {ph}) - std::max<int64_t>(hh0, -{ph}))"
                        f" * (std::min<int64_t>(ww0 + {kw}, {r(w)} + {pw}) - std::max<int64_t>(ww0, -{pw}));"
                    )
                elif a.count_include_pad:
                    hi_h, hi_w = f"{r(h)} + {ph}", f"{r(w)} + {pw}"
                    em.line("  int64_t cnt_ = 0;")
                    em.line(f"  for (int64_t ki = 0; ki < {kh}; ++ki) {{ const int64_t hh = hh0 + ki;")
                    em.line(f"    for (int64_t kj = 0; kj < {kw}; ++kj) {{ const int64_t ww = ww0 + kj;")
                    em.line(f"      cnt_ += (hh >= -{ph} && hh < {hi_h} && ww >= -{pw} && ww < {hi_w}); }} }}")
                else:  # window cells inside the input
                    em.line("  const int64_t cnt_ = (ki1 - ki0) * (kj1 - kj0);")
                em.line(f"  acc_ = acc_ / {t}(cnt_);")
            em.line(f"  out_[{j}] = acc_;")

        # columns whose whole window lies inside the input get a constant-trip (unrolled) tap loop
        em.line(f"const int64_t ja_ = std::min<int64_t>({r(ow)}, ({pw} + {sw} - 1) / {sw});")
        em.line(f"const int64_t jb_num_ = {r(w)} - 1 + {pw} - {(kw - 1) * dw};")
        em.line(
            f"const int64_t jb_ = std::max<int64_t>(ja_, jb_num_ < 0 ? 0 : std::min<int64_t>({r(ow)}, jb_num_ / {sw} + 1));"
        )
        for lo, hi, interior in (("0", "ja_", False), ("ja_", "jb_", True), ("jb_", r(ow), False)):
            em.line(f"for (int64_t {j} = {lo}; {j} < {hi}; ++{j}) {{")
            cell(interior)
            em.line("}")

    scratch = [  # Note [Chunk scratch] in cpu_loops.py
        f"static thread_local std::vector<{t}> vrow_;",
        f"if (int64_t(vrow_.size()) < {r(w)}) vrow_.resize({r(w)});",
        f"{t}* BPK_RESTRICT vm_ = vrow_.data();",
    ]
    # a row costs ~100 cycles beyond its taps (window bounds, a short vector loop's scalar remainder):
    # counted, so pooling over a small batch's maps splits over the pool (measured 1.8x at batch 1-2)
    em.rows_loop([nb, c, oh], f"{em.args.ref(w)} * {4 * (kh + kw)} + 64", body, scratch)


def _conv_pixels(oc: int) -> int:
    """Output pixels per register tile of the direct convolution: about 8 accumulator vectors of 16
    floats (AVX-512), enough independent FMAs to hide their latency without spilling."""
    return 8 if oc <= 16 else 4


def direct_conv_kernel(em: Emitter) -> None:
    """Note [Direct convolution] (passes/direct_conv.py): one parallel row per (image, output row);
    per tile of `_conv_pixels` output pixels, acc[pixel][C_out] stays in registers while the taps
    (c_in, ky, kx) are walked, each tap's C_out packed weights read as one contiguous vector. Note
    [Padded rows]: the row's input rows are first copied into a thread-local buffer with the padding's
    zero columns and the columns past the last whole tile, so every tile reads without masks; rows
    outside the input are skipped. Note [Convolution epilogue]: when the kernel
    stores a chain after the convolution (spec.roots[0] is not the convolution), each accumulator is
    bound as the convolution's value at its output index and the chain is evaluated there."""
    from bladepack.ir.ops import Conv2dAttrs

    n = em.ctx.nodes[em.spec.nodes[0]]
    root = em.spec.roots[0]
    a = n.attrs
    if isinstance(a, Conv2dAttrs) and a.weight_layout == "tap_panels":  # Note [Wide convolutions]
        wide_conv_kernel(em)
        return
    if isinstance(a, Conv2dAttrs) and a.weight_layout == "winograd":  # Note [Winograd convolutions]
        winograd_conv_kernel(em)
        return
    if isinstance(a, Conv2dAttrs) and a.out_layout == "nhwc":  # Note [Channels-last chains]
        nhwc_conv_kernel(em)
        return
    assert isinstance(a, Conv2dAttrs) and a.weight_layout == "ihwo" and a.out_layout == "nchw"
    xv, wv = em.ctx.view(n.inputs[0]), em.ctx.view(n.inputs[1])
    assert xv is not None and wv is not None and wv.is_contiguous()
    px, pw_ = em.ptr_load(xv.base), em.ptr_load(wv.base)
    nb, oc, oh, ow = n.type.shape
    cin, kh, kw, _ = em.ctx.types[n.inputs[1]].shape
    h, w = em.ctx.types[n.inputs[0]].shape[2:]
    (sh, sw), (ph, pwd), (dh, dw) = a.stride, a.padding, a.dilation
    t, mt = CTYPE[n.type.dtype], CPU_MEMTYPE[n.type.dtype]
    r = em.args.ref
    tile = _conv_pixels(oc)
    out = em.ptr_store(root)
    x0, co, pix, cb = Loop("x0"), Loop("co"), Loop("px"), Loop("cb")

    def body(outer: tuple[Loop, ...]) -> None:
        i_n, i_y = outer
        base = em.args.index(sympy.expand(xv.offset + i_n * xv.strides[0]))
        store = em.args.index(store_offset(n.type.shape, (i_n, sympy.Integer(0), i_y, sympy.Integer(0))))
        s1, s2, s3 = r(xv.strides[1]), r(xv.strides[2]), r(xv.strides[3])
        plane = r(simplify(oh * ow))
        em.line(f"const {mt}* BPK_RESTRICT xn_ = {px} + {base};")
        em.line(f"const {mt}* BPK_RESTRICT wp_ = {pw_} + {r(wv.offset)};")
        em.line(f"{mt}* BPK_RESTRICT orow_ = {out} + {store};")
        em.line(f"const int64_t iy0 = {i_y.name} * {sh} - {ph};")
        # Note [Padded rows]: the input rows this output row reads, zero-padded to every column a whole
        # tile touches, so the tap loops have no masks and no border tiles
        em.line(f"const int64_t lo_x_ = std::min<int64_t>({pwd}, span_);")
        em.line(f"const int64_t hi_x_ = std::max<int64_t>(lo_x_, std::min<int64_t>(span_, {r(w)} + {pwd}));")
        em.line(f"for (int64_t ci = 0; ci < {cin}; ++ci) {{")
        em.line(f"  for (int64_t ky = 0; ky < {kh}; ++ky) {{")
        em.line(f"    {mt}* BPK_RESTRICT dst_ = rows_ + (ci * {kh} + ky) * span_;")
        em.line(f"    const int64_t iy = iy0 + ky * {dh};")
        em.line(f"    if (iy < 0 || iy >= {r(h)}) continue;")
        em.line(f"    const {mt}* BPK_RESTRICT xr = xn_ + ci * {s1} + iy * {s2};")
        em.line(f"    for (int64_t c = 0; c < lo_x_; ++c) dst_[c] = {mt}{{}};")
        em.line(f"    if ({s3} == 1) {{")
        em.line(f"      std::memcpy(dst_ + lo_x_, xr + (lo_x_ - {pwd}), size_t(hi_x_ - lo_x_) * sizeof({mt}));")
        em.line("    } else {")
        em.line(f"      for (int64_t c = lo_x_; c < hi_x_; ++c) dst_[c] = xr[(c - {pwd}) * {s3}];")
        em.line("    }")
        em.line(f"    for (int64_t c = hi_x_; c < span_; ++c) dst_[c] = {mt}{{}};")
        em.line("  }")
        em.line("}")

        def store_pixel(first: sympy.Expr) -> None:
            idx = (i_n, first + co, i_y, x0 + pix)
            value = "acc[px][co]"
            if root != n.id:  # Note [Convolution epilogue]: the accumulator is the convolution's value here
                em.bind(n.id, idx, value)
                value = em.eval(root, idx)
            em.line(f"orow_[(cb + co) * {plane} + x0 + px] = {value};")

        def channels(width: int, first: sympy.Expr) -> None:
            """acc over output channels [cb, cb + width) of the tile, then their stores."""
            em.line(f"{t} acc[{tile}][{width}] = {{}};")
            em.line(f"for (int64_t ci = 0; ci < {cin}; ++ci) {{")
            em.line(f"  for (int64_t ky = 0; ky < {kh}; ++ky) {{")
            em.line(f"    const int64_t iy = iy0 + ky * {dh};")
            em.line(f"    if (iy < 0 || iy >= {r(h)}) continue;  // a zero row: no contribution")
            em.line(f"    const {mt}* BPK_RESTRICT xr = rows_ + (ci * {kh} + ky) * span_ + x0 * {sw};")
            em.line(f"    for (int64_t kx = 0; kx < {kw}; ++kx) {{")
            em.line(f"      const {mt}* BPK_RESTRICT wt = wp_ + ((ci * {kh} + ky) * {kw} + kx) * {oc} + cb;")
            em.line(f"      for (int p = 0; p < {tile}; ++p) {{")
            em.line(f"        const {t} xv_ = xr[p * {sw} + kx * {dw}];")
            em.line("        #pragma omp simd")
            em.line(f"        for (int64_t co = 0; co < {width}; ++co) acc[p][co] += xv_ * wt[co];")
            em.line("      }")
            em.line("    }")
            em.line("  }")
            em.line("}")
            em.loop(
                [f"for (int64_t co = 0; co < {width}; ++co) {{"],
                [co],
                lambda: em.loop(["for (int64_t px = 0; px < np_; ++px) {"], [pix], lambda: store_pixel(first)),
            )

        def blocks(block: int) -> None:
            full = oc - oc % block
            if full:
                em.loop([f"for (int64_t cb = 0; cb < {full}; cb += {block}) {{"], [cb], lambda: channels(block, cb))
            if oc % block:
                em.loop([f"{{ const int64_t cb = {full};"], [cb], lambda: channels(oc % block, cb))

        def tile_body() -> None:
            em.line(f"const int64_t np_ = std::min<int64_t>({tile}, {r(ow)} - x0);")
            # Note [Convolution tiles per ISA]: the tile is AVX-512's, shared by every ISA level's library
            # (it sets the loop over x0): acc[4][64] is 16 of AVX-512's 32 vector registers but 32 of
            # AVX2's 16, which the compiler spilled, so AVX2 walks the taps once per block of channels
            # that keeps 8 accumulator vectors (4 pixels x 16 channels, 8 x 8). Measured on 3x3
            # convolutions in the AVX2 library (bench/results/peak_AMD_EPYC.md; 28 x 28 and 56 x 56): 64
            # channels 102-116 -> 181-207 GFLOP/s, 38-42% -> 67-77% of the FMA peak (blocks of 24 gave
            # 132-151, of 32 110-120), 16 channels 82-123 -> 120-168. The channels-last kernels
            # (cpu_conv_nhwc.py, cpu_conv_wide.py) keep their pixels and walk narrower blocks of
            # channels in the AVX2 library too.
            narrow = 8 * max(1, 8 // tile)  # 8 accumulator vectors: 4 pixels x 16 channels, 8 x 8
            if t == "float" and oc > narrow and tile * -(-oc // 8) > 12:
                em.branch("#if defined(__AVX2__) && !defined(__AVX512F__)", lambda: blocks(narrow))
                em.branch("#else", lambda: blocks(oc))
                em.line("#endif")
            else:
                blocks(oc)

        em.loop([f"for (int64_t x0 = 0; x0 < {r(ow)}; x0 += {tile}) {{"], [x0], tile_body)

    scratch = [  # Note [Padded rows]; Note [Chunk scratch] in cpu_loops.py
        f"const int64_t span_ = (({r(ow)} + {tile - 1}) / {tile} * {tile} - 1) * {sw} + {(kw - 1) * dw + 1};",
        f"static thread_local std::vector<{mt}> rows_buf_;",
        f"if (int64_t(rows_buf_.size()) < {cin * kh} * span_) rows_buf_.resize({cin * kh} * span_);",
        f"{mt}* BPK_RESTRICT rows_ = rows_buf_.data();",
    ]
    em.rows_loop([nb, oh], f"{r(ow)} * {cin * kh * kw * oc // 2 + 1}", body, scratch)


def im2col_kernel(em: Emitter, conv: Node, x_view: View, cols: int) -> None:
    """cols[n, c*KH*KW + ki*KW + kj, oh*OW + ow] = x[n, c, oh*s - p + ki*d, ...], 0 outside.

    One parallel row per (image, channel); per tap (ki, kj) the valid output columns [j_lo, j_hi) are
    computed once, so the copy loop has no bounds tests (contiguous and vectorized at stride 1) and
    the padding columns are plain zero fills."""
    from bladepack.ir.ops import Conv2dAttrs

    a = conv.attrs
    assert isinstance(a, Conv2dAttrs)
    p = em.ptr_load(x_view.base)
    _nb, c, h, w = em.ctx.types[conv.inputs[0]].shape
    _oc, _cg, kh, kw = em.ctx.types[conv.inputs[1]].shape
    cnhw = a.out_layout == "cnhw"  # Note [Batch-folded convolution]: columns [C*KH*KW, N, OH*OW]
    nb = conv.type.shape[1] if cnhw else conv.type.shape[0]
    oh, ow = conv.type.shape[2], conv.type.shape[3]
    t, mt = CTYPE[conv.type.dtype], CPU_MEMTYPE[conv.type.dtype]
    out = em.ptr_store(cols)
    # element offset of (image, channel, tap 0)'s column plane, and the distance between taps' planes
    tap_stride = simplify(nb * oh * ow) if cnhw else simplify(oh * ow)
    (sh, sw), (ph, pw), (dh, dw) = a.stride, a.padding, a.dilation
    r = em.args.ref

    # Note [Plane copies]: at stride 1 with "same" output size and a dense input plane, a tap's columns
    # are the input plane shifted by (ki - ph, kj - pw): one contiguous copy of the flattened plane,
    # then the few wrapped-around border columns and the padding rows are zeroed.
    plane = (
        (sh, sw, dh, dw) == (1, 1, 1, 1)
        and sym_eq(oh, h)
        and sym_eq(ow, w)
        and sym_eq(x_view.strides[3], 1)
        and sym_eq(x_view.strides[2], w)
    )

    def plane_taps() -> None:
        em.line(f"const int64_t hw = {r(oh)} * {r(ow)};")
        em.line(f"for (int64_t ki = 0; ki < {kh}; ++ki) {{")
        em.line(f"  for (int64_t kj = 0; kj < {kw}; ++kj) {{")
        em.line(f"    {mt}* BPK_RESTRICT d = dst_c + (ki * {kw} + kj) * {r(tap_stride)};")
        em.line(f"    const int64_t dy = ki - {ph}, dx = kj - {pw};")
        em.line(f"    const int64_t y0 = std::min<int64_t>({r(oh)}, std::max<int64_t>(0, -dy));")
        em.line(f"    const int64_t y1 = std::max<int64_t>(y0, std::min<int64_t>({r(oh)}, {r(h)} - dy));")
        em.line(f"    const int64_t j0 = std::min<int64_t>({r(ow)}, std::max<int64_t>(0, -dx));")
        em.line(f"    const int64_t j1 = std::max<int64_t>(j0, std::min<int64_t>({r(ow)}, {r(w)} - dx));")
        em.line(f"    for (int64_t f = 0; f < y0 * {r(ow)}; ++f) d[f] = {t}(0);")
        em.line("    if (y1 > y0 && j1 > j0) {")
        em.line(f"      const int64_t f0 = y0 * {r(ow)} + j0, f1 = (y1 - 1) * {r(ow)} + j1, shift = dy * {r(w)} + dx;")
        em.line("      #pragma omp simd")
        em.line("      for (int64_t f = f0; f < f1; ++f) d[f] = src_c[f + shift];")
        em.line("      for (int64_t y = y0; y < y1; ++y) {")
        em.line(f"        for (int64_t j = 0; j < j0; ++j) d[y * {r(ow)} + j] = {t}(0);")
        em.line(f"        for (int64_t j = j1; j < {r(ow)}; ++j) d[y * {r(ow)} + j] = {t}(0);")
        em.line("      }")
        em.line(f"    }} else {{ for (int64_t f = y0 * {r(ow)}; f < y1 * {r(ow)}; ++f) d[f] = {t}(0); }}")
        em.line(f"    for (int64_t f = y1 * {r(ow)}; f < hw; ++f) d[f] = {t}(0);")
        em.line("  }")
        em.line("}")

    def body(outer: tuple[Loop, ...]) -> None:
        i_n, i_c = outer
        base = em.args.index(sympy.expand(x_view.offset + i_n * x_view.strides[0] + i_c * x_view.strides[1]))
        first = (i_c * kh * kw * nb + i_n) * oh * ow if cnhw else (i_n * c + i_c) * kh * kw * oh * ow
        dst = em.args.index(sympy.expand(first))
        sx = r(x_view.strides[3])
        em.line(f"const {mt}* src_c = {p} + {base};")
        em.line(f"{mt}* BPK_RESTRICT dst_c = {out} + {dst};")
        if plane:
            plane_taps()
            return
        em.line(f"for (int64_t ki = 0; ki < {kh}; ++ki) {{")
        em.line(f"  for (int64_t kj = 0; kj < {kw}; ++kj) {{")
        em.line(f"    {mt}* BPK_RESTRICT dst_k = dst_c + (ki * {kw} + kj) * {r(tap_stride)};")
        em.line(f"    const int64_t lo_n = {pw} - kj * {dw}, hi_n = {r(w)} - 1 + {pw} - kj * {dw};")
        em.line(f"    const int64_t j_lo = std::min<int64_t>({r(ow)}, lo_n <= 0 ? 0 : (lo_n + {sw} - 1) / {sw});")
        em.line(
            f"    const int64_t j_hi = std::max<int64_t>(j_lo, hi_n < 0 ? 0 : std::min<int64_t>({r(ow)}, hi_n / {sw} + 1));"
        )
        em.line(f"    for (int64_t y = 0; y < {r(oh)}; ++y) {{")
        em.line(f"      {mt}* BPK_RESTRICT d = dst_k + y * {r(ow)};")
        em.line(f"      const int64_t hh = y * {sh} - {ph} + ki * {dh};")
        em.line(
            f"      if (hh < 0 || hh >= {r(h)}) {{ for (int64_t j = 0; j < {r(ow)}; ++j) d[j] = {t}(0); continue; }}"
        )
        em.line(f"      const {mt}* s = src_c + hh * {r(x_view.strides[2])};")
        em.line(f"      const int64_t w0 = kj * {dw} - {pw};")
        em.line(f"      for (int64_t j = 0; j < j_lo; ++j) d[j] = {t}(0);")
        em.line("      #pragma omp simd")
        em.line(f"      for (int64_t j = j_lo; j < j_hi; ++j) d[j] = s[(j * {sw} + w0) * {sx}];")
        em.line(f"      for (int64_t j = j_hi; j < {r(ow)}; ++j) d[j] = {t}(0);")
        em.line("    }")
        em.line("  }")
        em.line("}")

    em.rows_loop([nb, c], f"{kh * kw} * {r(oh)} * {r(ow)}", body)
