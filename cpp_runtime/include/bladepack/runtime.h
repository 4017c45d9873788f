/* libbladepack_runtime: load and run .bpk artifacts without Python (C ABI).
 *
 * The contract is docs/format.md; results match the Python loader (`bladepack.load`). Every function
 * returns a status; on failure bpk_last_error() holds the reason (the same text the Python loader
 * raises). A loaded model is immutable: bpk_model_run may be called from several threads at once.
 *
 *   bpk_model* m;
 *   if (bpk_model_load("model.bpk", NULL, &m) != BPK_OK) fprintf(stderr, "%s\n", bpk_last_error());
 *   bpk_tensor in = {data, {batch, 64}, 2, BPK_FLOAT32};
 *   bpk_tensor out = {0};                    // data NULL: the runtime allocates it
 *   bpk_model_run(m, &in, 1, &out, 1);      // ... use out ..., then bpk_free(out.data)
 *   bpk_model_free(m);
 */
#ifndef BLADEPACK_RUNTIME_H_
#define BLADEPACK_RUNTIME_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define BPK_API
#else
#define BPK_API __attribute__((visibility("default")))
#endif

#define BPK_RUNTIME_VERSION_MAJOR 0
#define BPK_RUNTIME_VERSION_MINOR 1
/* The newest artifact format this runtime reads (it reads every 1.x; see docs/format.md). */
#define BPK_FORMAT_MAJOR 1
#define BPK_FORMAT_MINOR 14
/* Tensors of higher rank are refused at load with the reason. */
#define BPK_MAX_RANK 16

typedef enum bpk_status {
  BPK_OK = 0,
  BPK_ERR_ARGUMENT = 1,    /* a null pointer, a count that does not match the signature, ... */
  BPK_ERR_IO = 2,          /* the file cannot be opened or mapped */
  BPK_ERR_FORMAT = 3,      /* not an artifact, truncated, checksum mismatch, malformed manifest */
  BPK_ERR_UNSUPPORTED = 4, /* a valid artifact this runtime cannot run (no kernels for this CPU, ...) */
  BPK_ERR_INPUT = 5,       /* wrong input count, rank, dtype or static dim; a bad output buffer */
  BPK_ERR_SHAPE_GUARD = 6, /* a dynamic dim outside its range, or dims that must agree do not */
  BPK_ERR_EXECUTION = 7,   /* a kernel failed (an index outside its table) */
  BPK_ERR_MEMORY = 8,
  BPK_ERR_TRUST = 9, /* not the pinned file, unsigned, or not signed by a trusted key (docs/format.md "Trust") */
  BPK_ERR_VERIFY = 10, /* a reference case gave results other than the recorded ones (bpk_model_verify) */
  BPK_ERR_INDEX = 11   /* an index read from an input is outside its table (embedding, gather): a bad input */
} bpk_status;

typedef enum bpk_dtype {
  BPK_FLOAT32 = 0,
  BPK_FLOAT64 = 1,
  BPK_FLOAT16 = 2,
  BPK_BFLOAT16 = 3,
  BPK_INT64 = 4,
  BPK_INT32 = 5,
  BPK_INT16 = 6,
  BPK_INT8 = 7,
  BPK_UINT8 = 8,
  BPK_BOOL = 9 /* one byte, 0 or 1 */
} bpk_dtype;

/* A C-contiguous tensor in host memory (bpk_model_run_dlpack takes device memory too). */
typedef struct bpk_tensor {
  void* data;
  int64_t shape[BPK_MAX_RANK];
  int32_t ndim;
  int32_t dtype; /* a bpk_dtype */
} bpk_tensor;

/* One input or output of the signature. dims[i] is the static size, or -1 for a dynamic dim whose
 * expression over the symbols is dim_exprs[i] ("batch", "past+1"); static dims read "64" there. */
typedef struct bpk_tensor_spec {
  const char* name;
  int32_t dtype;
  int32_t ndim;
  const int64_t* dims;
  const char* const* dim_exprs;
} bpk_tensor_spec;

typedef struct bpk_symbol_spec {
  const char* name;
  int64_t min;
  int64_t max; /* -1: unbounded */
} bpk_symbol_spec;

typedef struct bpk_signature {
  int64_t num_inputs;
  const bpk_tensor_spec* inputs;
  int64_t num_outputs;
  const bpk_tensor_spec* outputs;
  int64_t num_symbols;
  const bpk_symbol_spec* symbols;
  const char* text; /* "(x: float32[batch, 64]) -> (output0: float32[batch, 10]) where batch in [1, 4096]" */
} bpk_signature;

/* Load flags. */
#define BPK_LOAD_SKIP_SECTION_CHECKSUMS 1u /* verify the manifest only (sections are still bounds-checked) */

/* The sha256 / trusted_keys fields are set. Loading an artifact runs native code from it: these say
 * which artifacts to trust (docs/format.md "Trust"). Without this flag the fields are not read, so
 * callers built against the two-field struct stay compatible. */
#define BPK_LOAD_TRUST 2u

/* The on_out_of_range field is set (read only with this flag, as the trust fields are). */
#define BPK_LOAD_OUT_OF_RANGE 4u

/* The device field is set (read only with this flag). */
#define BPK_LOAD_DEVICE 8u

/* The mmap field is set (read only with this flag). */
#define BPK_LOAD_MAPPING 16u

typedef struct bpk_load_options {
  uint32_t flags;
  int32_t num_threads; /* kernel threads; 0: BLADEPACK_NUM_THREADS, else the CPUs this process may use */
  /* read only with BPK_LOAD_TRUST: */
  const char* sha256;          /* 64 hex digits the whole file's SHA-256 must be, checked first; or NULL */
  const uint8_t* trusted_keys; /* n_trusted_keys Ed25519 public keys, 32 bytes each */
  size_t n_trusted_keys;       /* > 0: the artifact must be signed by one of them (sections all checked) */
  /* read only with BPK_LOAD_OUT_OF_RANGE: the policy per dynamic dim for sizes above its range,
   * "DIM=POLICY[,DIM=POLICY...]" with POLICY "error" (the default) or "split": a larger batch runs as
   * several calls of near-equal pieces inside the range whose results are concatenated. "split" is
   * refused at load (BPK_ERR_ARGUMENT, with the reason) unless the compiler proved the dim batch-like
   * (docs/format.md "Batch-like dims"; `bladepack inspect` lists them). NULL: every dim "error". */
  const char* on_out_of_range;
  /* read only with BPK_LOAD_DEVICE: "cpu" (the default), "cuda" or "cuda:N". A CUDA model runs the
   * artifact's native CUDA plan through the driver API (libcuda.so.1 is loaded at run time; nothing
   * links against CUDA); bpk_tensor data are host memory, copied to the device and back per call. */
  const char* device;
  /* read only with BPK_LOAD_DEVICE: CUDA graphs kept per stream. From its second call on a stream, a
   * shape signature's launches replay as one captured graph (one driver call per run; plans with a
   * run-time branch read on the host never are); 0: the default (64, least recently used dropped
   * first), -1: off (every kernel launched by itself). */
  int32_t cuda_graphs;
  /* read only with BPK_LOAD_MAPPING (bpk_model_load; bpk_model_load_from_memory always copies): 1 maps the
   * file, so its pages are shared with other processes, but the file must not change while the model
   * is loaded (weights are read from it when used; truncating it faults the process); 0 reads it once
   * into private memory, after which the file may be rewritten, truncated or deleted; -1 (the default
   * without the flag): private when sha256 or trusted_keys are set, so what was checked is what runs,
   * else mapped; 1 with sha256 is BPK_ERR_ARGUMENT (the pin covers the bytes read, not a mapping that
   * may change after the check: sign a large file to map it). Kernel code is always loaded from a
   * checked private copy (docs/format.md "Trust"). */
  int32_t mmap;
} bpk_load_options;

typedef struct bpk_model bpk_model;

/* DLPack 1.x (https://dmlc.github.io/dlpack/latest/c_api.html): the tensors of bpk_model_run_dlpack.
 * Declared here with dlpack.h's layout unless dlpack.h was included first (its include guard). */
#ifndef DLPACK_DLPACK_H_
#define DLPACK_DLPACK_H_
#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 0
typedef enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 } DLDeviceType;
typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;
typedef enum { kDLInt = 0U, kDLUInt = 1U, kDLFloat = 2U, kDLBfloat = 4U, kDLBool = 6U } DLDataTypeCode;
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;
typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;
typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;
#endif

/* Per-call options of bpk_model_run_dlpack (options may be NULL: all zero). */
typedef struct bpk_run_options {
  uint32_t flags; /* none defined: 0 */
  /* A CUDA model: the CUstream the call's work is enqueued on, in that stream's order (its inputs may
   * be written by earlier work on it, its results read by later work); the call returns once the work
   * is enqueued, unless some output is in host memory (then it waits for the stream; an index error its
   * kernels found is its own): see bpk_model_synchronize for when an index error is reported. NULL: a
   * stream of the runtime's own; the call returns with the results complete. Ignored by CPU models. */
  void* stream;
} bpk_run_options;

/* The reason the last failing call on this thread failed ("" if none). Valid until the next call. */
BPK_API const char* bpk_last_error(void);
BPK_API const char* bpk_status_name(bpk_status status);
BPK_API const char* bpk_dtype_name(int32_t dtype);
BPK_API size_t bpk_dtype_size(int32_t dtype);

/* Memory-maps the file (weights are not copied). options may be NULL. */
BPK_API bpk_status bpk_model_load(const char* path, const bpk_load_options* options, bpk_model** model);
/* Copies `size` bytes into storage the model owns; `data` may be freed on return. */
BPK_API bpk_status bpk_model_load_from_memory(const void* data, size_t size, const bpk_load_options* options,
                                              bpk_model** model);
BPK_API void bpk_model_free(bpk_model* model);

/* Owned by the model; valid until bpk_model_free. */
BPK_API bpk_status bpk_model_signature(const bpk_model* model, const bpk_signature** signature);

/* A dim requests may differ in and still run as one call, each padded at the end of the dim to the
 * longest (docs/format.md "Padding proofs"): the results at a request's own positions are its own.
 * Arrays are per input / output of the signature, in its order. */
typedef struct bpk_padded_dim {
  const char* name;            /* the dim */
  const char* rows;            /* the batch-like dim whose rows may each have their own length; NULL: one per call */
  const int32_t* input_axes;   /* the axis holding the dim, -1 where the input does not hold it */
  const double* input_pads;    /* the value padded positions take */
  const uint64_t* output_axes; /* bit k set: axis k holds the dim (cut a request's result to its length) */
} bpk_padded_dim;

/* The proven padded dims (format 1.5; none for older artifacts): *dims lives as long as the model. */
BPK_API bpk_status bpk_model_padded_dims(const bpk_model* model, const bpk_padded_dim** dims, int64_t* num_dims);
/* "native (x86-64-v4)", or "cuda (sm_90 image on NVIDIA H100 80GB HBM3, sm_90)": what runs the
 * model's steps here. */
BPK_API const char* bpk_model_executor(const bpk_model* model);

/* Result shapes for the given inputs (only ndim / shape / dtype are read; data may be NULL), with every
 * input check and shape guard applied; fills outputs[k].ndim, shape and dtype (data is left alone). */
BPK_API bpk_status bpk_model_output_shapes(const bpk_model* model, const bpk_tensor* inputs, int64_t num_inputs,
                                           bpk_tensor* outputs, int64_t num_outputs);

/* Runs the model. outputs[k].data != NULL: the caller's buffer, whose ndim, shape and dtype must be
 * the result's (bpk_model_output_shapes says what they are). outputs[k].data == NULL: the runtime
 * allocates it (64-byte aligned; release with bpk_free) and fills ndim, shape and dtype.
 * Output buffers must not overlap inputs or each other. Thread-safe. */
BPK_API bpk_status bpk_model_run(const bpk_model* model, const bpk_tensor* inputs, int64_t num_inputs,
                                 bpk_tensor* outputs, int64_t num_outputs);

/* Runs several sequences of different lengths in one call, without padding (an artifact optimized with
 * packed=True, format 1.8: docs/format.md "Packed form"): each ragged input holds the sequences one
 * after the other along its sequence axis, its rows axis 1; lengths[i] is sequence i's length. The
 * outputs (as bpk_model_run's) hold the sequences' results one after the other along their sequence
 * axis, as each sequence alone gives them. Each length is checked as a call of that sequence alone
 * would be ("a sequence of length N: ..."). BPK_ERR_UNSUPPORTED when the artifact has no packed form,
 * or the model runs on a GPU and the packed form has no CUDA plan (built without a CUDA target). The
 * packed plan loads on first use, on the model's device. */
BPK_API bpk_status bpk_model_run_packed(const bpk_model* model, const bpk_tensor* inputs, int64_t num_inputs,
                                        const int64_t* lengths, int64_t num_lengths, bpk_tensor* outputs,
                                        int64_t num_outputs);
/* 1 when the artifact has a packed form (bpk_model_run_packed), else 0 (also for a NULL model). */
BPK_API int bpk_model_has_packed(const bpk_model* model);
/* The ragged dim its packed form runs along (a symbol of bpk_model_padded_dims), or NULL when it has
 * none; lives as long as the model. */
BPK_API const char* bpk_model_packed_symbol(const bpk_model* model);

/* Runs the model on DLPack tensors. inputs[i]: host memory (kDLCPU, kDLCUDAHost) or, for a CUDA model,
 * memory of its device (kDLCUDA / kDLCUDAManaged with that device_id), C-contiguous (strides NULL or
 * row-major compact), byte_offset honoured; the dtype is the DLPack spelling of the signature's
 * (float32 {kDLFloat, 32, 1}, bfloat16 {kDLBfloat, 16, 1}, bool {kDLBool, 8, 1}, ...). outputs[k]:
 * NULL, and the runtime stores a tensor it allocated on the model's device (kDLCUDA for a CUDA model,
 * kDLCPU for a CPU model; release it with its deleter, which may run after bpk_model_free); or the
 * caller's tensor (host or device, the result's dtype and shape, contiguous), written in place and
 * never released by the runtime. A CUDA model reads host inputs and writes host outputs through its
 * own device buffer. Thread-safe; on failure no output the runtime allocated is left behind.
 * on_out_of_range "split" is not applied here (a dim above its range is a shape-guard error). */
BPK_API bpk_status bpk_model_run_dlpack(const bpk_model* model, const DLTensor* const* inputs, int64_t num_inputs,
                                        DLManagedTensorVersioned** outputs, int64_t num_outputs,
                                        const bpk_run_options* options);

/* A CUDA model: waits for the work of the calls made on caller stream `stream` (every caller stream when
 * NULL) and reports an index error one of them found and no later call reported (BPK_ERR_INDEX naming
 * the kernel, op and source line). A call with a caller stream and device results does not wait for its
 * kernels: an index error they find is reported by the next call on that stream (which then does not
 * run), by this function, or on stderr when the model is freed; BLADEPACK_CUDA_STRICT_ERRORS=1 makes
 * every call wait and report its own. A CPU model: BPK_OK. Thread-safe. */
BPK_API bpk_status bpk_model_synchronize(const bpk_model* model, void* stream);

/* Runs the reference cases recorded in the artifact at optimize time (docs/format.md "Reference
 * cases") on this machine and compares the results with the recorded outputs. *report (release with
 * bpk_free) receives the report as text, one verdict line per case ("case 0: batch=1 (1x64): pass"),
 * the same lines `bladepack verify` prints. BPK_OK when every case passed or there are none (the
 * report says so), BPK_ERR_VERIFY when a case failed, BPK_ERR_FORMAT for a malformed record. */
BPK_API bpk_status bpk_model_verify(const bpk_model* model, char** report);

BPK_API void bpk_free(void* data);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BLADEPACK_RUNTIME_H_ */
