#include "manifest.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "artifact.h"
#include "dtype.h"
#include "errors.h"
#include "plan_ops.h"
#include "util.h"

namespace bpk {
namespace {

using Obj = msgpack::object;

[[noreturn]] void malformed(const std::string& where, const std::string& what) {
  fail(BPK_ERR_FORMAT, "malformed manifest: " + where + ": " + what);
}

// Note [Plan checks] (bladepack/loader/plan_check.py): the Python loader's words
[[noreturn]] void corrupt_plan(const std::string& what) { fail(BPK_ERR_FORMAT, "corrupt plan: " + what); }


std::string join(const std::string& where, const char* key) { return where.empty() ? key : where + "." + key; }
std::string at(const std::string& where, size_t i) { return where + "[" + std::to_string(i) + "]"; }

const Obj& field(const Obj& m, const char* key, const std::string& where) {
  if (m.type != msgpack::type::MAP) malformed(where.empty() ? "the manifest" : where, "expected a map");
  const Obj* v = map_find(m, key);
  if (v == nullptr) malformed(join(where, key), "missing");
  return *v;
}

bool is_nil(const Obj& o) { return o.type == msgpack::type::NIL; }

int64_t as_int(const Obj& o, const std::string& where) {
  if (o.type == msgpack::type::POSITIVE_INTEGER && o.via.u64 <= uint64_t(INT64_MAX)) return int64_t(o.via.u64);
  if (o.type == msgpack::type::NEGATIVE_INTEGER) return o.via.i64;
  if (o.type == msgpack::type::BOOLEAN) return o.via.boolean ? 1 : 0;
  malformed(where, "expected an integer");
}

std::string as_str(const Obj& o, const std::string& where) {
  if (o.type != msgpack::type::STR) malformed(where, "expected a string");
  return std::string(o.via.str.ptr, o.via.str.size);
}

const Obj* as_array(const Obj& o, const std::string& where) {
  if (o.type != msgpack::type::ARRAY) malformed(where, "expected a list");
  return o.via.array.ptr;
}
uint32_t len(const Obj& o) { return o.via.array.size; }

int64_t get_int(const Obj& m, const char* key, const std::string& where) {
  return as_int(field(m, key, where), join(where, key));
}
std::string get_str(const Obj& m, const char* key, const std::string& where) {
  return as_str(field(m, key, where), join(where, key));
}
std::string opt_str(const Obj& m, const char* key, const std::string& where) {
  const Obj* v = map_find(m, key);
  return v == nullptr || is_nil(*v) ? std::string() : as_str(*v, join(where, key));
}

int32_t get_dtype(const Obj& m, const char* key, const std::string& where) {
  const std::string name = get_str(m, key, where);
  const int32_t d = dtype_from_name(name);
  if (d < 0) malformed(join(where, key), "unknown dtype '" + name + "'");
  return d;
}

struct Ctx {
  int64_t num_registers = 0;
};

SymInt as_symint(const Obj& o, const std::string& where, const Ctx& c) {
  if (o.type == msgpack::type::MAP) {
    if (o.via.map.size != 1) malformed(where, "expected an int or {r: register}");
    const int64_t r = get_int(o, "r", where);
    if (r < 0 || r >= c.num_registers) malformed(where, "register " + std::to_string(r) + " out of range");
    return SymInt{0, r};
  }
  return SymInt{as_int(o, where), -1};
}

std::vector<SymInt> symints(const Obj& o, const std::string& where, const Ctx& c) {
  const Obj* p = as_array(o, where);
  std::vector<SymInt> out;
  for (uint32_t i = 0; i < len(o); ++i) out.push_back(as_symint(p[i], at(where, i), c));
  return out;
}

std::vector<TensorDecl> tensor_decls(const Obj& root, const char* key) {
  const Obj& list = field(root, key, "");
  const Obj* p = as_array(list, key);
  std::vector<TensorDecl> out;
  for (uint32_t i = 0; i < len(list); ++i) {
    const std::string w = at(key, i);
    TensorDecl t;
    t.name = get_str(p[i], "name", w);
    t.id = get_int(p[i], "id", w);
    t.dtype = get_dtype(p[i], "dtype", w);
    const Obj& shape = field(p[i], "shape", w);
    const Obj* dims = as_array(shape, join(w, "shape"));
    if (len(shape) > BPK_MAX_RANK)
      fail(BPK_ERR_UNSUPPORTED, std::string(key) + " '" + t.name + "' has rank " + std::to_string(len(shape)) +
                                    "; this runtime supports rank <= " + std::to_string(BPK_MAX_RANK));
    for (uint32_t k = 0; k < len(shape); ++k) {
      DimDecl d;
      if (dims[k].type == msgpack::type::STR) {
        d.text = as_str(dims[k], "");
      } else {
        d.is_static = true;
        d.size = as_int(dims[k], at(join(w, "shape"), k));
        if (d.size < 0) malformed(at(join(w, "shape"), k), "negative size");
        d.text = std::to_string(d.size);
      }
      t.shape.push_back(d);
    }
    out.push_back(std::move(t));
  }
  return out;
}

ShapeProgram parse_program_map(const Obj& sp, const std::string& where) {
  ShapeProgram prog;
  prog.num_registers = get_int(sp, "num_registers", where);
  if (prog.num_registers < 0 || prog.num_registers > (int64_t(1) << 20))
    malformed(where + ".num_registers", "out of range");
  const Obj& code = field(sp, "code", where);
  if (code.type != msgpack::type::BIN) malformed(where + ".code", "expected bytes");
  if (code.via.bin.size % 40) fail(BPK_ERR_FORMAT, "shape program code must be a multiple of 40 bytes");
  prog.code.resize(code.via.bin.size / 8);
  if (code.via.bin.size) std::memcpy(prog.code.data(), code.via.bin.ptr, code.via.bin.size);
  const Obj& msgs = field(sp, "messages", where);
  const Obj* p = as_array(msgs, where + ".messages");
  for (uint32_t i = 0; i < len(msgs); ++i) prog.messages.push_back(as_str(p[i], at(where + ".messages", i)));
  return prog;
}

void parse_program(const Obj& root, Manifest& m) {
  m.shape_program = parse_program_map(field(root, "shape_program", ""), "shape_program");
}

void parse_signature(const Obj& root, Manifest& m) {
  const Obj& fv = field(root, "format_version", "");
  const Obj* v = as_array(fv, "format_version");
  if (len(fv) != 2) malformed("format_version", "expected [major, minor]");
  m.format_major = as_int(v[0], "format_version[0]");
  m.format_minor = as_int(v[1], "format_version[1]");
  if (const Obj* prod = map_find(root, "producer"); prod && prod->type == msgpack::type::MAP)
    for (uint32_t i = 0; i < prod->via.map.size; ++i) {
      const auto& kv = prod->via.map.ptr[i];
      if (kv.key.type == msgpack::type::STR && kv.val.type == msgpack::type::STR)
        m.producer[as_str(kv.key, "")] = as_str(kv.val, "");
    }
  m.tuple_output = opt_str(root, "output_structure", "") == "tuple";
  const Obj& syms = field(root, "symbols", "");
  const Obj* s = as_array(syms, "symbols");
  for (uint32_t i = 0; i < len(syms); ++i) {
    SymbolDecl d;
    d.name = get_str(s[i], "name", at("symbols", i));
    d.min = get_int(s[i], "min", at("symbols", i));
    const Obj& mx = field(s[i], "max", at("symbols", i));
    if (!is_nil(mx)) d.max = as_int(mx, at("symbols", i) + ".max");
    m.symbols.push_back(d);
  }
  m.inputs = tensor_decls(root, "inputs");
  m.outputs = tensor_decls(root, "outputs");
  const Obj& ws = field(root, "weights", "");
  const Obj* w = as_array(ws, "weights");
  for (uint32_t i = 0; i < len(ws); ++i) {
    const std::string where = at("weights", i);
    WeightDecl d;
    d.name = get_str(w[i], "name", where);
    d.id = get_int(w[i], "id", where);
    d.dtype = get_dtype(w[i], "dtype", where);
    const Obj& shape = field(w[i], "shape", where);
    const Obj* p = as_array(shape, where + ".shape");
    for (uint32_t k = 0; k < len(shape); ++k) {
      d.shape.push_back(as_int(p[k], at(where + ".shape", k)));
      if (d.shape.back() < 0) malformed(at(where + ".shape", k), "negative size");
    }
    m.weights.push_back(std::move(d));
  }
}

// The kernel rows of one target ("cpu": rows without a target or with "cpu"; "cuda"), in manifest
// order: a plan's launches index them.
void parse_kernel_rows(const Obj& root, const std::string& target, const Ctx& c, std::vector<KernelDecl>& out) {
  const Obj* ks = map_find(root, "kernels");
  if (ks == nullptr) return;
  const Obj* k = as_array(*ks, "kernels");
  for (uint32_t i = 0; i < len(*ks); ++i) {
    const std::string where = at("kernels", i);
    std::string t = opt_str(k[i], "target", where);
    if ((t.empty() ? std::string("cpu") : t) != target) continue;
    const bool cuda = target == "cuda";
    KernelDecl d;
    d.name = get_str(k[i], "name", where);
    d.kind = opt_str(k[i], "kind", where);
    d.loc = opt_str(k[i], "loc", where);
    const Obj& vars = field(k[i], "variants", where);
    const Obj* p = as_array(vars, where + ".variants");
    for (uint32_t j = 0; j < len(vars); ++j) {
      const std::string vw = at(where + ".variants", j);
      KernelDecl::Variant var;
      var.fn = get_int(p[j], "fn", vw);
      var.pred = get_int(p[j], "pred", vw);
      if (var.pred < 0 || var.pred >= c.num_registers) malformed(vw + ".pred", "register out of range");
      if (cuda) {
        var.name = get_str(p[j], "name", vw);
        var.grid = as_symint(field(p[j], "grid", vw), vw + ".grid", c);
        var.smem = as_symint(field(p[j], "smem", vw), vw + ".smem", c);
        var.block = get_int(p[j], "block", vw);
        if (var.block < 1 || var.block > 1024) malformed(vw + ".block", "threads per block are 1 to 1024");
      }
      d.variants.push_back(var);
    }
    if (d.variants.empty()) corrupt_plan("kernel " + std::to_string(out.size()) + " has no variants");
    if (const Obj* errs = map_find(k[i], "errors")) {
      const Obj* e = as_array(*errs, where + ".errors");
      for (uint32_t j = 0; j < len(*errs); ++j) d.errors.push_back(as_str(e[j], at(where + ".errors", j)));
    }
    if (const Obj* chk = map_find(k[i], "check"); cuda && chk != nullptr && !is_nil(*chk))
      d.check = parse_program_map(*chk, where + ".check");
    out.push_back(std::move(d));
  }
}

void parse_plan(const Obj& root, Manifest& m, const Ctx& c) {
  const Obj& vals = field(root, "values", "");
  const Obj* v = as_array(vals, "values");
  for (uint32_t i = 0; i < len(vals); ++i) {
    ValueDecl d;
    d.dtype = get_dtype(v[i], "dtype", at("values", i));
    d.shape = symints(field(v[i], "shape", at("values", i)), at("values", i) + ".shape", c);
    m.values[get_int(v[i], "id", at("values", i))] = std::move(d);
  }
  const Obj& steps = field(field(root, "plan", ""), "steps", "plan");
  const Obj* s = as_array(steps, "plan.steps");
  for (uint32_t i = 0; i < len(steps); ++i) {
    const std::string where = at("plan.steps", i);
    StepDecl d;
    d.op = get_str(s[i], "op", where);
    d.out = get_int(s[i], "out", where);
    d.loc = opt_str(s[i], "loc", where);
    m.steps.push_back(std::move(d));
  }
  parse_kernel_rows(root, "cpu", c, m.kernels);
}

std::vector<CondDecl> parse_when(const Obj& o, const std::string& where, const Manifest& m, const Ctx& c) {
  std::vector<CondDecl> out;
  const Obj* w = map_find(o, "when");
  if (w == nullptr) return out;
  const Obj* p = as_array(*w, where + ".when");
  for (uint32_t i = 0; i < len(*w); ++i) {
    const std::string cw = at(where + ".when", i);
    if (p[i].type != msgpack::type::MAP || p[i].via.map.size != 2) malformed(cw, "expected {r or ptr, is}");
    const Obj* is = map_find(p[i], "is");
    if (is == nullptr || is->type != msgpack::type::BOOLEAN) malformed(cw, "expected a boolean 'is'");
    CondDecl d;
    d.is = is->via.boolean;
    if (map_find(p[i], "r") != nullptr) {
      d.reg = get_int(p[i], "r", cw);
      if (d.reg < 0 || d.reg >= c.num_registers) malformed(cw, "register " + std::to_string(d.reg) + " out of range");
    } else {
      const Obj& ptr = field(p[i], "ptr", cw);
      if (ptr.type != msgpack::type::ARRAY || len(ptr) != 2) malformed(cw + ".ptr", "expected [slot, offset]");
      d.slot = as_int(ptr.via.array.ptr[0], cw + ".ptr");
      if (d.slot < 0 || d.slot >= m.num_slots())
        corrupt_plan(cw + " reads slot " + std::to_string(d.slot) + "; slots are 0 to " +
                     std::to_string(m.num_slots() - 1));
      d.offset = as_symint(ptr.via.array.ptr[1], cw + ".ptr", c);
    }
    out.push_back(d);
  }
  return out;
}

// A launch of plan `plan` ("native_cpu" / "native_cuda") whose kernels are `kernels`.
LaunchDecl parse_launch(const Obj& o, size_t index, const Manifest& m, const Ctx& c, const std::string& plan,
                        size_t kernels, size_t gemm_kernels) {
  const bool cuda = plan == "native_cuda";
  const std::string where = at(plan + ".launches", uint32_t(index)), launch = "launch " + std::to_string(index);
  LaunchDecl l;
  l.when = parse_when(o, where, m, c);
  const std::string op = get_str(o, "op", where);
  if (op == "ref") {
    l.op = LaunchDecl::kRef;
    l.node = get_int(o, "node", where);
    l.reason = opt_str(o, "reason", where);
    return l;
  }
  if (op == "kernel") {
    l.op = LaunchDecl::kKernel;
    l.kernel = get_int(o, "k", where);
    if (l.kernel < 0 || l.kernel >= int64_t(kernels))
      corrupt_plan(launch + " runs kernel " + std::to_string(l.kernel) + "; the plan has " + std::to_string(kernels));
  } else if (op == "gemm" || (cuda && (op == "cutlass" || op == "cublaslt"))) {
    l.op = op == "gemm" ? LaunchDecl::kGemm : op == "cutlass" ? LaunchDecl::kCutlass : LaunchDecl::kCublasLt;
    const std::string dt = get_str(o, "dtype", where);
    static const char* const kGemmDTypes[] = {"float32", "float64", "float16", "bfloat16"};  // record codes
    l.gemm_dtype = -1;
    for (int64_t k = 0; k < 4; ++k)
      if (dt == kGemmDTypes[k]) l.gemm_dtype = k;
    if (l.gemm_dtype < 0)
      malformed(where + ".dtype", "GEMMs are float32, float64, float16 or bfloat16, not " + dt);
    l.gemm_item = int64_t(dtype_size(dtype_from_name(dt)));
  } else {
    // the plan ABI is versioned: under ABI 1 an unknown op is corruption, not a newer format
    corrupt_plan(launch + " has op " + py_repr(op) + "; a " + (cuda ? "cuda" : "cpu") + " plan runs " +
                 (cuda ? "kernel, gemm, cublaslt, cutlass, ref" : "kernel, gemm, ref") + " launches");
  }
  const Obj& ptrs = field(o, "ptrs", where);
  const Obj* p = as_array(ptrs, where + ".ptrs");
  for (uint32_t i = 0; i < len(ptrs); ++i) {
    const std::string pw = at(where + ".ptrs", i);
    if (p[i].type != msgpack::type::ARRAY || len(p[i]) != 2) malformed(pw, "expected [slot, offset]");
    const int64_t slot = as_int(p[i].via.array.ptr[0], pw);
    if (slot < 0 || slot >= m.num_slots())
      corrupt_plan(launch + " points at slot " + std::to_string(slot) + "; slots are 0 to " +
                   std::to_string(m.num_slots() - 1));
    l.ptrs.emplace_back(slot, as_symint(p[i].via.array.ptr[1], pw, c));
  }
  l.ints = symints(field(o, "ints", where), where + ".ints", c);
  const size_t np = l.ptrs.size(), ni = l.ints.size();
  // a cuBLASLt GEMM's fourth operand and four integers go with its epilogue's source: checked below, once
  // the epilogue is read, with the Python loader's words
  const bool counts_ok = l.op == LaunchDecl::kGemm       ? np == 3 && ni == 20
                         : l.op == LaunchDecl::kCutlass  ? (np == 3 && ni == 20) || (np == 4 && ni == 24)
                         : l.op == LaunchDecl::kCublasLt ? (np == 3 || np == 4) && (ni == 20 || ni == 24)
                                                         : true;  // kernel and reference launches: checked elsewhere
  if (!counts_ok)
    corrupt_plan(launch + ": a GEMM takes 3 pointers and 20 integers, not " + std::to_string(l.ptrs.size()) + " / " +
                 std::to_string(l.ints.size()));
  const Obj* ep = l.op == LaunchDecl::kCutlass || l.op == LaunchDecl::kCublasLt ? map_find(o, "epilogue") : nullptr;
  if (ep != nullptr) {
    const std::string ew = where + ".epilogue";
    const std::string source = get_str(*ep, "source", ew), activation = get_str(*ep, "activation", ew);
    static const char* const kSources[] = {"none", "bias", "residual"};
    static const char* const kActivations[] = {"none", "relu", "gelu", "silu", "gelu_tanh"};
    if (std::find(std::begin(kSources), std::end(kSources), source) == std::end(kSources) ||
        std::find(std::begin(kActivations), std::end(kActivations), activation) == std::end(kActivations))
      corrupt_plan(launch + " has epilogue {'source': " + py_repr(source) + ", 'activation': " + py_repr(activation) + "}");
    if (l.op == LaunchDecl::kCublasLt) {
      // cublasLtEpilogue_t: DEFAULT 1, RELU 2, BIAS 4, GELU 32 (the tanh form); RELU_BIAS 6, GELU_BIAS 36
      const uint32_t act = activation == "relu" ? 2u : activation == "gelu_tanh" ? 32u : 0u;
      if (act == 0 && activation != "none")
        corrupt_plan(launch + ": cuBLASLt computes no " + activation + " epilogue");
      l.lt_source = source;
      l.lt_epilogue = (act | (source == "bias" ? 4u : 0u)) ? (act | (source == "bias" ? 4u : 0u)) : 1u;
    }
  }
  if (l.op == LaunchDecl::kCublasLt && ((np == 4) != (ni == 24) || (np == 4) != (l.lt_source != "none")))
    corrupt_plan(launch + ": a cuBLASLt GEMM has a fourth operand and four more integers exactly when its epilogue has a source");
  if (l.op == LaunchDecl::kCutlass) {
    for (const char* table : {"entries", "entries_sm90"}) {
      const Obj* es = map_find(o, table);
      if (es == nullptr) continue;
      const std::string ew = where + "." + table;
      const Obj* e = as_array(*es, ew);
      std::vector<GemmEntry>& into = std::string(table) == "entries" ? l.entries : l.entries_sm90;
      for (uint32_t i = 0; i < len(*es); ++i) {
        const std::string iw = at(ew, i);
        GemmEntry g{get_int(e[i], "kernel", iw), get_int(e[i], "split", iw), get_int(e[i], "pred", iw),
                    get_int(e[i], "align", iw)};
        if (g.pred < 0 || g.pred >= c.num_registers)
          corrupt_plan(launch + "'s dispatch predicate: register " + std::to_string(g.pred) + " is not below " +
                       std::to_string(c.num_registers));
        if (g.kernel < 0 || g.kernel >= int64_t(gemm_kernels))
          corrupt_plan(launch + " dispatches to GEMM kernel " + std::to_string(g.kernel));
        if (g.split < 1 || g.align < 1) malformed(iw, "split and align are positive");
        into.push_back(g);
      }
    }
    if (l.entries.empty()) malformed(where + ".entries", "a CUTLASS launch needs at least one dispatch entry");
  }
  if (l.ptrs.size() > 256) malformed(where, "more than 256 pointer arguments");
  return l;
}

// `key` is "native_cpu" or "native_cuda"; `kernels` the target's kernel rows.
NativePlan parse_native_plan(const Obj& nat, const Manifest& m, const Ctx& c, const std::string& key, size_t kernels) {
  const std::string& w = key;
  const bool cuda = key == "native_cuda";
  NativePlan plan;
  const int64_t abi = get_int(nat, "abi", w);
  if (abi != 1) fail(BPK_ERR_FORMAT, std::string("native ") + (cuda ? "CUDA" : "CPU") + " plan ABI " + std::to_string(abi) + " is not 1");
  if (!cuda) {
    const Obj& libs = field(nat, "libraries", w);
    const Obj* l = as_array(libs, w + ".libraries");
    for (uint32_t i = 0; i < len(libs); ++i) {
      const std::string lw = at(w + ".libraries", i);
      LibraryDecl d;
      d.isa = get_str(l[i], "isa", lw);
      d.section = get_str(l[i], "section", lw);
      const Obj& req = field(l[i], "requires", lw);
      const Obj* r = as_array(req, lw + ".requires");
      for (uint32_t j = 0; j < len(req); ++j) d.requires_flags.push_back(as_str(r[j], at(lw + ".requires", j)));
      plan.libraries.push_back(std::move(d));
    }
  } else {
    const Obj& imgs = field(nat, "images", w);
    const Obj* im = as_array(imgs, w + ".images");
    for (uint32_t i = 0; i < len(imgs); ++i)
      plan.images.push_back({get_str(im[i], "arch", at(w + ".images", i)), get_str(im[i], "section", at(w + ".images", i))});
    if (const Obj* gk = map_find(nat, "gemm_kernels"); gk && !is_nil(*gk)) {
      const Obj* g = as_array(*gk, w + ".gemm_kernels");
      for (uint32_t i = 0; i < len(*gk); ++i) {
        const std::string gw = at(w + ".gemm_kernels", i);
        std::string arch = opt_str(g[i], "arch", gw);
        plan.gemm_kernels.push_back({get_str(g[i], "name", gw), get_str(g[i], "section", gw), arch.empty() ? "sm_80" : arch});
      }
      plan.gemm_packer = get_str(field(nat, "gemm_packer", w), "section", w + ".gemm_packer");
    }
  }
  const Obj& ls = field(nat, "launches", w);
  const Obj* p = as_array(ls, w + ".launches");
  for (uint32_t i = 0; i < len(ls); ++i)
    plan.launches.push_back(parse_launch(p[i], i, m, c, key, kernels, plan.gemm_kernels.size()));
  const Obj& bs = field(nat, "buffers", w);
  const Obj* b = as_array(bs, w + ".buffers");
  for (uint32_t i = 0; i < len(bs); ++i) {
    const std::string bw = at(w + ".buffers", i);
    BufferDecl d;
    d.id = get_int(b[i], "id", bw);
    d.dtype = get_dtype(b[i], "dtype", bw);
    d.shape = symints(field(b[i], "shape", bw), bw + ".shape", c);
    d.offset = as_symint(field(b[i], "offset", bw), bw + ".offset", c);
    plan.buffers.push_back(std::move(d));
  }
  plan.arena_bytes = as_symint(field(nat, "arena_bytes", w), w + ".arena_bytes", c);
  const Obj& outs = field(nat, "outputs", w);
  const Obj* o = as_array(outs, w + ".outputs");
  if (len(outs) != m.outputs.size()) malformed(w + ".outputs", "one slot per output expected");
  for (uint32_t k = 0; k < len(outs); ++k) {
    const int64_t slot = as_int(o[k], at(w + ".outputs", k));
    if (slot != -1 && slot != int64_t(1 + m.inputs.size() + k))
      corrupt_plan("output " + std::to_string(k) + " is written to slot " + std::to_string(slot) + "; allowed: -1 or " +
                   std::to_string(1 + m.inputs.size() + k));
    plan.outputs.push_back(slot);
  }
  return plan;
}

void parse_native(const Obj& root, Manifest& m, const Ctx& c) {
  const Obj* nat = map_find(root, "native_cpu");
  if (nat == nullptr || is_nil(*nat)) return;
  m.native = parse_native_plan(*nat, m, c, "native_cpu", m.kernels.size());
}

}  // namespace

bool known_plan_op(const std::string& op) {
  for (const char* k : kPlanOps)
    if (op == k) return true;
  return false;
}

Manifest parse_manifest(const msgpack::object& root) {
  Manifest m;
  parse_signature(root, m);
  parse_program(root, m);
  Ctx c{m.shape_program.num_registers};
  parse_plan(root, m, c);
  parse_native(root, m, c);
  // every output is defined by the plan, or is an input or a weight
  std::set<int64_t> known;
  for (const auto& kv : m.values) known.insert(kv.first);
  for (const auto& t : m.inputs) known.insert(t.id);
  for (const auto& w : m.weights) known.insert(w.id);
  for (size_t k = 0; k < m.outputs.size(); ++k)
    if (!known.count(m.outputs[k].id)) malformed(at("outputs", k), "value %" + std::to_string(m.outputs[k].id) + " is never defined");
  std::vector<std::string> unknown;
  for (const auto& s : m.steps)
    if (!known_plan_op(s.op)) unknown.push_back("'" + s.op + "'");
  if (!unknown.empty()) {
    std::set<std::string> u(unknown.begin(), unknown.end());
    std::string list;
    for (const auto& x : u) list += (list.empty() ? "" : ", ") + x;
    fail(BPK_ERR_UNSUPPORTED, "the plan uses ops this loader does not know: [" + list + "]; upgrade bladepack");
  }
  return m;
}

void parse_cuda_plan(const msgpack::object& root, Manifest& m) {
  const Obj* nat = map_find(root, "native_cuda");
  if (nat == nullptr || is_nil(*nat)) fail(BPK_ERR_UNSUPPORTED, "no CUDA plan");
  Ctx c{m.shape_program.num_registers};
  m.cuda_kernels.clear();
  parse_kernel_rows(root, "cuda", c, m.cuda_kernels);
  m.native_cuda = parse_native_plan(*nat, m, c, "native_cuda", m.cuda_kernels.size());
}

}  // namespace bpk
