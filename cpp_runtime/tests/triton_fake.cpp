// A fake Triton server for the bladepack backend (triton/backend.cpp, linked in): it implements the
// TRITONSERVER_* / TRITONBACKEND_* functions the backend calls, loads a model directory, sends one
// batch of requests through TRITONBACKEND_ModelInstanceExecute and checks the backend's side of the
// contract — one response per request, sent once with the final flag, each request released once and
// its statistics reported once. Tests run it in the sanitizer build and compare what it writes with
// the Python loader.
//
//   triton_fake MODEL_DIR MAX_BATCH_SIZE cpu|gpu SPLIT OUT_DIR REQUEST...
//     REQUEST: NAME=FILE.npy[,NAME=FILE.npy...]   (one request; SPLIT 1 hands each input over in two buffers)
//   writes OUT_DIR/rK_OUTPUT.npy per output of request K, or OUT_DIR/rK.error ("CODE message");
//   prints "executions N: batch sizes ..."; exit 0, 1 on a broken contract, 2 on bad usage, 3 when the
//   model does not load (the reason on stderr).

#include <bladepack/runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../tools/npy.h"
#include "../triton/triton_abi.h"

struct TRITONSERVER_Error {
  TRITONSERVER_Error_Code code;
  std::string msg;
};
struct TRITONSERVER_Message {
  std::string json;
};
struct TRITONBACKEND_Model {
  std::string dir;
  std::string config;
  void* state = nullptr;
};
struct TRITONBACKEND_ModelInstance {
  TRITONBACKEND_Model* model = nullptr;
  TRITONSERVER_InstanceGroupKind kind = TRITONSERVER_INSTANCEGROUPKIND_CPU;
  void* state = nullptr;
  std::vector<uint64_t> batches;
};
struct TRITONBACKEND_Input {
  std::string name;
  TRITONSERVER_DataType dtype;
  std::vector<int64_t> shape;
  std::vector<std::vector<uint8_t>> buffers;
};
struct TRITONBACKEND_Output {
  std::string name;
  TRITONSERVER_DataType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};
struct TRITONBACKEND_Response;
struct TRITONBACKEND_Request {
  std::vector<TRITONBACKEND_Input> inputs;
  int released = 0, responses = 0, stats = 0;
  TRITONBACKEND_Response* response = nullptr;
};
struct TRITONBACKEND_Response {
  TRITONBACKEND_Request* request;
  std::vector<std::unique_ptr<TRITONBACKEND_Output>> outputs;
  int sent = 0;
  uint32_t flags = 0;
  bool failed = false;
  TRITONSERVER_Error error{TRITONSERVER_ERROR_UNKNOWN, ""};
};

namespace {
std::vector<std::unique_ptr<TRITONBACKEND_Response>> g_responses;  // the fake server's response pool

TRITONSERVER_Error* fail(TRITONSERVER_Error_Code code, const std::string& msg) {
  return new TRITONSERVER_Error{code, msg};
}

TRITONSERVER_DataType to_triton(int32_t d) {
  switch (d) {
    case BPK_BOOL: return TRITONSERVER_TYPE_BOOL;
    case BPK_UINT8: return TRITONSERVER_TYPE_UINT8;
    case BPK_INT8: return TRITONSERVER_TYPE_INT8;
    case BPK_INT16: return TRITONSERVER_TYPE_INT16;
    case BPK_INT32: return TRITONSERVER_TYPE_INT32;
    case BPK_INT64: return TRITONSERVER_TYPE_INT64;
    case BPK_FLOAT16: return TRITONSERVER_TYPE_FP16;
    case BPK_FLOAT32: return TRITONSERVER_TYPE_FP32;
    case BPK_FLOAT64: return TRITONSERVER_TYPE_FP64;
    default: throw std::runtime_error("no Triton type for bpk dtype " + std::to_string(d));
  }
}

int32_t to_bpk(TRITONSERVER_DataType t) {
  for (int32_t d = 0; d <= BPK_BOOL; ++d)
    if (d != BPK_BFLOAT16 && to_triton(d) == t) return d;
  throw std::runtime_error("unexpected output type " + std::to_string(static_cast<int>(t)));
}
}  // namespace

extern "C" {
TRITONSERVER_Error* TRITONSERVER_ErrorNew(TRITONSERVER_Error_Code code, const char* msg) { return fail(code, msg); }
void TRITONSERVER_ErrorDelete(TRITONSERVER_Error* e) { delete e; }
const char* TRITONSERVER_ErrorMessage(TRITONSERVER_Error* e) { return e->msg.c_str(); }
TRITONSERVER_Error* TRITONSERVER_MessageSerializeToJson(TRITONSERVER_Message* m, const char** base, size_t* size) {
  *base = m->json.data();
  *size = m->json.size();
  return nullptr;
}
TRITONSERVER_Error* TRITONSERVER_MessageDelete(TRITONSERVER_Message* m) {
  delete m;
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_ApiVersion(uint32_t* major, uint32_t* minor) {
  *major = 1;
  *minor = 19;
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_ModelRepository(TRITONBACKEND_Model* m, TRITONBACKEND_ArtifactType* t,
                                                  const char** location) {
  *t = TRITONBACKEND_ARTIFACT_FILESYSTEM;
  *location = m->dir.c_str();
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_ModelVersion(TRITONBACKEND_Model*, uint64_t* version) {
  *version = 1;
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_ModelConfig(TRITONBACKEND_Model* m, uint32_t, TRITONSERVER_Message** config) {
  *config = new TRITONSERVER_Message{m->config};
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_ModelSetState(TRITONBACKEND_Model* m, void* s) {
  m->state = s;
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_ModelState(TRITONBACKEND_Model* m, void** s) {
  *s = m->state;
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceModel(TRITONBACKEND_ModelInstance* i, TRITONBACKEND_Model** m) {
  *m = i->model;
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceKind(TRITONBACKEND_ModelInstance* i, TRITONSERVER_InstanceGroupKind* k) {
  *k = i->kind;
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceDeviceId(TRITONBACKEND_ModelInstance*, int32_t* id) {
  *id = 0;
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceSetState(TRITONBACKEND_ModelInstance* i, void* s) {
  i->state = s;
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceState(TRITONBACKEND_ModelInstance* i, void** s) {
  *s = i->state;
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportStatistics(TRITONBACKEND_ModelInstance*, TRITONBACKEND_Request* r,
                                                               bool, uint64_t, uint64_t, uint64_t, uint64_t) {
  r->stats += 1;
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportBatchStatistics(TRITONBACKEND_ModelInstance* i, uint64_t n,
                                                                    uint64_t, uint64_t, uint64_t, uint64_t) {
  i->batches.push_back(n);
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_RequestInputCount(TRITONBACKEND_Request* r, uint32_t* count) {
  *count = static_cast<uint32_t>(r->inputs.size());
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_RequestInputByIndex(TRITONBACKEND_Request* r, uint32_t index,
                                                      TRITONBACKEND_Input** input) {
  if (index >= r->inputs.size()) return fail(TRITONSERVER_ERROR_INVALID_ARG, "input index out of range");
  *input = &r->inputs[index];
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_InputProperties(TRITONBACKEND_Input* in, const char** name,
                                                  TRITONSERVER_DataType* dtype, const int64_t** shape,
                                                  uint32_t* dims, uint64_t* byte_size, uint32_t* buffers) {
  *name = in->name.c_str();
  *dtype = in->dtype;
  *shape = in->shape.data();
  *dims = static_cast<uint32_t>(in->shape.size());
  uint64_t n = 0;
  for (const auto& b : in->buffers) n += b.size();
  *byte_size = n;
  *buffers = static_cast<uint32_t>(in->buffers.size());
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_InputBuffer(TRITONBACKEND_Input* in, uint32_t index, const void** buffer,
                                              uint64_t* size, TRITONSERVER_MemoryType* mem, int64_t* mem_id) {
  if (index >= in->buffers.size()) return fail(TRITONSERVER_ERROR_INVALID_ARG, "buffer index out of range");
  *buffer = in->buffers[index].data();
  *size = in->buffers[index].size();
  *mem = TRITONSERVER_MEMORY_CPU;
  *mem_id = 0;
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_RequestRelease(TRITONBACKEND_Request* r, uint32_t flags) {
  if (flags != kTritonRequestReleaseAll) return fail(TRITONSERVER_ERROR_INVALID_ARG, "release flags");
  r->released += 1;
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_ResponseNew(TRITONBACKEND_Response** response, TRITONBACKEND_Request* r) {
  r->responses += 1;
  g_responses.push_back(std::make_unique<TRITONBACKEND_Response>());
  g_responses.back()->request = r;
  r->response = g_responses.back().get();
  *response = r->response;
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_ResponseOutput(TRITONBACKEND_Response* resp, TRITONBACKEND_Output** output,
                                                 const char* name, TRITONSERVER_DataType dtype,
                                                 const int64_t* shape, uint32_t dims) {
  resp->outputs.push_back(std::make_unique<TRITONBACKEND_Output>());
  auto& o = *resp->outputs.back();
  o.name = name;
  o.dtype = dtype;
  o.shape.assign(shape, shape + dims);
  *output = &o;
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_OutputBuffer(TRITONBACKEND_Output* o, void** buffer, uint64_t size,
                                               TRITONSERVER_MemoryType* mem, int64_t* mem_id) {
  o->data.assign(size, 0xAB);
  *buffer = o->data.data();
  *mem = TRITONSERVER_MEMORY_CPU;
  *mem_id = 0;
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_ResponseSend(TRITONBACKEND_Response* resp, uint32_t flags, TRITONSERVER_Error* e) {
  resp->sent += 1;
  resp->flags = flags;
  if (e != nullptr) {
    resp->failed = true;
    resp->error = *e;  // the sender keeps ownership
  }
  return nullptr;
}
TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend*);
TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model*);
TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model*);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance*);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance*);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance*, TRITONBACKEND_Request**, uint32_t);
}  // extern "C"

namespace {
const char* code_name(TRITONSERVER_Error_Code c) {
  switch (c) {
    case TRITONSERVER_ERROR_INTERNAL: return "INTERNAL";
    case TRITONSERVER_ERROR_INVALID_ARG: return "INVALID_ARG";
    case TRITONSERVER_ERROR_UNSUPPORTED: return "UNSUPPORTED";
    default: return "OTHER";
  }
}

TRITONBACKEND_Request parse_request(const std::string& spec, bool split) {
  TRITONBACKEND_Request r;
  size_t at = 0;
  while (at <= spec.size()) {
    size_t comma = spec.find(',', at);
    std::string item = spec.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    size_t eq = item.find('=');
    if (eq == std::string::npos) throw std::runtime_error("a request input is NAME=FILE.npy, got " + item);
    npy::Array a = npy::read(item.substr(eq + 1));
    TRITONBACKEND_Input in;
    in.name = item.substr(0, eq);
    in.dtype = to_triton(a.dtype);
    in.shape = a.shape;
    size_t n = bpk_dtype_size(a.dtype);
    for (int64_t d : a.shape) n *= static_cast<size_t>(d);
    auto* p = static_cast<uint8_t*>(a.aligned);
    size_t half = split ? n / 2 : n;
    in.buffers.emplace_back(p, p + half);
    if (split) in.buffers.emplace_back(p + half, p + n);
    r.inputs.push_back(std::move(in));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return r;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: triton_fake MODEL_DIR MAX_BATCH_SIZE cpu|gpu SPLIT OUT_DIR REQUEST...\n");
    return 2;
  }
  try {
    TRITONBACKEND_Model model;
    model.dir = argv[1];
    // TRITON_FAKE_PARAMETERS: the config's "parameters" object as JSON, as Triton serializes it
    const char* params = std::getenv("TRITON_FAKE_PARAMETERS");
    model.config = std::string("{\"name\":\"m\",\"max_batch_size\":") + argv[2] + ",\"input\":[]" +
                   (params ? std::string(",\"parameters\":") + params : std::string()) + "}";
    TRITONBACKEND_ModelInstance instance;
    instance.model = &model;
    instance.kind = std::strcmp(argv[3], "gpu") == 0 ? TRITONSERVER_INSTANCEGROUPKIND_GPU : TRITONSERVER_INSTANCEGROUPKIND_CPU;
    bool split = std::strcmp(argv[4], "1") == 0;
    std::string out = argv[5];
    for (auto* e : {TRITONBACKEND_Initialize(nullptr), TRITONBACKEND_ModelInitialize(&model)}) {
      if (e != nullptr) {
        std::fprintf(stderr, "load error: %s %s\n", code_name(e->code), e->msg.c_str());
        delete e;
        return 3;
      }
    }
    if (auto* e = TRITONBACKEND_ModelInstanceInitialize(&instance)) {
      std::fprintf(stderr, "load error: %s %s\n", code_name(e->code), e->msg.c_str());
      delete e;
      TRITONBACKEND_ModelFinalize(&model);
      return 3;
    }
    std::vector<TRITONBACKEND_Request> requests;
    for (int k = 6; k < argc; ++k) requests.push_back(parse_request(argv[k], split));
    std::vector<TRITONBACKEND_Request*> handles;
    for (auto& r : requests) handles.push_back(&r);
    if (auto* e = TRITONBACKEND_ModelInstanceExecute(&instance, handles.data(), static_cast<uint32_t>(handles.size()))) {
      std::fprintf(stderr, "execute returned an error: %s\n", e->msg.c_str());
      delete e;
      return 1;
    }
    int broken = 0;
    for (size_t k = 0; k < requests.size(); ++k) {
      const auto& r = requests[k];
      if (r.released != 1 || r.responses != 1 || r.stats != 1 || r.response->sent != 1 ||
          r.response->flags != kTritonResponseCompleteFinal) {
        std::fprintf(stderr, "request %zu: released %d, responses %d, statistics %d, sent %d, flags %u\n", k,
                     r.released, r.responses, r.stats, r.response ? r.response->sent : 0,
                     r.response ? r.response->flags : 0);
        ++broken;
        continue;
      }
      std::string base = out + "/r" + std::to_string(k);
      if (r.response->failed) {
        std::ofstream(base + ".error") << code_name(r.response->error.code) << " " << r.response->error.msg;
        continue;
      }
      for (const auto& o : r.response->outputs) npy::write(base + "_" + o->name + ".npy", to_bpk(o->dtype), o->shape, o->data.data());
    }
    std::printf("executions %zu: batch sizes", instance.batches.size());
    for (uint64_t b : instance.batches) std::printf(" %llu", static_cast<unsigned long long>(b));
    std::printf("\n");
    TRITONBACKEND_ModelInstanceFinalize(&instance);
    TRITONBACKEND_ModelFinalize(&model);
    return broken == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "triton_fake: %s\n", e.what());
    return 2;
  }
}
