"""A native CUDA plan's per-signature preparation, compiled once into straight-line Python.

In: the `Manifest` (its plan passed `check_plan`), the kernel parameter template (`KernelParams`), the
kernels' operand check programs and the CUTLASS kernels (or None). Out: `CudaPreparation`, called per
new input-shape signature with the input shapes, the shape program's registers and the output shapes;
it returns the bytes each slot holds and the signature's `CudaPrepared`, or raises the error of Note
[Plan checks] / Note [Kernel operand checks] that the signature breaks.

Note [Compiled CUDA preparation]: a decode loop meets a new signature on every call (the cache is one
token longer), and the CUDA executor's preparation of one — the launch checks, each kernel's operand
check, then per launch its shape conditions, variant, grid, shared memory, GEMM arguments, data
conditions and arena buffers, each resolved word by word through the plan's records — cost ~230 µs of
Python for the 16 launches of the LLaMA sample's step on the fake driver, more than the launches
themselves, and it grows with the plan (a real decoder has hundreds of launches). The plan never
changes after load, so it is compiled, at the first signature, into one function whose every
statement is one of those steps with the plan's constants in place: a register word is `R[k]`, a
literal an integer, a check one comparison, a variant choice an `if` chain. Each check is written in
the order `check_launches` makes it (arena, buffers, then per launch its conditions' bytes, pointers
and GEMM record) and then the operand checks (each kernel's check program inlined, what its literal
integers decide computed when the source is made: Note [Folded checks]), as the executor ran them; a
GEMM record's arguments and the bytes its operands reach are kept per launch by the record's integers,
which a decode loop's projections keep from call to call. Where a check fails the
function returns None and the executor runs `check_launches` and the operand checks themselves,
which raise the first failure in their own words — so the error a caller sees is unchanged. (The
compiled checks decline more than they need to, on any negative dim or a slot beyond int64; those
signatures take the interpreted checks, then the unchecked form of the same function.) The source holds
only integer literals, register reads and names of this module's helpers (dtypes, kernel names and
launch ops are read from tables by index), so nothing of a manifest's text reaches the compiler, as in
Note [Compiled shape programs]. The kernel parameter words come from the template as before (Note
[Launch word template]). The function is compiled at the first signature (~55 ms for a 12-layer
encoder's 159 launches) and then prepares one in ~0.4 ms, where the interpreted form took ~1.5 ms; a
check it already made for another launch (the same register offset into the same slot) is not made
again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from bladepack.artifact.shape_program import Locals, ShapeProgram, program_lines
from bladepack.errors import BpkFormatError
from bladepack.loader.cublaslt import CublasLt
from bladepack.loader.cutlass_gemm import CutlassGemms
from bladepack.loader.gemm_args import GemmArgs, gemm_args
from bladepack.loader.launch_words import KernelParams
from bladepack.loader.manifest import Key, Manifest
from bladepack.loader.native_cuda import (
    CublasLtCall,
    CudaPrepared,
    GemmLaunch,
    KernelLaunch,
    RefLaunch,
    graph_obstacle,
)
from bladepack.loader.plan_check import (
    BYTE_SIZES,
    GEMM_OPS,
    INT64_MAX,
    check_launches,
    check_operand_programs,
    gemm_reach,
)

_GEMM_CACHE = 256  # GEMM records kept per launch (each a few hundred bytes)
Prepare = Callable[[Key, Sequence[int], Sequence[Sequence[int]]], Any]


def _nonnegative(v: Any) -> str:
    """A source prefix that declines when word `v` is negative: `R[k] < 0 or ` for a register, nothing
    for a non-negative literal, `True or ` for a negative one."""
    if isinstance(v, dict):
        return f"R[{int(v['r'])}] < 0 or "
    return "True or " if int(v) < 0 else ""


def _word(v: Any) -> str:
    """A launch word or plan size as source: `R[k]` for a register reference {"r": k}, else the integer."""
    if isinstance(v, dict):
        return f"R[{int(v['r'])}]"
    return f"({int(v)})"


class CudaPreparation:
    def __init__(
        self,
        m: Manifest,
        params: KernelParams,
        programs: dict[int, ShapeProgram],
        cutlass: CutlassGemms | None,
        cublaslt: CublasLt | None = None,
    ) -> None:
        """`programs`: per kernel launch its operand check program (`operand_programs`); `cutlass` /
        `cublaslt`: the executor's, for their launch records."""
        plan = m.native["cuda"]
        assert plan is not None
        self.m, self.plan, self.params, self.programs, self.cutlass = m, plan, params, programs, cutlass
        self.cublaslt = cublaslt
        self._checked: Prepare | None = None
        self._unchecked: Prepare | None = None

    def __call__(self, key: Key, regs: Sequence[int], outs: Sequence[Sequence[int]]) -> tuple[list[int], CudaPrepared]:
        if self._checked is None:
            self._checked = self._compile(checked=True)
        got = self._checked(key, regs, outs)
        if got is not None:
            return got  # type: ignore[no-any-return]
        slots = check_launches(self.m, "cuda", key, regs, outs)  # raises where a check fails
        if max(slots, default=0) <= INT64_MAX:  # else the call's memory check refuses it first
            check_operand_programs(self.m, self.programs, regs, slots)
        if self._unchecked is None:
            self._unchecked = self._compile(checked=False)
        return slots, self._unchecked(key, regs, outs)[1]

    # -- the source
    def _compile(self, checked: bool) -> Prepare:
        m, plan = self.m, self.plan
        launches = plan["launches"]
        kernels = m.kernels["cuda"]
        body: list[str] = [f"a = {_word(plan['arena_bytes'])}"]
        put = body.append
        if checked:
            put("if a < 0: return None")
            slots: list[str] = ["a"]
            slots += [f"_prod(K[{j}]) * {BYTE_SIZES[t.dtype]}" for j, t in enumerate(m.signature.inputs)]
            for j, (o, slot) in enumerate(zip(m.outputs, plan["outputs"])):
                written = slot != -1 and o in m.values
                slots.append(f"_prod(O[{j}]) * {BYTE_SIZES[m.values[o]['dtype']]}" if written else "0")
            slots += [str(math.prod(int(d) for d in w["shape"]) * BYTE_SIZES[w["dtype"]]) for w in m.weight_rows]
            put(f"S = [{', '.join(slots)}]")
            put(f"if max(S) > {INT64_MAX} or min(S) < 0: return None")  # (an output's dims may be negative)
            made: set[str] = set()

            def check(line: str) -> None:  # a check already made (another launch, the same buffer) held
                if line not in made:
                    made.add(line)
                    put(line)

            for b in plan["buffers"]:
                dims = [_word(d) for d in b["shape"]]
                variable = [d for d, v in zip(dims, b["shape"]) if isinstance(v, dict)]
                if any(not isinstance(v, dict) and int(v) < 0 for v in b["shape"]):
                    put("return None")  # a negative literal dim: the interpreted check decides
                if variable:
                    check(f"if {' or '.join(f'{d} < 0' for d in variable)}: return None")
                size = " * ".join([*dims, str(BYTE_SIZES[b["dtype"]])])
                check(f"if {_nonnegative(b['offset'])}{_word(b['offset'])} + {size} > a: return None")
            for i, lr in enumerate(launches):
                for c in lr.get("when", ()):
                    if "ptr" in c:
                        at, slot = c["ptr"][1], int(c["ptr"][0])
                        check(f"if {_nonnegative(at)}{_word(at)} >= S[{slot}]: return None")
                if lr["op"] == "ref":
                    continue
                for slot, off in lr["ptrs"]:
                    if isinstance(off, dict) or int(off) != 0:  # (0 <= 0 <= S[slot]: no slot is negative)
                        check(f"if {_nonnegative(off)}{_word(off)} > S[{int(slot)}]: return None")
                if lr["op"] in GEMM_OPS:  # Note [GEMM records]: what each operand reaches
                    rooms = [f"S[{int(s)}] - {_word(o)}" for s, o in lr["ptrs"]]
                    reach = " or ".join(
                        f"r[{j}] > {room}" if j < 3 else f"(len(r) > 3 and r[3] > {room})"
                        for j, room in enumerate(rooms)
                    )
                    put(f"g{i} = {self._gemm(i, lr)}")  # (the launch below reads its arguments)
                    put(f"r = g{i}[0]")
                    put(f"if r and ({reach}): return None")
            names = Locals("q")  # shared: a check every layer's kernel makes is made once
            for i, prog in self.programs.items():  # Note [Kernel operand checks], inlined
                lr = launches[i]
                # a literal integer operand is known here: what depends on literals alone folds away
                operands: tuple[list[int | str], list[int | str]] = (
                    [_word(v) if isinstance(v, dict) else int(v) for v in lr["ints"]],
                    [f"(S[{int(s)}] - {_word(o)})" for s, o in lr["ptrs"]],
                )
                lines, _ = program_lines(
                    prog.code,
                    prog.num_registers,
                    lambda a, b: operands[a][b],
                    names,
                    lambda *_: "return None",
                    lambda _: "return None",
                    "return None",
                )
                body += lines
        else:
            put("S = None")
        put("L = []")
        put("W = []")
        put("D = []")
        put("w = 0")
        for k, lr in enumerate(launches):
            shape_when = [c for c in lr.get("when", ()) if "r" in c]
            pad = ""
            if shape_when:
                put("if " + " and ".join(f"{'' if c['is'] else 'not '}R[{int(c['r'])}]" for c in shape_when) + ":")
                pad = "    "
            data = [c["ptr"] + [c["is"]] for c in lr.get("when", ()) if "ptr" in c]
            put(pad + "D.append((" + "".join(f"({int(s)}, {_word(o)}, {bool(t)}), " for s, o, t in data) + "))")
            op = lr["op"]
            if op == "ref":
                put(pad + f"L.append(_REF[{k}])")
            elif op == "kernel":
                w0, w1, _, _ = self.params.ranges[k]
                for n, v in enumerate(kernels[lr["k"]]["variants"]):
                    launch = (
                        f"_KL({int(v['fn'])}, {_word(v['grid'])}, {int(v['block'])}, {_word(v['smem'])}, "
                        f"w, {w1 - w0}, {int(lr['k'])}, len(W))"
                    )
                    put(pad + f"{'if' if n == 0 else 'elif'} R[{int(v['pred'])}]: L.append({launch})")
                put(pad + f"else: _novariant({int(lr['k'])})")
                put(pad + f"W.append({k})")
                put(pad + f"w += {w1 - w0}")
            elif op in GEMM_OPS:
                ptr_words = "(" + "".join(f"({int(s)}, {_word(o)}), " for s, o in lr["ptrs"]) + ")"
                int_words = "(" + "".join(f"{_word(v)}, " for v in lr["ints"]) + ")"
                if op in ("gemm", "cublaslt"):  # the GemmArgs of the record at this signature
                    args = f"{f'g{k}' if checked else self._gemm(k, lr)}[1]"
                    launch = (
                        f"_GL(_LR[{k}]['dtype'], {ptr_words}, {args})"
                        if op == "gemm"
                        else f"_lt({k}, {ptr_words}, {args})"
                    )
                    put(pad + f"L.append({launch})")
                else:
                    put(pad + f"L.append(_cutlass({k}, R, {ptr_words}, {int_words}))")
            else:
                put(pad + f"_badop({k})")
        put("words = _params.at(R)")
        put(f"if len(W) != {len(self.params.ranges)}: words = _params.kept(words, W)")
        buffers = []
        for j, b in enumerate(plan["buffers"]):
            shape = "(" + "".join(f"{_word(d)}, " for d in b["shape"]) + ")"
            buffers.append(f"{int(b['id'])}: ({_word(b['offset'])}, {shape}, _BUF[{j}]['dtype'])")
        put("B = {" + ", ".join(buffers) + "}")
        put("return S, _prepared(L, words, a, B, D, W)")
        source = "def prepare(K, R, O):\n" + "".join(f"    {line}\n" for line in body)
        scope = self._scope()
        exec(compile(source, "<bladepack CUDA preparation>", "exec"), scope)
        return scope["prepare"]  # type: ignore[no-any-return]

    @staticmethod
    def _gemm(i: int, lr: dict[str, Any]) -> str:
        """Launch `i`'s GEMM record at this signature as source: (bytes each operand reaches, its
        `GemmArgs`), from a bounded cache keyed by the record's integers (a decode loop's projections
        keep theirs from call to call)."""
        ints = "(" + "".join(f"{_word(v)}, " for v in lr["ints"]) + ")"
        return f"(_GC[{i}].get({ints}) or _gemm_new({i}, {ints}))"

    def _scope(self) -> dict[str, Any]:
        m, plan = self.m, self.plan
        launches = plan["launches"]
        kernels = m.kernels["cuda"]

        gemms: dict[int, dict[tuple[int, ...], tuple[tuple[int, ...], GemmArgs]]] = {
            i: {} for i, lr in enumerate(launches) if lr["op"] in GEMM_OPS
        }

        def gemm_new(i: int, ints: tuple[int, ...]) -> tuple[tuple[int, ...], GemmArgs]:
            lr = launches[i]
            item = BYTE_SIZES[lr["dtype"]]
            got = (gemm_reach(m, i, ints, item, len(lr["ptrs"]) == 4), gemm_args(ints, item))
            cache = gemms[i]
            if len(cache) >= _GEMM_CACHE:
                cache.clear()
            cache[ints] = got
            return got

        def novariant(k: int) -> None:
            raise BpkFormatError(f"kernel {kernels[k]['name']}: no variant applies (corrupt plan)")

        def cutlass(k: int, regs: Sequence[int], ptrs: Any, ints: Any) -> Any:
            if self.cutlass is None:
                raise BpkFormatError("a CUTLASS GEMM launch in a plan without gemm_kernels (corrupt plan)")
            return self.cutlass.prepare(launches[k], regs, ptrs, ints)

        def cublaslt(k: int, ptrs: Any, args: GemmArgs) -> CublasLtCall:
            if self.cublaslt is None:
                raise BpkFormatError("a cuBLASLt GEMM launch in a plan the executor has no cuBLASLt for (corrupt plan)")
            return CublasLtCall(ptrs, self.cublaslt.prepare(launches[k], args))

        def badop(k: int) -> None:
            raise BpkFormatError(f"unknown launch op {launches[k]['op']!r} in the CUDA plan")

        def prepared(
            launched: list[Any], words: Any, arena: int, buffers: dict[int, Any], when: list[Any], kept: list[int]
        ) -> CudaPrepared:
            w, pos, slots, offs = words
            return CudaPrepared(
                tuple(launched),
                w,
                pos,
                slots,
                offs,
                arena,
                buffers,
                tuple(when) if any(when) else (),
                graph_obstacle(launched, when),
                self.params.records(kept),
            )

        return {
            "_prod": math.prod,
            "_GC": gemms,
            "_gemm_new": gemm_new,
            "_novariant": novariant,
            "_cutlass": cutlass,
            "_lt": cublaslt,
            "_badop": badop,
            "_prepared": prepared,
            "_params": self.params,
            "_KL": KernelLaunch,
            "_GL": GemmLaunch,
            "_REF": {k: RefLaunch(int(lr["node"])) for k, lr in enumerate(launches) if lr["op"] == "ref"},
            "_LR": launches,
            "_BUF": plan["buffers"],
            "min": min,
            "max": max,
        }


__all__ = ["CudaPreparation"]
