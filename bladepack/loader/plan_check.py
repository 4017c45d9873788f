"""The native plan validator: what a launch list may index, checked before any of it runs.

In: the `Manifest` and a native plan (`native_cpu` / `native_cuda`). Out: nothing, or BpkFormatError
naming the launch and what is wrong. A checksum only proves the file is the one that was written; a
plan edited and re-hashed could otherwise make the kernel library or a BLAS read and write anywhere.

Note [Plan checks]: two stages.
- At load (`check_plan`): the plan's ABI; every launch's op; kernel rows and variant function indices
  (against the library's count); every register a SymInt, a predicate or a GEMM entry names (below
  `num_registers`); pointer slots (0 the arena, then inputs, outputs, weights); GEMM records of exactly
  20 integers; reference launches naming a plan step; arena buffers; the output slots (-1, or the
  output's own slot).
- Per input-shape signature (`check_launches`, on the resolved values; the executors run it as array
  operations, Note [Vectorized launch checks] in launch_checks.py): a non-negative arena; every
  arena buffer inside it; every pointer offset inside its slot (the arena, or the input, output or
  weight tensor the slot holds); and for GEMMs, the dims, leading dims, batch counts and strides
  against the bytes their operands address (Note [GEMM records]).
Kernel integer operands (dims and strides a generated kernel indexes with) mean something per kernel:
the kernel library checks them itself, per signature, before any launch runs (Note [Kernel operand
checks] in bladepack/codegen/operand_check.py; `operand_error` words its failures).

Note [GEMM records]: 20 integers: batch b0 b1 b2, A / B / C batch strides (3 each, elements), M N K,
ta tb, lda ldb ldc (row-major). A is M x K (stored K x M when ta), B is K x N (N x K when tb), C is
M x N. Every count and stride is non-negative, ta / tb are 0 or 1, every dim and leading dim fits a
32-bit BLAS integer, a leading dim is at least its row length, the batches of D do not all land on one
matrix (a batch dim with more than one entry has a positive D stride), and the last element each operand
reaches lies inside the tensor its pointer addresses.
"""

from __future__ import annotations

import reprlib
from collections.abc import Sequence
from typing import Any

from bladepack.artifact.shape_program import ShapeProgram
from bladepack.dtypes import DType
from bladepack.errors import BpkFormatError, ShapeGuardError
from bladepack.loader.manifest import Key, Manifest, condition_problem, describe, element_count, resolve

GEMM_INTS = 20
GEMM_OPS = ("gemm", "cublaslt", "cutlass")  # launch ops whose ints are a GEMM record (Note [GEMM records])
_CUDA_ONLY = ("cublaslt", "cutlass")
_EPILOGUES = {"source": ("none", "bias", "residual"), "activation": ("none", "relu", "gelu", "silu", "gelu_tanh")}
_LT_ACTIVATIONS = ("none", "relu", "gelu_tanh")  # Note [cuBLASLt GEMMs]
INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1
BYTE_SIZES = {d.value: d.itemsize for d in DType}
_GEMM_DTYPES = {kind: ("float32", "float64", "float16", "bfloat16") for kind in ("cpu", "cuda")}


def _fail(m: Manifest, what: str) -> BpkFormatError:
    return BpkFormatError(f"{m.source}: corrupt plan: {what}")


def _short(v: Any) -> str:
    """A bounded repr: a hostile manifest's values may nest a thousand levels deep."""
    return reprlib.repr(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_plan(m: Manifest, kind: str, n_functions: int | None) -> None:
    """See `_check_plan`; a record of the wrong shape (a list for a map, text for a number) is a
    BpkFormatError too."""
    try:
        _check_plan(m, kind, n_functions)
    except (AttributeError, TypeError, KeyError, ValueError, IndexError) as e:
        raise _fail(m, f"a native {kind} plan record is malformed ({type(e).__name__}: {describe(e)})") from None


def _check_plan(m: Manifest, kind: str, n_functions: int | None) -> None:
    """Load-time checks of the `kind` ("cpu" / "cuda") native plan; `n_functions` is the CPU library's
    function count (None: the CUDA plan, whose variants name functions by symbol)."""
    plan = m.native[kind]
    assert plan is not None
    n_regs = m.program.num_registers
    n_slots = 1 + len(m.input_ids) + len(m.outputs) + len(m.weight_rows)

    def symint(v: Any, where: str) -> None:
        if _is_int(v):
            return
        if isinstance(v, dict) and set(v) == {"r"} and _is_int(v["r"]) and 0 <= v["r"] < n_regs:
            return
        raise _fail(m, f"{where}: {_short(v)} is neither an integer nor a register below {n_regs}")

    def register(r: Any, where: str) -> None:
        if not (_is_int(r) and 0 <= r < n_regs):
            raise _fail(m, f"{where}: register {_short(r)} is not below {n_regs}")

    if plan.get("abi") != 1:
        raise _fail(m, f"native {kind} plan ABI {_short(plan.get('abi'))} is not 1")
    for key in ("launches", "buffers", "outputs"):
        if not isinstance(plan.get(key), list):
            raise _fail(m, f"the native {kind} plan lacks its {key} list")
    outs = plan["outputs"]
    n_in = len(m.input_ids)
    if len(outs) != len(m.outputs):
        raise _fail(m, f"the plan writes {_short(outs)}; the signature has {len(m.outputs)} outputs")
    for k, slot in enumerate(outs):
        if not _is_int(slot) or slot not in (-1, 1 + n_in + k):
            raise _fail(m, f"output {k} is written to slot {_short(slot)}; allowed: -1 or {1 + n_in + k}")
        if slot != -1 and m.outputs[k] not in m.values:
            raise _fail(m, f"output {k} is written to slot {slot} but is %{_short(m.outputs[k])}, no value of the plan")
    kernels = m.kernels[kind]
    for k, row in enumerate(kernels):
        if not isinstance(row.get("name"), str):
            raise _fail(m, f"kernel {k} has name {_short(row.get('name'))}; a string is required")
        variants = row.get("variants")
        if not isinstance(variants, list) or not variants:
            raise _fail(m, f"kernel {k} has no variants")
        for v in variants:
            register(v.get("pred"), f"kernel {k}'s variant predicate")
            fn = v.get("fn")
            if n_functions is not None and not (_is_int(fn) and 0 <= fn < n_functions):
                raise _fail(m, f"kernel {k} names function {_short(fn)}; the library has {n_functions}")
            for key in ("grid", "smem"):
                if key in v:
                    symint(v[key], f"kernel {k}'s {key}")
    gemm_kernels = plan.get("gemm_kernels", [])

    def byte_ptr(p: Any) -> bool:
        return (
            isinstance(p, list)
            and len(p) == 2
            and _is_int(p[0])
            and 0 <= p[0] < n_slots
            and (
                _is_int(p[1])
                or (isinstance(p[1], dict) and set(p[1]) == {"r"} and _is_int(p[1]["r"]) and 0 <= p[1]["r"] < n_regs)
            )
        )

    for i, lr in enumerate(plan["launches"]):
        where = f"launch {i}"
        op = lr.get("op")
        problem = condition_problem(lr.get("when", []), n_regs, byte_ptr, "ptr")
        if problem:  # Note [Guarded launches] (lowering/lower_native.py)
            raise _fail(m, f"{where}'s condition {problem}")
        if op == "ref":
            if not _is_int(lr.get("node")) or lr["node"] not in m.step_index:
                raise _fail(m, f"{where} runs value %{_short(lr.get('node'))}, which no plan step defines")
            continue
        if op not in ("kernel", "gemm") and not (kind == "cuda" and op in _CUDA_ONLY):
            ops = "kernel, gemm, ref" if kind == "cpu" else "kernel, gemm, cublaslt, cutlass, ref"
            raise _fail(m, f"{where} has op {_short(op)}; a {kind} plan runs {ops} launches")
        ptrs, ints = lr.get("ptrs"), lr.get("ints")
        if not isinstance(ptrs, list) or not isinstance(ints, list):
            raise _fail(m, f"{where} lacks its ptrs / ints lists")
        for p in ptrs:
            if not (isinstance(p, list) and len(p) == 2 and _is_int(p[0])):
                raise _fail(m, f"{where} has a pointer {_short(p)}; a pointer is [slot, byte offset]")
            if not 0 <= p[0] < n_slots:
                raise _fail(m, f"{where} points at slot {p[0]}; slots are 0 to {n_slots - 1}")
            out = p[0] - 1 - len(m.input_ids)
            if 0 <= out < len(m.outputs) and outs[out] == -1:
                raise _fail(m, f"{where} points at output {out}'s slot, which the plan does not write")
            symint(p[1], f"{where}'s pointer offset")
        for v in ints:
            symint(v, f"{where}'s integer")
        if op == "kernel":
            if not (_is_int(lr.get("k")) and 0 <= lr["k"] < len(kernels)):
                raise _fail(m, f"{where} runs kernel {_short(lr.get('k'))}; the plan has {len(kernels)}")
        else:
            if not isinstance(lr.get("dtype"), str) or lr["dtype"] not in _GEMM_DTYPES[kind]:
                raise _fail(m, f"{where} is a GEMM on {_short(lr.get('dtype'))}")
            want = (3,) if op == "gemm" else (3, 4)
            if len(ptrs) not in want or len(ints) not in (GEMM_INTS, GEMM_INTS + 4):
                raise _fail(
                    m, f"{where}: a GEMM takes 3 pointers and {GEMM_INTS} integers, not {len(ptrs)} / {len(ints)}"
                )
            epilogue = lr.get("epilogue")
            if epilogue is not None and (
                not isinstance(epilogue, dict) or any(epilogue.get(f) not in v for f, v in _EPILOGUES.items())
            ):
                raise _fail(m, f"{where} has epilogue {_short(epilogue)}")
            if op == "cublaslt" and epilogue is not None and epilogue["activation"] not in _LT_ACTIVATIONS:
                raise _fail(m, f"{where}: cuBLASLt computes no {epilogue['activation']} epilogue")
            sourced = epilogue is not None and epilogue["source"] != "none"
            if op == "cublaslt" and not (len(ptrs) == 4) == (len(ints) == GEMM_INTS + 4) == sourced:
                raise _fail(
                    m,
                    f"{where}: a cuBLASLt GEMM has a fourth operand and four more integers exactly when its epilogue has a source",
                )
            for table in ("entries", "entries_sm90"):
                for e in lr.get(table, []) if op == "cutlass" else []:
                    register(e.get("pred"), f"{where}'s dispatch predicate")
                    if not (_is_int(e.get("kernel")) and 0 <= e["kernel"] < len(gemm_kernels)):
                        raise _fail(m, f"{where} dispatches to GEMM kernel {_short(e.get('kernel'))}")
    for b in plan["buffers"]:
        if not _is_int(b.get("id")):
            raise _fail(m, f"an arena buffer has id {_short(b.get('id'))}")
        if not isinstance(b.get("dtype"), str) or b["dtype"] not in BYTE_SIZES:
            raise _fail(m, f"arena buffer %{_short(b.get('id'))} has dtype {_short(b.get('dtype'))}")
        if not isinstance(b.get("shape"), list):
            raise _fail(
                m, f"arena buffer %{_short(b.get('id'))} has shape {_short(b.get('shape'))}; a list is required"
            )
        for d in b["shape"]:
            symint(d, f"arena buffer %{_short(b.get('id'))}'s shape")
        symint(b.get("offset"), f"arena buffer %{_short(b.get('id'))}'s offset")
    symint(plan.get("arena_bytes"), "the arena size")


def check_launches(
    m: Manifest, kind: str, key: Key, regs: Sequence[int], out_shapes: Sequence[Sequence[int]]
) -> list[int]:
    """See `_check_launches` (a malformed record found here is a BpkFormatError too). Returns the bytes
    each slot holds, for the kernel library's operand checks."""
    try:
        return _check_launches(m, kind, key, regs, out_shapes)
    except (AttributeError, TypeError, KeyError, ValueError, IndexError) as e:
        raise _fail(m, f"a native {kind} plan record is malformed ({type(e).__name__}: {describe(e)})") from None


def _check_launches(
    m: Manifest, kind: str, key: Key, regs: Sequence[int], out_shapes: Sequence[Sequence[int]]
) -> list[int]:
    """Per-signature checks of the plan resolved at `regs`, for a call with input shapes `key` whose
    outputs have `out_shapes`."""
    plan = m.native[kind]
    assert plan is not None
    arena = resolve(plan["arena_bytes"], regs)
    if arena < 0:
        raise _fail(m, f"the arena size resolves to {arena}")
    # the bytes each slot holds: the arena, the inputs, the outputs the plan writes, the weights
    slots = [arena]
    slots += [element_count(s) * BYTE_SIZES[t.dtype] for s, t in zip(key, m.signature.inputs)]
    slots += [
        element_count(s) * BYTE_SIZES[m.values[o]["dtype"]] if slot != -1 and o in m.values else 0
        for s, o, slot in zip(out_shapes, m.outputs, plan["outputs"])
    ]
    slots += [element_count(w["shape"]) * BYTE_SIZES[w["dtype"]] for w in m.weight_rows]
    for b in plan["buffers"]:
        off = resolve(b["offset"], regs)
        n = element_count([resolve(d, regs) for d in b["shape"]]) * BYTE_SIZES[b["dtype"]]
        if off < 0 or n < 0 or off + n > arena:
            raise _fail(m, f"arena buffer %{b['id']} ({n} bytes at {off}) does not fit in the {arena}-byte arena")
    for i, lr in enumerate(plan["launches"]):
        for c in lr.get("when", ()):
            if "ptr" in c:
                slot, at = c["ptr"][0], resolve(c["ptr"][1], regs)
                if not 0 <= at < slots[slot]:
                    raise _fail(m, f"launch {i}'s condition reads byte {at} of slot {slot}, which holds {slots[slot]}")
        if lr["op"] == "ref":
            continue
        room = []
        for slot, off in lr["ptrs"]:
            at = resolve(off, regs)
            if not 0 <= at <= slots[slot]:
                raise _fail(m, f"launch {i} points {at} bytes into slot {slot}, which holds {slots[slot]}")
            room.append(slots[slot] - at)
        if lr["op"] in GEMM_OPS:
            ints = [resolve(v, regs) for v in lr["ints"]]
            check_gemm(m, i, ints, room, BYTE_SIZES[lr["dtype"]], len(lr["ptrs"]) == 4)
    return slots


def operand_programs(m: Manifest) -> dict[int, ShapeProgram]:
    """Per CUDA kernel launch (by index), its kernel's operand check program, checked at load against
    the launch's integer and pointer counts (Note [Kernel operand checks]; rows from before it have
    none)."""
    plan = m.native["cuda"]
    assert plan is not None
    out: dict[int, ShapeProgram] = {}
    for i, lr in enumerate(plan["launches"]):
        if lr["op"] != "kernel" or "check" not in m.kernels["cuda"][lr["k"]]:
            continue
        row = m.kernels["cuda"][lr["k"]]
        try:
            prog = ShapeProgram.from_manifest(row["check"])
            prog.validate([len(lr["ints"]), len(lr["ptrs"])])
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise _fail(
                m, f"launch {i} (kernel {row.get('name')}): its operand check is malformed ({describe(e)})"
            ) from None
        out[i] = prog
    return out


def check_operand_programs(
    m: Manifest, programs: dict[int, ShapeProgram], regs: Sequence[int], slots: Sequence[int]
) -> None:
    """Note [Kernel operand checks] for CUDA kernels, per input-shape signature: each launch's integers
    and the room behind each of its pointers through its kernel's check program."""
    plan = m.native["cuda"]
    assert plan is not None
    for i, prog in programs.items():
        lr = plan["launches"][i]
        ints = [resolve(v, regs) for v in lr["ints"]]
        room = [slots[slot] - resolve(off, regs) for slot, off in lr["ptrs"]]
        try:
            prog.evaluate([ints, room])
        except ShapeGuardError as e:
            name = m.kernels["cuda"][lr["k"]]["name"]
            text = str(e) if "overflowed" not in str(e) else "its integers overflow int64"
            raise _fail(m, f"launch {i} (kernel {name}): {text}") from None


def operand_error(
    m: Manifest, kind: str, status: Sequence[int], regs: Sequence[int], slots: Sequence[int]
) -> BpkFormatError:
    """The error for a failed kernel operand check (Note [Kernel operand checks] in
    bladepack/codegen/operand_check.py): `status` is [launch, code, value, extra]. The texts are
    docs/format.md's, shared with the C++ runtime."""
    i, code, value, extra = (int(x) for x in status[:4])
    plan = m.native[kind]
    assert plan is not None
    lr = plan["launches"][i] if 0 <= i < len(plan["launches"]) else {}
    if lr.get("op") == "kernel" and 0 <= lr.get("k", -1) < len(m.kernels[kind]):
        where = f"launch {i} (kernel {m.kernels[kind][lr['k']]['name']})"
    else:
        where = f"launch {i}"
    ptrs, ints = lr.get("ptrs", []), lr.get("ints", [])
    if code == 1 and value >= 0:
        what = f"passes {len(ptrs)} pointers and {len(ints)} integers; its function takes {value} and {extra}"
    elif code == 2 and 0 <= value < len(ints):
        what = f"passes {resolve(ints[value], regs)} as integer {value}; its shape symbols make it {extra}"
    elif code == 3:
        what = f"integer {value} is a negative size or overflows int64"
    elif code == 4 and 0 <= value < len(ptrs):
        slot, off = ptrs[value]
        room = slots[slot] - resolve(off, regs)
        what = f"pointer {value} reaches {extra} bytes; its tensor holds {room} from there"
    elif code == 6:
        what = f"pointer {value}'s buffer has a negative dim or overflows int64"
    elif code == 7:
        what = f"writes through pointer {value} into slot {extra}, an input or a weight"
    else:
        what = f"its record is malformed (check code {code})"
    return _fail(m, f"{where}: {what}")


def check_gemm(m: Manifest, i: int, v: Sequence[int], room: Sequence[int], item: int, has_c: bool) -> None:
    """Note [GEMM records]."""
    for name, n, r in zip("ABDC", gemm_reach(m, i, v, item, has_c), room):
        if n > r:
            raise _fail(m, f"{_gemm_where(i, v)}: operand {name} reaches {n} bytes; its tensor holds {r} from there")


def _gemm_where(i: int, v: Sequence[int]) -> str:
    mm, nn, kk, _, _, lda, ldb, ldc = v[12:20]
    return f"launch {i} (GEMM M={mm} N={nn} K={kk} lda={lda} ldb={ldb} ldc={ldc} batch={list(v[0:3])})"


def gemm_reach(m: Manifest, i: int, v: Sequence[int], item: int, has_c: bool) -> tuple[int, ...]:
    """Note [GEMM records] on the integers alone: raises where they are inconsistent, else the bytes
    each operand reaches from its pointer, in pointer order (A, B, D, then the epilogue source C when
    the record has one)."""
    b, sa, sb, sc = v[0:3], v[3:6], v[6:9], v[9:12]
    mm, nn, kk, ta, tb, lda, ldb, ldc = v[12:20]
    if min(*b, *sa, *sb, *sc, mm, nn, kk) < 0 or ta not in (0, 1) or tb not in (0, 1):
        raise _fail(m, f"{_gemm_where(i, v)}: negative count or stride, or a transpose flag other than 0 / 1")
    if max(mm, nn, kk, lda, ldb, ldc) > INT32_MAX:
        raise _fail(m, f"{_gemm_where(i, v)}: a dim or leading dim above {INT32_MAX}")
    a_rows, a_cols = (kk, mm) if ta else (mm, kk)
    b_rows, b_cols = (nn, kk) if tb else (kk, nn)
    if lda < max(1, a_cols) or ldb < max(1, b_cols) or ldc < max(1, nn):
        raise _fail(m, f"{_gemm_where(i, v)}: a leading dim is shorter than its row")
    if mm and nn and any(n > 1 and s < 1 for n, s in zip(b, sc)):
        raise _fail(m, f"{_gemm_where(i, v)}: the batches of D overlap (D's batch strides are {list(sc)})")
    if 0 in (*b, mm, nn):
        return ()  # nothing is read or written
    b0, b1, b2 = b[0] - 1, b[1] - 1, b[2] - 1
    # in pointer order: A, B, D, then the epilogue source C (its strides and leading dim follow the 20);
    # each the bytes up to the last element it reaches: batch offsets, then the last row's start and length
    a = (b0 * sa[0] + b1 * sa[1] + b2 * sa[2] + (a_rows - 1) * lda + a_cols) * item if kk else 0
    bb = (b0 * sb[0] + b1 * sb[1] + b2 * sb[2] + (b_rows - 1) * ldb + b_cols) * item if kk else 0
    d = (b0 * sc[0] + b1 * sc[1] + b2 * sc[2] + (mm - 1) * ldc + nn) * item
    if not (has_c and len(v) >= GEMM_INTS + 4):
        return (a, bb, d)
    c_strides, ld_c = v[20:23], v[23]
    if min(*c_strides, ld_c) < 0:
        raise _fail(m, f"{_gemm_where(i, v)}: negative epilogue source stride")
    rows = mm if ld_c else 1
    c = (b0 * c_strides[0] + b1 * c_strides[1] + b2 * c_strides[2] + (rows - 1) * max(ld_c, 1) + nn) * item
    return (a, bb, d, c)
