#include "padded_dims.h"

#include "artifact.h"
#include "errors.h"
#include "util.h"

namespace bpk {
namespace {

std::string text_of(const msgpack::object& o) {
  return o.type == msgpack::type::STR ? std::string(o.via.str.ptr, o.via.str.size) : std::string();
}

bool number_of(const msgpack::object& o, double* out) {
  switch (o.type) {
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: *out = o.via.f64; return true;
    case msgpack::type::POSITIVE_INTEGER: *out = double(o.via.u64); return true;
    case msgpack::type::NEGATIVE_INTEGER: *out = double(o.via.i64); return true;
    default: return false;
  }
}

// The index of the tensor named `name`, or -1.
int64_t index_of(const std::vector<TensorDecl>& ts, const std::string& name) {
  for (size_t i = 0; i < ts.size(); ++i)
    if (ts[i].name == name) return int64_t(i);
  return -1;
}

// An axis of tensor `t` whose dim is the symbol `dim`, or -1.
int64_t axis_of(const msgpack::object& o, const TensorDecl& t, const std::string& dim) {
  if (o.type != msgpack::type::POSITIVE_INTEGER || o.via.u64 >= t.shape.size()) return -1;
  const auto& d = t.shape[size_t(o.via.u64)];
  return d.is_static || d.text != dim ? -1 : int64_t(o.via.u64);
}

}  // namespace

PaddedDims::PaddedDims(const msgpack::object& root, const Manifest& m, const std::string& source) {
  const msgpack::object* proofs = map_find(root, "padding_dims");
  if (proofs == nullptr || proofs->type != msgpack::type::MAP) return;
  for (uint32_t k = 0; k < proofs->via.map.size; ++k) {
    const std::string name = text_of(proofs->via.map.ptr[k].key);
    const msgpack::object& proof = proofs->via.map.ptr[k].val;
    const msgpack::object* ok = proof.type == msgpack::type::MAP ? map_find(proof, "padding") : nullptr;
    if (ok == nullptr || ok->type != msgpack::type::BOOLEAN || !ok->via.boolean) continue;
    const auto bad = [&](const std::string& what) {
      fail(BPK_ERR_FORMAT, source + ": malformed manifest: padding_dims[" + py_repr(name) + "] " + what);
    };
    Dim d;
    d.name = name;
    const msgpack::object* rows = map_find(proof, "rows");
    d.rows = rows ? text_of(*rows) : "";
    d.input_axes.assign(m.inputs.size(), -1);
    d.input_pads.assign(m.inputs.size(), 0.0);
    d.output_axes.assign(m.outputs.size(), 0);
    const msgpack::object* ins = map_find(proof, "inputs");
    const msgpack::object* outs = map_find(proof, "outputs");
    if (ins == nullptr || ins->type != msgpack::type::MAP || outs == nullptr || outs->type != msgpack::type::MAP)
      bad("lacks its inputs or outputs");
    for (uint32_t i = 0; i < ins->via.map.size; ++i) {
      const std::string input = text_of(ins->via.map.ptr[i].key);
      const int64_t at = index_of(m.inputs, input);
      const msgpack::object& rec = ins->via.map.ptr[i].val;
      const msgpack::object* ax = rec.type == msgpack::type::MAP ? map_find(rec, "axis") : nullptr;
      const msgpack::object* pad = rec.type == msgpack::type::MAP ? map_find(rec, "pad") : nullptr;
      int64_t axis = -1;
      if (at < 0 || ax == nullptr || pad == nullptr || (axis = axis_of(*ax, m.inputs[size_t(at)], name)) < 0 ||
          !number_of(*pad, &d.input_pads[size_t(at)]))
        bad("does not give the axis of " + py_repr(name) + " and a pad value for input " + py_repr(input));
      d.input_axes[size_t(at)] = int32_t(axis);
    }
    for (uint32_t i = 0; i < outs->via.map.size; ++i) {
      const std::string output = text_of(outs->via.map.ptr[i].key);
      const int64_t at = index_of(m.outputs, output);
      const msgpack::object& list = outs->via.map.ptr[i].val;
      if (at < 0 || list.type != msgpack::type::ARRAY) bad("names output " + py_repr(output) + " wrongly");
      for (uint32_t j = 0; j < list.via.array.size; ++j) {
        const int64_t axis = axis_of(list.via.array.ptr[j], m.outputs[size_t(at)], name);
        if (axis < 0 || axis >= 64) bad("gives an axis of output " + py_repr(output) + " that is not " + py_repr(name));
        d.output_axes[size_t(at)] |= uint64_t(1) << axis;
      }
    }
    dims_.push_back(std::move(d));
  }
  for (const Dim& d : dims_)
    specs_.push_back(bpk_padded_dim{d.name.c_str(), d.rows.empty() ? nullptr : d.rows.c_str(), d.input_axes.data(),
                                    d.input_pads.data(), d.output_axes.data()});
}

}  // namespace bpk
