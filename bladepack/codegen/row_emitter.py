"""Row ops in a kernel: `RowEmitter`, the `Emitter` whose row ops (reductions over trailing axes,
softmax, log-softmax, layer / RMS norm) read statistics their row passes computed.

In: the emitter of a row kernel (a backend's subclass: cpu_loops.CpuEmitter, cuda_loops.CudaEmitter).
Out: `reduce_pass` (one pass over the current row, combined with sum / prod / max / min; the CUDA
emitter reduces across a warp or block instead), the statistics of each row op (`_stats`: sums,
maxima, means, reciprocal standard deviations, computed once per row) and a row op's value at an
element (`_row_value`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import sympy

from bladepack.codegen.c_render import CTYPE, literal
from bladepack.codegen.emitter import Emitter, Scope
from bladepack.codegen.kernel import reduce_init, store_offset
from bladepack.dtypes import DType
from bladepack.ir import Node, OpKind
from bladepack.ir.ops import NormAttrs, SafeSoftmaxAttrs
from bladepack.ir.types import IRDim
from bladepack.ir.views import simplify


class RowEmitter(Emitter):
    def _row_len(self) -> IRDim:
        k = self.spec.reduced
        length: IRDim = 1
        for d in self.spec.domain[len(self.spec.domain) - k :]:
            length = simplify(length * d)
        return length

    def reduce_pass(
        self,
        dt: DType,
        kind: str,
        body: Callable[[tuple[sympy.Expr, ...]], str],
        store: Callable[[tuple[sympy.Expr, ...], str], None] | None = None,
    ) -> str:
        """One pass over the current row, combining `body` with `kind` ("sum", "prod", "max", "min");
        returns the C variable holding the result. `store(idx, var)` may also write each element's
        value (`var`) in the same pass. Each backend's schedule implements it."""
        raise NotImplementedError

    def _pass_accumulator(self, dt: DType, kind: str) -> tuple[str, list[Scope]]:
        """A row pass's accumulator, declared at row scope (passes are emitted there, whatever scope
        asked for them), and the scopes to restore once the pass is emitted."""
        saved = self.scopes
        self.scopes = saved[:2]
        acc = self.fresh("acc")
        self.declare(f"{CTYPE[dt]} {acc} = {reduce_init(kind, dt)};", acc)
        return acc, saved

    def _stats(self, n: Node) -> dict[str, str]:
        got = self.row_stats.get(n.id)
        if got is not None:
            return got
        x = n.inputs[0]
        xt = self.ctx.types[x].dtype
        acc_t = self.accumulator(n)
        t = CTYPE[acc_t]
        length = self.args.ref(self._row_len())

        def load(idx: tuple[sympy.Expr, ...]) -> str:
            return self._as(self.eval(x, idx), xt, acc_t)

        stats: dict[str, str] = {}
        if n.op in (OpKind.SUM, OpKind.MEAN):
            stats["acc"] = self.reduce_pass(acc_t, "sum", load)
        elif n.op is OpKind.PROD:
            stats["acc"] = self.reduce_pass(acc_t, "prod", load)
        elif n.op in (OpKind.AMAX, OpKind.AMIN):
            stats["acc"] = self.reduce_pass(acc_t, "max" if n.op is OpKind.AMAX else "min", load)
        elif n.op in (OpKind.SOFTMAX, OpKind.LOG_SOFTMAX):
            m, masked = self._safe_max(n, acc_t, self.reduce_pass(acc_t, "max", load))
            keep = self.softmax_in_place == n.id  # Note [Softmax in place]
            s = self.reduce_pass(
                acc_t,
                "sum",
                lambda idx: f"bpk::vexp_nonpos({load(idx)} - {m})",
                self._store_root(n.id) if keep else None,
            )
            stats = self._softmax_stats(n, acc_t, m, s, masked)
        elif n.op in (OpKind.LAYER_NORM, OpKind.RMS_NORM):
            assert isinstance(n.attrs, NormAttrs)
            eps = literal(n.attrs.eps, acc_t)
            rstd = self.fresh("rstd")
            if n.op is OpKind.LAYER_NORM:
                s = self.reduce_pass(acc_t, "sum", load)
                mean = self.fresh("mean")
                self.scopes[1].lines.append(f"const {t} {mean} = {s} / {t}({length});")
                v = self.reduce_pass(acc_t, "sum", lambda idx: f"(({load(idx)} - {mean}) * ({load(idx)} - {mean}))")
                self.scopes[1].lines.append(f"const {t} {rstd} = {t}(1) / std::sqrt({v} / {t}({length}) + {eps});")
                stats["mean"] = mean
            else:
                s = self.reduce_pass(acc_t, "sum", lambda idx: f"({load(idx)} * {load(idx)})")
                self.scopes[1].lines.append(f"const {t} {rstd} = {t}(1) / std::sqrt({s} / {t}({length}) + {eps});")
            stats["rstd"] = rstd
        else:
            raise ValueError(f"{n.op.value} is not a row op")
        self.row_stats[n.id] = stats
        return stats

    def _safe_max(self, n: Node, acc_t: DType, m: str) -> tuple[str, str]:
        """A softmax's row maximum `m` as its exponentials subtract it, and the C flag of a row that is
        entirely -inf ("" unless `n` is a safe softmax). Note [Safe softmax]: such a row (attention with
        every key masked) gives 0: the maximum is taken as 0, so the exponentials are exp(-inf) = 0, and
        the scale is 0."""
        if not isinstance(n.attrs, SafeSoftmaxAttrs):
            return m, ""
        t = CTYPE[acc_t]
        masked, safe = self.fresh("masked"), self.fresh("m")
        self.scopes[1].lines.append(f"const bool {masked} = {m} == {literal(-math.inf, acc_t)};")
        self.scopes[1].lines.append(f"const {t} {safe} = {masked} ? {t}(0) : {m};")
        return safe, masked

    def _softmax_stats(self, n: Node, acc_t: DType, m: str, s: str, masked: str) -> dict[str, str]:
        """A softmax's (or log-softmax's) statistics from its row maximum `m` and sum of exp(x - m) `s`:
        the scale 1 / s (0 for a masked row), or log(s)."""
        t = CTYPE[acc_t]
        if n.op is OpKind.SOFTMAX:
            inv = self.fresh("inv")
            scale = f"{masked} ? {t}(0) : {t}(1) / {s}" if masked else f"{t}(1) / {s}"
            self.scopes[1].lines.append(f"const {t} {inv} = {scale};")
            return {"max": m, "inv": inv}
        logsum = self.fresh("logsum")
        self.scopes[1].lines.append(f"const {t} {logsum} = std::log({s});")
        return {"max": m, "logsum": logsum}

    def _store_root(self, v: int) -> Callable[[tuple[sympy.Expr, ...], str], None]:
        dom = self.spec.domain

        def store(idx: tuple[sympy.Expr, ...], var: str) -> None:
            self.line(f"{self.ptr_store(v)}[{self.args.index(store_offset(dom, idx))}] = {var};")

        return store

    def _row_value(self, n: Node, idx: tuple[sympy.Expr, ...]) -> str:
        st = self._stats(n)
        dt = n.type.dtype
        t = CTYPE[dt]
        if n.op in (OpKind.SUM, OpKind.PROD, OpKind.AMAX, OpKind.AMIN):
            return self._as(st["acc"], self.accumulator(n), dt)
        if n.op is OpKind.MEAN:
            return f"{t}({st['acc']} / double({self.args.ref(self._row_len())}))"
        x = self._as(self.eval(n.inputs[0], idx), self.ctx.types[n.inputs[0]].dtype, dt)
        if n.op is OpKind.SOFTMAX:
            return f"(bpk::vexp_nonpos({x} - {st['max']}) * {st['inv']})"  # Note [Softmax exponentials]
        if n.op is OpKind.LOG_SOFTMAX:
            # (x - max) is exact near the maximum; x - (max + log(sum)) would round at the maximum's scale
            return f"(({x} - {st['max']}) - {st['logsum']})"
        assert isinstance(n.attrs, NormAttrs)
        y = f"(({x} - {st['mean']}) * {st['rstd']})" if n.op is OpKind.LAYER_NORM else f"({x} * {st['rstd']})"
        k = n.attrs.num_axes
        trail = idx[len(idx) - k :]
        rest = list(n.inputs[1:])
        if n.attrs.has_weight:
            y = f"({y} * {self._as(self.eval(rest.pop(0), trail), self.ctx.types[n.inputs[1]].dtype, dt)})"
        if n.attrs.has_bias:
            b = rest.pop(0)
            y = f"({y} + {self._as(self.eval(b, trail), self.ctx.types[b].dtype, dt)})"
        return y
