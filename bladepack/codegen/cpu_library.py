"""Assemble a model's CPU kernel library: the runtime prelude, every kernel, the C entry points.

In: the emitted kernels of a model (in launch order). Out: one C++ translation unit whose exported C
API the loaders call (Note [Launch words] in cpu_runtime.h):

    int     bpk_abi_version(void)
    int64_t bpk_num_functions(void)
    void*   bpk_ctx_create(int nthreads)        void bpk_ctx_destroy(void*)
    void    bpk_library_release(void)           (before the last dlclose)
    void    bpk_ctx_set_blas(void*, void* sgemm, void* dgemm, int ilp64, void* set_threads_local)
    int64_t bpk_run(void* ctx, const int64_t* words, int64_t nwords, void* const* slots, int64_t* status,
                    int64_t* times_ns /* nullable: per-launch wall time */)

    int64_t bpk_check(const int64_t* words, int64_t nwords, const int64_t* slot_bytes,
                      const uint8_t* writable, int64_t nslots, int64_t* status)
    int64_t bpk_prepare(const int64_t* program, const int64_t* dims, int64_t* regs, int64_t* words,
                        int64_t* out_dims, int64_t* slot_bytes, int64_t* info)

`bpk_check` runs no kernel: it validates a launch list's operands against the bytes each slot holds
and which of them a launch may write (Note [Kernel operand checks] in operand_check.py) and returns 0 or the failing check's code with
status = (launch index, code, value, extra). `bpk_run` returns 0, or 1 with status = (launch index, error code, value) when a kernel reported an
error (an index out of range; status[3] is the dimension size), or 2 when a launch has more pointer arguments than the executor holds
or is a GEMM record of a dtype the library was not built for (Note [GEMM dtypes of a library]).
`bpk_prepare` resolves one input-shape signature of a preparation program the Python loader lays out
from the manifest (Note [Native preparation] in bladepack/loader/native_prepare.py): 0 with the launch
words, or the stage that left the signature to the Python path.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from bladepack.codegen import c_render
from bladepack.codegen.kernel import EmittedKernel

MAX_PTRS = 256

_TABLES = """
// per function: the kernel, its operand check (Note [Kernel operand checks]), its pointer and integer
// counts and how many of its pointers (the first ones) it writes through
extern const bpk::KernelFn bpk_kernels[] = {%(table)s};
extern const bpk::CheckFn bpk_checks[] = {%(checks)s};
extern const int64_t bpk_operands[][3] = {%(operands)s};
extern const int64_t bpk_nfn = %(nfn)d;
"""

_RUNTIME = """
extern const bpk::KernelFn bpk_kernels[];
extern const bpk::CheckFn bpk_checks[];
extern const int64_t bpk_operands[][3];
extern const int64_t bpk_nfn;

namespace {
struct Ctx {
  bpk::ThreadPool pool;
  bpk::Blas blas;
  explicit Ctx(int n) : pool(n) {}
};
}  // namespace

// Note [Library CPU features]: the instruction-set features this library was compiled to use, as
// /proc/cpuinfo names them, in data (reading it runs none of the library's code). Loaders check them
// against the CPU before calling into the library, whatever the manifest's `requires` says.
extern "C" __attribute__((visibility("default"))) const char* const bpk_cpu_features = ""
#ifdef __AVX2__
    " avx2"
#endif
#ifdef __FMA__
    " fma"
#endif
#ifdef __BMI2__
    " bmi2"
#endif
#ifdef __AVX512F__
    " avx512f"
#endif
#ifdef __AVX512BW__
    " avx512bw"
#endif
#ifdef __AVX512CD__
    " avx512cd"
#endif
#ifdef __AVX512DQ__
    " avx512dq"
#endif
#ifdef __AVX512VL__
    " avx512vl"
#endif
    ;

// @prepare

namespace __gnu_cxx {
void __freeres() noexcept;  // libstdc++'s: frees its exception-handling emergency pool
}

extern "C" {
__attribute__((visibility("default"))) int bpk_abi_version() { return BPK_ABI_VERSION; }
// Note [Unloading kernel libraries] (cpp_runtime/src/native_cpu.cpp): what this library's static
// libstdc++ allocated when it loaded, freed; a loader calls it just before its last dlclose.
__attribute__((visibility("default"))) void bpk_library_release() { __gnu_cxx::__freeres(); }
__attribute__((visibility("default"))) int64_t bpk_num_functions() { return bpk_nfn; }
__attribute__((visibility("default"))) void* bpk_ctx_create(int nthreads) {
  try {
    return new Ctx(nthreads);
  } catch (...) {
    return nullptr;
  }
}
__attribute__((visibility("default"))) void bpk_ctx_destroy(void* c) { delete static_cast<Ctx*>(c); }
__attribute__((visibility("default"))) void bpk_ctx_set_blas(void* c, void* sgemm, void* dgemm, int ilp64,
                                                               void* set_threads_local) {
  auto* ctx = static_cast<Ctx*>(c);
  ctx->blas.sgemm = sgemm;
  ctx->blas.dgemm = dgemm;
  ctx->blas.ilp64 = ilp64;
  ctx->blas.set_threads_local = reinterpret_cast<int (*)(int)>(set_threads_local);
}
// Note [Kernel operand checks]: 0 when every launch of `w` stays inside its slots' tensors
// (`slot_bytes`, one per slot), writes only slots marked `writable` and gives its kernel integers
// consistent with their shape symbols; else the failing check's code with status = [launch, code,
// value, extra]. Runs no kernel.
static int64_t check_words(const int64_t* w, int64_t nwords, const int64_t* slot_bytes, const uint8_t* writable,
                           int64_t nslots, int64_t* status) {
  int64_t room[%(maxp)d];
  int64_t pos = 0, launch = 0;
  // Where the pending WHEN records skip to: a record's start or the list's end, the same for every WHEN
  // record of a run (the runs the loaders emit: Note [Native preparation]); -1: none pending. No heap:
  // the library's allocator is not the host's (a sanitizer build's).
  int64_t target = -1;
  while (pos < nwords) {
    if (target >= 0 && pos > target) return bpk::chk::fail(status, 1, -1, -1);
    if (pos == target) target = -1;
    status[0] = launch;
    if (nwords - pos < 4) return bpk::chk::fail(status, 1, -1, -1);
    const int64_t op = w[pos], a = w[pos + 1], np = w[pos + 2], ni = w[pos + 3];
    if (np < 0 || ni < 0 || np > %(maxp)d || 2 * np + ni > nwords - pos - 4) return bpk::chk::fail(status, 1, -1, -1);
    const int64_t* pw = w + pos + 4;
    for (int64_t k = 0; k < np; ++k) {
      const int64_t slot = pw[2 * k], off = pw[2 * k + 1];
      if (slot < 0 || slot >= nslots || off < 0 || off > slot_bytes[slot]) return bpk::chk::fail(status, 5, k);
      room[k] = slot_bytes[slot] - off;
    }
    if (op == BPK_OP_KERNEL) {
      if (a < 0 || a >= bpk_nfn) return bpk::chk::fail(status, 1, -1, -1);
      if (np != bpk_operands[a][0] || ni != bpk_operands[a][1]) return bpk::chk::fail(status, 1, bpk_operands[a][0], bpk_operands[a][1]);
      for (int64_t k = 0; k < bpk_operands[a][2]; ++k)
        if (!writable[pw[2 * k]]) return bpk::chk::fail(status, 7, k, pw[2 * k]);
      if (const int64_t rc = bpk_checks[a](pw + 2 * np, room, status)) return rc;
    } else if (op == BPK_OP_GEMM) {  // GEMM records: the loaders' Note [GEMM records]; D is written
      if (np != 3 || a < 0 || a > 3 || !((%(gemms)d >> a) & 1)) return bpk::chk::fail(status, 1, -1, -1);
      if (!writable[pw[4]]) return bpk::chk::fail(status, 7, 2, pw[4]);
    } else if (op == BPK_OP_WHEN) {  // one byte read; the skip lands on a record of this list or its end
      const int64_t end = pos + 7;
      if (np != 1 || ni != 1 || (a != 0 && a != 1) || room[0] < 1 || pw[2] < 0 || pw[2] > nwords - end ||
          (target >= 0 && end + pw[2] != target))
        return bpk::chk::fail(status, 1, -1, -1);
      target = end + pw[2];
      pos = end;
      continue;
    } else {
      return bpk::chk::fail(status, 1, -1, -1);
    }
    pos += 4 + 2 * np + ni;
    ++launch;
  }
  if (target >= 0 && target != nwords) return bpk::chk::fail(status, 1, -1, -1);
  return 0;
}
__attribute__((visibility("default"))) int64_t bpk_check(const int64_t* w, int64_t nwords, const int64_t* slot_bytes,
                                                         const uint8_t* writable, int64_t nslots, int64_t* status) {
  return check_words(w, nwords, slot_bytes, writable, nslots, status);
}
// Note [Native preparation] (bladepack/loader/native_prepare.py): one input-shape signature of the
// preparation program `p` resolved at the flattened input dims; 0 with the launch words, the output
// dims, the slot bytes and info = [word count, arena bytes], else the stage that refused it.
__attribute__((visibility("default"))) int64_t bpk_prepare(const int64_t* p, const int64_t* dims, int64_t* regs,
                                                           int64_t* words, int64_t* out_dims, int64_t* slot_bytes,
                                                           int64_t* info) {
  return bpk::prep::prepare(p, dims, regs, words, out_dims, slot_bytes, info, check_words);
}
__attribute__((visibility("default"))) int64_t bpk_run(void* c, const int64_t* w, int64_t nwords, void* const* slots,
                                                       int64_t* status, int64_t* times_ns) {
  auto* ctx = static_cast<Ctx*>(c);
  bpk::RunState st;
  st.pool = &ctx->pool;
  // BLAS single-threaded on every thread that calls it during this run (restored on the caller's)
  struct BlasThreads {
    int (*set)(int);
    int old;
    explicit BlasThreads(int (*s)(int)) : set(s), old(s ? s(1) : 0) {}
    ~BlasThreads() {
      if (set) set(old);
    }
  } blas_threads(ctx->blas.set_threads_local);

  void* ptrs[%(maxp)d];
  int64_t pos = 0, launch = 0;
  while (pos < nwords) {
    const int64_t op = w[pos], a = w[pos + 1], np = w[pos + 2], ni = w[pos + 3];
    const int64_t* pw = w + pos + 4;
    if (np > %(maxp)d) {
      status[0] = launch;
      return 2;
    }
    for (int64_t k = 0; k < np; ++k) ptrs[k] = static_cast<char*>(slots[pw[2 * k]]) + pw[2 * k + 1];
    const int64_t* ints = pw + 2 * np;
    if (op == BPK_OP_WHEN) {  // a run-time branch: the launches it guards are skipped unless it holds
      pos += 4 + 2 * np + ni;
      if ((*static_cast<const uint8_t*>(ptrs[0]) != 0) != (a != 0)) pos += ints[0];
      continue;
    }
    const int64_t t0 = times_ns ? bpk::now_ns() : 0;
    if (op == BPK_OP_KERNEL) {
      bpk_kernels[a](&st, ptrs, ints);
    } else if (op == BPK_OP_GEMM) {
%(gemm_calls)s    }
    if (times_ns) times_ns[launch] = bpk::now_ns() - t0;
    if (st.err_code.load() != 0) {
      status[0] = launch;
      status[1] = st.err_code.load();
      status[2] = st.err_value.load();
      status[3] = st.err_extra.load();
      return 1;
    }
    pos += 4 + 2 * np + ni;
    ++launch;
  }
  return 0;
}
}
"""


def prelude() -> str:
    return c_render.prelude("cpu_runtime.h")


def _own_names(name: str) -> re.Pattern[str]:
    """A kernel's C names: `k3`, `k3_t6`, `k3_check` (not `k30`)."""
    return re.compile(rf"\b{re.escape(name)}(?:_\w+)?\b")


def shared_sources(kernels: Sequence[EmittedKernel]) -> list[str]:
    """Each kernel's source, or, for a kernel whose code is an earlier one's but for its name (the
    same layer repeated: a 12-layer encoder's 12 query projections), aliases of that one's functions.

    Note [Shared kernel code]: a kernel's code depends on its ops, dtypes, shapes and strides, never on
    which weights or buffers it reads (those come in its launch's pointer words), so a model that
    repeats a block emits the same function once per repetition. The compiler would compile each
    copy; the library instead defines it once and names it again per kernel (`kTable` keeps one entry
    per kernel and variant, so the launch words and the plan are unchanged). The first line (the
    kernel's comment, naming its source line) is not compared."""
    seen: dict[str, str] = {}  # code with the name replaced -> the kernel that defined it
    out = []
    for k in kernels:
        own = _own_names(k.name)
        head, _, code = k.source.partition("\n")
        key = own.sub(lambda m: "@" + m.group(0)[len(k.name) :], code)
        first = seen.setdefault(key, k.name)
        if first == k.name:
            out.append(k.source)
            continue
        defined = _defined(k.name, code)
        if not {name for name, _ in k.variants} | ({k.check} if k.check else set()) <= set(defined):
            out.append(k.source)  # a form this does not recognize: compiled again rather than guessed at
            continue
        aliases = [f"static constexpr auto* {n} = &{first}{n[len(k.name) :]};" for n in defined]
        out.append("\n".join([head.rstrip() + f" (the code of {first})", *aliases]) + "\n")
    return out


def _defined(name: str, code: str) -> list[str]:
    """The functions of kernel `name` that `code` defines, in order."""
    return list(dict.fromkeys(re.findall(rf"^BPK_KERNEL [^(]*?\b({re.escape(name)}(?:_\w+)?)\(", code, re.M)))


UNIT_MARK = "// @unit "  # a kernel's code follows: "// @unit <kernel name>"
MAIN_MARK = "// @main"  # the kernel tables follow
RUNTIME_MARK = "// @runtime"  # the executor and the C entry points follow


@dataclass(frozen=True)
class LibraryUnits:
    """A library's source cut into translation units (Note [Split kernel libraries] in toolchain.py):
    `header`, the prelude every unit includes (precompiled once per ISA level); `kernels`, one unit
    body per distinct kernel code, its functions named by that code's digest (`kernel_<digest>_t6`), so
    a model that repeats another's kernel finds its object in the cache; `main`, the declarations of
    those functions, each kernel's names for them and the tables; `runtime`, the executor and the C
    entry points (the same text for every model with the same GEMM dtypes)."""

    header: str
    kernels: tuple[str, ...]
    main: str
    runtime: str


def split_units(source: str) -> LibraryUnits | None:
    """`library_source`'s text cut into units; None for a text without its markers (one unit)."""
    at = source.find("\n" + MAIN_MARK + "\n")
    rt = source.find("\n" + RUNTIME_MARK + "\n", at + 1)
    if at < 0 or rt < 0:
        return None
    first = source.find("\n" + UNIT_MARK)
    head_end = at if first < 0 else min(first, at)
    header, body, tables = source[: head_end + 1], source[head_end + 1 : at + 1], source[at + 1 : rt + 1]
    units: dict[str, str] = {}
    decls: list[str] = []
    names: dict[str, str] = {}  # a kernel's function -> the digest-named one
    main: list[str] = []
    for chunk in body.split(UNIT_MARK)[1:]:
        name, _, rest = chunk.partition("\n")
        comment, _, code = rest.partition("\n")
        own = _own_names(name)
        defined = _defined(name, code)
        if not defined:  # aliases of an earlier kernel's functions (Note [Shared kernel code])
            main.append(comment)
            main += [
                re.sub(r"= &(\w+);", lambda m: f"= &{names.get(m.group(1), m.group(1))};", line)
                for line in code.splitlines()
            ]
            continue
        digest = hashlib.sha256(own.sub(lambda m: "@" + m.group(0)[len(name) :], code).encode()).hexdigest()[:20]
        base = f"kernel_{digest}"
        units.setdefault(base, own.sub(lambda m: base + m.group(0)[len(name) :], code))
        main.append(comment)
        for fn in defined:
            names[fn] = base + fn[len(name) :]
            line = re.search(rf"^BPK_KERNEL [^\n]*?\b{fn}\([^\n]*", code, re.M)
            assert line is not None
            decls.append(line.group(0).replace(fn, names[fn], 1).rstrip(" {") + ";")
            main.append(f"static constexpr auto* {fn} = &{names[fn]};")
    main_text = "\n".join([*dict.fromkeys(decls), *main, tables])
    return LibraryUnits(header, _bundled(list(units.values())), main_text, source[rt + 1 :])


OWN_UNIT_BYTES = 12_000  # a kernel's code at least this long is a unit of its own
BUNDLE_BYTES = 48_000  # smaller kernels share units up to about this much code


def _bundled(codes: list[str]) -> tuple[str, ...]:
    """Units from the distinct kernel codes: each long one alone (the dense layers, attention and
    convolutions, where reuse across models pays), the short ones (elementwise and row kernels, a few
    KB each) in launch order in bundles of about BUNDLE_BYTES, since every compiler process costs about
    0.3 s before its first kernel (Note [Split kernel libraries])."""
    units: list[str] = []
    bundle: list[str] = []
    for code in codes:
        if len(code) >= OWN_UNIT_BYTES:
            units.append(code)
            continue
        bundle.append(code)
        if sum(map(len, bundle)) >= BUNDLE_BYTES:
            units.append("\n".join(bundle))
            bundle = []
    if bundle:
        units.append("\n".join(bundle))
    return tuple(units)


GEMM_DTYPES = ("float32", "float64", "float16", "bfloat16")  # a GEMM record's `a` word indexes this
_GEMM_CALLS = {
    "float32": "bpk::gemm_batched<float>(&st, ctx->blas, (const float*)ptrs[0], (const float*)ptrs[1], (float*)ptrs[2], ints)",
    "float64": "bpk::gemm_batched<double>(&st, ctx->blas, (const double*)ptrs[0], (const double*)ptrs[1], (double*)ptrs[2], "
    "ints)",
    "float16": "bpk::gemm_batched_half<bpk::f16>(&st, ctx->blas, (const bpk::f16*)ptrs[0], (const bpk::f16*)ptrs[1], "
    "(bpk::f16*)ptrs[2], ints)",
    "bfloat16": "bpk::gemm_batched_half<bpk::bf16>(&st, ctx->blas, (const bpk::bf16*)ptrs[0], "
    "(const bpk::bf16*)ptrs[1], (bpk::bf16*)ptrs[2], ints)",
}


def _spliced(name: str) -> str:
    """A runtime file of this directory without its leading "//!" description lines."""
    return "".join(ln for ln in (Path(__file__).parent / name).read_text().splitlines(True) if not ln.startswith("//!"))


def library_source(kernels: Sequence[EmittedKernel], gemm_dtypes: Collection[str] = GEMM_DTYPES) -> str:
    """The library's one translation unit, cut by markers into the units `split_units` reads: the
    prelude, each kernel (`// @unit`), the tables (`// @main`) and the runtime (`// @runtime`: the
    executor and the C entry points, the same for every model with the same GEMM dtypes).

    Note [GEMM dtypes of a library]: the executor's GEMM records are compiled only for `gemm_dtypes`,
    the dtypes of the plan's GEMM launches (each dtype's small- and mid-M GEMM templates are about 3 s
    of -O3 per ISA level); `bpk_check` refuses a record of another dtype and `bpk_run` returns 2 for
    one."""
    unknown = set(gemm_dtypes) - set(GEMM_DTYPES)
    assert not unknown, unknown
    calls = "".join(
        f"      {'if' if k == 0 else 'else if'} (a == {GEMM_DTYPES.index(dt)})\n        {_GEMM_CALLS[dt]};\n"
        for k, dt in enumerate(dt for dt in GEMM_DTYPES if dt in gemm_dtypes)
    )
    calls += ("      else {\n" if calls else "      {\n") + "        status[0] = launch;\n        return 2;\n      }\n"
    names = [name for k in kernels for name, _ in k.variants]
    checks = [k.check for k in kernels for _ in k.variants]
    operands = [
        f"{{{len(k.stores) + len(k.loads)}, {len(k.args.exprs)}, {len(k.stores)}}}" for k in kernels for _ in k.variants
    ]
    body = "".join(f"{UNIT_MARK}{k.name}\n{code}\n" for k, code in zip(kernels, shared_sources(kernels), strict=True))
    tables = _TABLES % {
        "table": ", ".join(names) or "nullptr",
        "checks": ", ".join(checks) or "nullptr",
        "operands": ", ".join(operands) or "{0, 0, 0}",
        "nfn": len(names),
    }
    pool_run = _spliced("cpu_pool_run.h")
    runtime = pool_run + (
        _RUNTIME
        % {
            "maxp": MAX_PTRS,
            "gemms": sum(1 << GEMM_DTYPES.index(dt) for dt in gemm_dtypes),
            "gemm_calls": calls,
        }
    ).replace("// @prepare\n", _spliced("cpu_prepare.h"))
    return "".join([prelude(), "\n", body, "\n", MAIN_MARK, "\n", tables, RUNTIME_MARK, "\n", runtime])
