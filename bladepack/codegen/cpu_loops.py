"""The CPU schedule: `CpuEmitter.rows_loop` over `bpk::parallel_for`, and its row passes.

In: the outer dims of a kernel's domain and a body to run per row. Out: the chunked parallel loop
whose row symbols advance like an odometer, with the restrict-qualified declarations the body needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sympy

from bladepack.codegen.c_render import CTYPE, Loop
from bladepack.codegen.emitter import Emitter, RowBody
from bladepack.codegen.kernel import FLOATS
from bladepack.codegen.row_emitter import RowEmitter
from bladepack.dtypes import DType
from bladepack.ir.types import IRDim
from bladepack.ir.views import simplify


class CpuEmitter(RowEmitter):
    """The CPU backend's emitter: rows run in parallel chunks (`rows_loop`); a row pass is a loop nest
    over the row in one thread (`reduce_pass`)."""

    # Note [Channel tiles] (cpu_channel_tiles.py): where a dry run records them, each load's offset and
    # the scope its value is placed in (the innermost scope holding every value it depends on)
    probe: list[tuple[sympy.Expr, int]] | None = None

    def rows_loop(self, outer_dims: Sequence[IRDim], cost: str, body: RowBody, chunk_setup: Sequence[str] = ()) -> None:
        rows_loop(self, outer_dims, cost, body, chunk_setup)

    def load(self, base: int, dt: DType, off: sympy.Expr, syms: set[sympy.Symbol], key: object) -> str:
        name = super().load(base, dt, off, syms, key)
        if self.probe is not None:
            self.probe.append((off, self.depth[name]))
        return name

    def select(self, c: str, a: str, b: str, dt: DType) -> str:
        """Note [Invariant selects]: `c ? a : b` with `c` fixed across a loop that `a` or `b` varies in
        (a per-query-row mask in an attention's score loop) is not vectorized by GCC: if-conversion
        leaves the branch, and `omp simd` cannot help; GCC unswitches a loop on a few such conditions,
        not on the eight rows of the wide attention variant. Selecting the bits (bpk::select_bits) does
        vectorize. Measured side by side on the zoo's ViT: AVX-512 library 1.02-1.21x; in the AVX2
        library the and / andnot / or against one blend made the small sizes 3-4% slower, so there
        select_bits is the plain ternary again (1.02-1.03x, within noise)."""
        if dt in (DType.FLOAT32, DType.FLOAT64) and self.invariant(c, a, b):
            return f"bpk::select_bits({c}, {a}, {b})"
        return super().select(c, a, b, dt)

    def reduce_pass(
        self,
        dt: DType,
        kind: str,
        body: Callable[[tuple[sympy.Expr, ...]], str],
        store: Callable[[tuple[sympy.Expr, ...], str], None] | None = None,
    ) -> str:
        """One pass over the current row, combining `body` with `kind` ("sum", "prod", "max", "min");
        returns the C variable holding the result. The innermost loop carries (with `self.simd`)
        `#pragma omp simd reduction(...)` (max / min track NaN in a separate flag, like torch).
        `store(idx, var)` may also write each element's value (`var`) in the same pass."""
        t = CTYPE[dt]
        dom = self.spec.domain
        k = self.spec.reduced
        inner = [Loop(f"r{len(dom) - k + m}") for m in range(k)]
        acc, saved = self._pass_accumulator(dt, kind)
        track_nan = kind in ("max", "min") and dt in FLOATS
        if track_nan:
            self.declare(f"int {acc}_nan = 0;", acc + "_nan")
        full = (*self.outer, *inner)
        op = {"sum": "+", "prod": "*", "max": "max", "min": "min"}[kind]

        def innermost() -> None:
            v = body(full)
            if store is not None:
                named = self.fresh("e")
                self.line(f"const {t} {named} = {v};")
                store(full, named)
                v = named
            if kind == "sum":
                self.line(f"{acc} = {acc} + {v};")
            elif kind == "prod":
                self.line(f"{acc} = {acc} * {v};")
            else:
                cmp = ">" if kind == "max" else "<"
                self.line(f"{acc} = {v} {cmp} {acc} ? {v} : {acc};")
                if track_nan:
                    self.line(f"{acc}_nan = {acc}_nan | int({v} != {v});")

        def nest(m: int) -> None:
            sym = inner[m]
            header = [
                f"for (int64_t {sym.name} = 0; {sym.name} < {self.args.ref(dom[len(dom) - k + m])}; ++{sym.name}) {{"
            ]
            if m == k - 1:
                if self.simd:
                    red = f"reduction({op}:{acc})" + (f" reduction(|:{acc}_nan)" if track_nan else "")
                    header.insert(0, f"#pragma omp simd {red}")
                self.loop(header, [sym], innermost)
            else:
                self.loop(header, [sym], lambda: nest(m + 1))

        nest(0)
        if track_nan:
            self.line(f"if ({acc}_nan) {acc} = std::numeric_limits<{t}>::quiet_NaN();")
        self.depth[acc] = 1
        self.scopes = saved
        return acc


def rows_loop(
    em: Emitter, outer_dims: Sequence[IRDim], cost: str, body: RowBody, chunk_setup: Sequence[str] = ()
) -> None:
    """parallel_for over the flattened outer dims; `body` runs once per row with the row's symbols.

    The row symbols are split from the chunk's first row once (divisions) and then advanced like an
    odometer in the loop increment, so a short row costs no division (a `continue` in the body is safe).
    `chunk_setup`: statements run once per chunk before its rows (Note [Chunk scratch]: a kernel's
    thread-local scratch buffer is looked up there — a thread_local in a dlopen'ed library costs a
    call to the TLS resolver per access, more than a short row's work)."""
    syms = tuple(Loop(f"i{k}") for k in range(len(outer_dims)))
    rows: IRDim = 1
    for d in outer_dims:
        rows = simplify(rows * d)
    refs = [em.args.ref(d) for d in outer_dims]
    split, advance = [], ""
    if syms:
        names = [s.name for s in syms]
        split.append(f"  int64_t {', '.join(names)};")
        if len(syms) == 1:
            split.append(f"  {names[0]} = lo_;")
        else:
            parts = ["int64_t t_ = lo_;"]
            for k in range(len(syms) - 1, 0, -1):
                parts.append(f"{names[k]} = t_ % {refs[k]}; t_ /= {refs[k]};")
            parts.append(f"{names[0]} = t_;")
            split.append("  { " + " ".join(parts) + " }")
        advance = ", " + _odometer(names, refs)

    em.loop(
        [
            f"bpk::parallel_for(st, {em.args.ref(rows)}, {cost}, [&](int64_t lo_, int64_t hi_) {{",
            DECLS,
            *split,
            *(f"  {line}" for line in chunk_setup),
            f"  for (int64_t row_ = lo_; row_ < hi_; ++row_{advance}) {{",
        ],
        syms,
        lambda: body(syms),
        ["  }", "});"],
    )


def _odometer(names: Sequence[str], refs: Sequence[str]) -> str:
    """C expression advancing the row symbols (innermost last) by one row."""
    if len(names) == 1:
        return f"++{names[0]}"
    expr = f"++{names[0]}"
    for k in range(1, len(names)):
        expr = f"(++{names[k]} == {refs[k]} && ({names[k]} = 0, {expr}, true))"
    return f"(void){expr}"


# Note [Restrict inside the parallel body]: a lambda reading the kernel's pointers through its
# by-reference captures loses __restrict__ and must reload every argument after each store, which
# blocks vectorization; the parallel body therefore declares its own restrict pointers and int args.
DECLS = "/*bpk-decls*/"
