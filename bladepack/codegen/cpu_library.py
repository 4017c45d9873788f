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

`bpk_check` runs no kernel: it validates a launch list's operands against the bytes each slot holds
and which of them a launch may write (Note [Kernel operand checks] in operand_check.py) and returns 0 or the failing check's code with
status = (launch index, code, value, extra). `bpk_run` returns 0, or 1 with status = (launch index, error code, value) when a kernel reported an
error (an index out of range; status[3] is the dimension size), or 2 when a launch has more pointer arguments than the executor holds.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from bladepack.codegen import c_render
from bladepack.codegen.kernel import EmittedKernel

MAX_PTRS = 256

_FOOTER = """
namespace {
struct Ctx {
  bpk::Pool pool;
  bpk::Blas blas;
  explicit Ctx(int n) : pool(n) {}
};
const bpk::KernelFn kTable[] = {%(table)s};
// per function: its operand check (Note [Kernel operand checks]), its pointer and integer counts and
// how many of its pointers (the first ones) it writes through
const bpk::CheckFn kChecks[] = {%(checks)s};
const int64_t kOperands[][3] = {%(operands)s};
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

namespace __gnu_cxx {
void __freeres() noexcept;  // libstdc++'s: frees its exception-handling emergency pool
}

extern "C" {
__attribute__((visibility("default"))) int bpk_abi_version() { return BPK_ABI_VERSION; }
// Note [Unloading kernel libraries] (cpp_runtime/src/native_cpu.cpp): what this library's static
// libstdc++ allocated when it loaded, freed; a loader calls it just before its last dlclose.
__attribute__((visibility("default"))) void bpk_library_release() { __gnu_cxx::__freeres(); }
__attribute__((visibility("default"))) int64_t bpk_num_functions() { return %(nfn)d; }
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
__attribute__((visibility("default"))) int64_t bpk_check(const int64_t* w, int64_t nwords, const int64_t* slot_bytes,
                                                         const uint8_t* writable, int64_t nslots, int64_t* status) {
  int64_t room[%(maxp)d];
  int64_t pos = 0, launch = 0;
  while (pos < nwords) {
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
      if (a < 0 || a >= %(nfn)d) return bpk::chk::fail(status, 1, -1, -1);
      if (np != kOperands[a][0] || ni != kOperands[a][1]) return bpk::chk::fail(status, 1, kOperands[a][0], kOperands[a][1]);
      for (int64_t k = 0; k < kOperands[a][2]; ++k)
        if (!writable[pw[2 * k]]) return bpk::chk::fail(status, 7, k, pw[2 * k]);
      if (const int64_t rc = kChecks[a](pw + 2 * np, room, status)) return rc;
    } else if (op == BPK_OP_GEMM) {  // GEMM records: the loaders' Note [GEMM records]; D is written
      if (np != 3 || a < 0 || a > 3) return bpk::chk::fail(status, 1, -1, -1);
      if (!writable[pw[4]]) return bpk::chk::fail(status, 7, 2, pw[4]);
    } else {
      return bpk::chk::fail(status, 1, -1, -1);
    }
    pos += 4 + 2 * np + ni;
    ++launch;
  }
  return 0;
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
    const auto t0 = times_ns ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
    if (op == BPK_OP_KERNEL) {
      kTable[a](&st, ptrs, ints);
    } else if (op == BPK_OP_GEMM) {
      if (a == 0)
        bpk::gemm_batched<float>(&st, ctx->blas, (const float*)ptrs[0], (const float*)ptrs[1], (float*)ptrs[2], ints);
      else if (a == 1)
        bpk::gemm_batched<double>(&st, ctx->blas, (const double*)ptrs[0], (const double*)ptrs[1], (double*)ptrs[2],
                                  ints);
      else if (a == 2)
        bpk::gemm_batched_half<bpk::f16>(&st, ctx->blas, (const bpk::f16*)ptrs[0], (const bpk::f16*)ptrs[1],
                                         (bpk::f16*)ptrs[2], ints);
      else
        bpk::gemm_batched_half<bpk::bf16>(&st, ctx->blas, (const bpk::bf16*)ptrs[0], (const bpk::bf16*)ptrs[1],
                                          (bpk::bf16*)ptrs[2], ints);
    }
    if (times_ns)
      times_ns[launch] =
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
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
        defined = list(dict.fromkeys(re.findall(rf"^static [^(]*?\b({re.escape(k.name)}(?:_\w+)?)\(", code, re.M)))
        if not {name for name, _ in k.variants} | ({k.check} if k.check else set()) <= set(defined):
            out.append(k.source)  # a form this does not recognize: compiled again rather than guessed at
            continue
        aliases = [f"static constexpr auto* {n} = &{first}{n[len(k.name) :]};" for n in defined]
        out.append("\n".join([head.rstrip() + f" (the code of {first})", *aliases]) + "\n")
    return out


def library_source(kernels: Sequence[EmittedKernel]) -> str:
    names = [name for k in kernels for name, _ in k.variants]
    checks = [k.check for k in kernels for _ in k.variants]
    operands = [
        f"{{{len(k.stores) + len(k.loads)}, {len(k.args.exprs)}, {len(k.stores)}}}" for k in kernels for _ in k.variants
    ]
    body = "\n".join(shared_sources(kernels))
    return (
        prelude()
        + "\n"
        + body
        + _FOOTER
        % {
            "table": ", ".join(names) or "nullptr",
            "checks": ", ".join(checks) or "nullptr",
            "operands": ", ".join(operands) or "{0, 0, 0}",
            "nfn": len(names),
            "maxp": MAX_PTRS,
        }
    )
