"""The CPU schedule's parallel loop: `CpuEmitter.rows_loop` over `bpk::parallel_for`.

In: the outer dims of a kernel's domain and a body to run per row. Out: the chunked parallel loop
whose row symbols advance like an odometer, with the restrict-qualified declarations the body needs.
"""

from __future__ import annotations

from collections.abc import Sequence

from bladepack.codegen.c_render import Loop
from bladepack.codegen.emitter import Emitter, RowBody
from bladepack.codegen.row_emitter import RowEmitter
from bladepack.ir.types import IRDim
from bladepack.ir.views import simplify


class CpuEmitter(RowEmitter):
    """The CPU backend's emitter: rows run in parallel chunks (`rows_loop`)."""

    def rows_loop(self, outer_dims: Sequence[IRDim], cost: str, body: RowBody, chunk_setup: Sequence[str] = ()) -> None:
        rows_loop(self, outer_dims, cost, body, chunk_setup)


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
