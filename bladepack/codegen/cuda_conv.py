"""CUDA kernels for convolution and pooling: pooling windows, direct convolutions, im2col columns.

In: the CUDA emitter of one kernel (cuda_loops.CudaEmitter) and the convolution or pooling node its
spec anchors. Out: the kernel body, one thread per output element (pooling, im2col) or per output
pixel (direct convolution), grid-striding over the rest (`rows_loop`).

Note [CUDA convolution]: the fusion plan and the layouts are the CPU's (passes/direct_conv.py,
passes/conv_layout.py). A convolution with packed [C_in, KH, KW, C_out] weights (at most 64 output
channels, 1152 taps) runs as a direct kernel: each thread keeps its pixel's C_out accumulators in
registers and walks the taps; the threads of a warp read adjacent input pixels and the same weight
(a broadcast). Every other convolution is im2col + one cuBLAS GEMM (per group; over the whole batch when
the result is channel-major), or a GEMM on x itself when it is 1x1, stride 1, unpadded. Accumulation is
float32 for float16 / bfloat16 (Note [Register types]).
"""

from __future__ import annotations

import sympy

from bladepack.codegen.c_render import CTYPE, Loop
from bladepack.codegen.cuda_loops import CudaEmitter
from bladepack.codegen.kernel import FLOATS, reduce_init, store_offset
from bladepack.ir import Node, OpKind
from bladepack.ir.ops import Conv2dAttrs, Pool2dAttrs
from bladepack.ir.views import View, simplify


def _window(em: CudaEmitter, o: str, pos: str, k: int, s: int, p: int, d: int, size: str) -> None:
    """`o`0 / `o`1: the window taps [lo, hi) of output position `pos` that fall inside [0, size)."""
    em.line(f"const int64_t {o}s_ = {pos} * {s} - {p};")
    em.line(f"const int64_t {o}a_ = (-{o}s_ + {d} - 1) / {d}, {o}b_ = ({size} - {o}s_ + {d} - 1) / {d};")
    em.line(f"const int64_t {o}0 = {o}s_ < 0 ? ({o}a_ < {k} ? {o}a_ : {k}) : 0;")
    em.line(f"const int64_t {o}1 = {o}b_ < {o}0 ? {o}0 : ({o}b_ < {k} ? {o}b_ : {k});")


def pool_kernel(em: CudaEmitter) -> None:
    """Max / average pooling: one thread per output element, bounds computed once per window."""
    n = em.ctx.nodes[em.spec.roots[0]]
    a = n.attrs
    assert isinstance(a, Pool2dAttrs)
    view = em.ctx.view(n.inputs[0])
    assert view is not None
    src = em.ptr_load(view.base)
    h, w = em.ctx.types[n.inputs[0]].shape[2:]
    dt = n.type.dtype
    t = CTYPE[dt]
    is_max = n.op is OpKind.MAX_POOL2D
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = a.kernel, a.stride, a.padding, a.dilation
    r = em.args.ref

    def body(idx: tuple[Loop, ...]) -> None:
        i_n, i_c, i_h, i_w = idx
        base = em.args.index(sympy.expand(view.offset + i_n * view.strides[0] + i_c * view.strides[1]))
        s2, s3 = r(view.strides[2]), r(view.strides[3])
        _window(em, "ki", i_h.name, kh, sh, ph, dh, r(h))
        _window(em, "kj", i_w.name, kw, sw, pw, dw, r(w))
        em.line(f"{t} acc_ = {reduce_init('max', dt) if is_max else f'{t}(0)'};")
        em.line("for (int64_t ki = ki0; ki < ki1; ++ki) {")
        em.line(f"  const auto* row_ = {src} + {base} + (kis_ + ki * {dh}) * {s2};")
        em.line("  for (int64_t kj = kj0; kj < kj1; ++kj) {")
        em.line(f"    const {t} v_ = bpk::ld(row_ + (kjs_ + kj * {dw}) * {s3});")
        if not is_max:
            em.line("    acc_ = acc_ + v_;")
        elif dt in FLOATS:
            em.line(f"    acc_ = bpk::fmax_nan<{t}>(acc_, v_);")
        else:
            em.line("    acc_ = v_ > acc_ ? v_ : acc_;")
        em.line("  }")
        em.line("}")
        if not is_max:
            if a.count_include_pad:  # window cells inside the padded input
                em.line("int64_t cnt_ = 0;")
                em.line(f"for (int64_t ki = 0; ki < {kh}; ++ki) {{ const int64_t hh = kis_ + ki * {dh};")
                em.line(f"  for (int64_t kj = 0; kj < {kw}; ++kj) {{ const int64_t ww = kjs_ + kj * {dw};")
                em.line(f"    cnt_ += hh >= -{ph} && hh < {r(h)} + {ph} && ww >= -{pw} && ww < {r(w)} + {pw}; }} }}")
            else:  # window cells inside the input
                em.line("const int64_t cnt_ = (ki1 - ki0) * (kj1 - kj0);")
            em.line(f"acc_ = acc_ / {t}(cnt_);")
        em.store(n.id, store_offset(n.type.shape, idx), "acc_")

    em.rows_loop(n.type.shape, "", body)


def direct_conv_kernel(em: CudaEmitter) -> None:
    """Note [CUDA convolution]: one thread per output pixel, its C_out accumulators in registers."""
    n = em.ctx.nodes[em.spec.roots[0]]
    a = n.attrs
    assert isinstance(a, Conv2dAttrs) and a.weight_layout == "ihwo" and a.out_layout == "nchw"
    xv, wv = em.ctx.view(n.inputs[0]), em.ctx.view(n.inputs[1])
    assert xv is not None and wv is not None and wv.is_contiguous()
    px, pw_ = em.ptr_load(xv.base), em.ptr_load(wv.base)
    nb, oc, oh, ow = n.type.shape
    cin, kh, kw, _ = em.ctx.types[n.inputs[1]].shape
    h, w = em.ctx.types[n.inputs[0]].shape[2:]
    (sh, sw), (ph, pwd), (dh, dw) = a.stride, a.padding, a.dilation
    t = CTYPE[n.type.dtype]
    r = em.args.ref
    plane = r(simplify(oh * ow))

    def body(idx: tuple[Loop, ...]) -> None:
        i_n, i_y, i_x = idx
        base = em.args.index(sympy.expand(xv.offset + i_n * xv.strides[0]))
        store = em.args.index(store_offset(n.type.shape, (i_n, sympy.Integer(0), i_y, i_x)))
        s1, s2, s3 = r(xv.strides[1]), r(xv.strides[2]), r(xv.strides[3])
        _window(em, "ky", i_y.name, kh, sh, ph, dh, r(h))
        _window(em, "kx", i_x.name, kw, sw, pwd, dw, r(w))
        em.line(f"{t} acc_[{oc}];")
        em.line("#pragma unroll")
        em.line(f"for (int co = 0; co < {oc}; ++co) acc_[co] = {t}(0);")
        em.line(f"for (int64_t ci = 0; ci < {cin}; ++ci) {{")
        em.line(f"  const auto* xc_ = {px} + {base} + ci * {s1};")
        em.line("  for (int64_t ky = ky0; ky < ky1; ++ky) {")
        em.line(f"    const auto* xr_ = xc_ + (kys_ + ky * {dh}) * {s2};")
        em.line("    for (int64_t kx = kx0; kx < kx1; ++kx) {")
        em.line(f"      const {t} x_ = bpk::ld(xr_ + (kxs_ + kx * {dw}) * {s3});")
        em.line(f"      const auto* wt_ = {pw_} + {r(wv.offset)} + ((ci * {kh} + ky) * {kw} + kx) * {oc};")
        em.line("      #pragma unroll")
        em.line(f"      for (int co = 0; co < {oc}; ++co) acc_[co] += x_ * {t}(bpk::ld(wt_ + co));")
        em.line("    }")
        em.line("  }")
        em.line("}")
        out = em.ptr_store(n.id)
        em.line("#pragma unroll")
        em.line(f"for (int co = 0; co < {oc}; ++co) bpk::st({out} + {store} + co * {plane}, acc_[co]);")

    em.rows_loop([nb, oh, ow], "", body)


def im2col_kernel(em: CudaEmitter, conv: Node, x_view: View, cols: int) -> None:
    """cols[n, c*KH*KW + ki*KW + kj, oh*OW + ow] = x[n, c, oh*s - p + ki*d, ...] (0 outside the input);
    channel-major results (Note [Batch-folded convolution]) put the tap first: cols[tap, n, pixel].
    One thread per column element: the threads of a warp write adjacent pixels."""
    a = conv.attrs
    assert isinstance(a, Conv2dAttrs)
    src = em.ptr_load(x_view.base)
    h, w = em.ctx.types[conv.inputs[0]].shape[2:]
    _oc, _cg, kh, kw = em.ctx.types[conv.inputs[1]].shape
    ow = conv.type.shape[3]
    (sh, sw), (ph, pw), (dh, dw) = a.stride, a.padding, a.dilation
    t = CTYPE[conv.type.dtype]
    shape = em.ctx.types[cols].shape
    r = em.args.ref

    def body(idx: tuple[Loop, ...]) -> None:
        img, tap = (idx[1], idx[0]) if a.out_layout == "cnhw" else (idx[0], idx[1])
        pix = idx[2]
        base = em.args.index(sympy.expand(x_view.offset + img * x_view.strides[0]))
        em.line(
            f"const int64_t c_ = {tap.name} / {kh * kw}, ki = {tap.name} % {kh * kw} / {kw}, kj = {tap.name} % {kw};"
        )
        em.line(f"const int64_t hh = {pix.name} / {r(ow)} * {sh} - {ph} + ki * {dh};")
        em.line(f"const int64_t ww = {pix.name} % {r(ow)} * {sw} - {pw} + kj * {dw};")
        em.line(
            f"const {t} v_ = hh >= 0 && hh < {r(h)} && ww >= 0 && ww < {r(w)} ? {t}(bpk::ld({src} + {base} + "
            f"c_ * {r(x_view.strides[1])} + hh * {r(x_view.strides[2])} + ww * {r(x_view.strides[3])})) : {t}(0);"
        )
        em.store(cols, store_offset(shape, idx), "v_")

    em.rows_loop(shape, "", body)
