/* A fake CUDA driver (libcuda.so.1) for testing the launch path on machines without a GPU.
 *
 * cuda-bindings dlopens libcuda.so.1 and resolves every entry point through cuGetProcAddress_v2, so
 * this library exports that, cuDriverGetVersion and the functions bladepack's loaders call. Device
 * memory is host memory; kernels do not run: every call that matters is appended as one line to the
 * file named by FAKE_CUDA_LOG (module loads with the image kind and size, function lookups, attribute
 * settings, launches with grid, block, shared memory, stream and the argument bytes in hex, copies).
 * FAKE_CUDA_CC ("90") sets the compute capability, FAKE_CUDA_DEVICES (1) the device count.
 *
 * Kernels run when FAKE_CUDA_EMU names a host build of the same CUDA source (g++ -DBPK_EMULATE, see
 * cuda_emulation.h): a module load opens it, a function lookup finds its `bpk_emu_<name>` entry (an
 * unknown name fails as the real driver's CUDA_ERROR_NOT_FOUND), and a launch runs the grid on the CPU
 * with the launch's parameter words. Without it the fake checks the ABI the loaders use, not numbers.
 * A process that loads modules of several CUDA sources (an artifact's plan and its packed form's) names
 * each image's host build in the file FAKE_CUDA_EMU_MAP instead: lines of "<FNV-1a 64 of the image, hex>
 * <path>" (the image as the module load reads it: an ELF's sections, a PTX text); an image it does not
 * list opens FAKE_CUDA_EMU.
 *
 * Calls may come from several threads (the C++ runtime runs calls on their own streams at once): the
 * log and every emulated grid are serialized by one lock, since the emulation's thread and block
 * indices and `__shared__` variables are process-wide. Copies and launches complete before they return,
 * so each stream's work is ordered as the driver orders it.
 *
 * Time is simulated for CUDA events: every launch advances a clock by the microseconds FAKE_CUDA_KERNEL_US
 * gives the first pattern found in the kernel's name ("tile_128x64=5,simt=90"), else by 50.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
typedef void* CUmodule;
typedef void* CUstream;
typedef void (*EmuEntry)(const uint64_t*);
typedef void (*EmuLaunch)(EmuEntry, int, const unsigned*, const unsigned*, size_t, const uint64_t*);
typedef struct FakeFunction {
  char name[256];
  void* module;
  EmuEntry emu;
  int coop;
  double us; /* simulated time per launch (FAKE_CUDA_KERNEL_US), read once at the lookup */
  struct FakeFunction* next; /* the module's functions, freed when it unloads (as the driver's are) */
} FakeFunction;
typedef struct {
  int kind; /* 0 cubin (ELF), 1 PTX, 2 fatbin */
  size_t size;
  void* emu; /* dlopen handle of FAKE_CUDA_EMU */
  FakeFunction* functions;
} FakeModule;

enum { OK = 0, ERR_INVALID_VALUE = 1, ERR_NOT_FOUND = 500, ERR_INVALID_DEVICE = 101 };

static int g_context = 1; /* the one primary context */

static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_emu_lock = PTHREAD_MUTEX_INITIALIZER;

static void logf_(const char* fmt, ...) {
  const char* path = getenv("FAKE_CUDA_LOG");
  if (!path) return;
  pthread_mutex_lock(&g_log_lock);
  FILE* f = fopen(path, "a");
  if (f) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
  }
  pthread_mutex_unlock(&g_log_lock);
}

static int cc(void) {
  const char* e = getenv("FAKE_CUDA_CC");
  return e ? atoi(e) : 90;
}

static int devices(void) {
  const char* e = getenv("FAKE_CUDA_DEVICES");
  return e ? atoi(e) : 1;
}

CUresult cuDriverGetVersion(int* v) {
  *v = 13000;
  return OK;
}
CUresult cuInit(unsigned flags) {
  (void)flags;
  logf_("init");
  return devices() > 0 ? OK : 100; /* CUDA_ERROR_NO_DEVICE */
}
CUresult cuDeviceGetCount(int* n) {
  *n = devices();
  return OK;
}
CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (ordinal < 0 || ordinal >= devices()) return ERR_INVALID_DEVICE;
  *d = ordinal;
  return OK;
}
CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  snprintf(name, (size_t)len, "Fake GPU %d (sm_%d)", d, cc());
  return OK;
}
CUresult cuDeviceGetAttribute(int* v, int attrib, CUdevice d) {
  (void)d;
  switch (attrib) {
    case 75: *v = cc() / 10; break;  /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *v = cc() % 10; break;  /* COMPUTE_CAPABILITY_MINOR */
    case 16: *v = 132; break;        /* MULTIPROCESSOR_COUNT */
    case 1: *v = 1024; break;        /* MAX_THREADS_PER_BLOCK */
    case 8: *v = 49152; break;       /* MAX_SHARED_MEMORY_PER_BLOCK */
    case 97: *v = 232448; break;     /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    case 10: *v = 32; break;         /* WARP_SIZE */
    default: *v = 0;
  }
  return OK;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  logf_("ctx_retain %d", d);
  *c = &g_context;
  return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  logf_("ctx_release %d", d);
  return OK;
}
static CUcontext g_current = NULL;
CUresult cuCtxSetCurrent(CUcontext c) {
  g_current = c;
  return OK;
}
CUresult cuCtxGetCurrent(CUcontext* c) {
  *c = g_current;
  return OK;
}
CUresult cuCtxPushCurrent_v2(CUcontext c) { return cuCtxSetCurrent(c); }
CUresult cuCtxPopCurrent_v2(CUcontext* c) {
  if (c) *c = g_current;
  return OK;
}
CUresult cuCtxSynchronize(void) { return OK; }

static size_t elf_size(const unsigned char* p) {
  /* ELF64: the file ends with the section or the program header table, whichever is last */
  uint64_t shoff, phoff;
  uint16_t shentsize, shnum, phentsize, phnum;
  memcpy(&phoff, p + 0x20, 8);
  memcpy(&shoff, p + 0x28, 8);
  memcpy(&phentsize, p + 0x36, 2);
  memcpy(&phnum, p + 0x38, 2);
  memcpy(&shentsize, p + 0x3a, 2);
  memcpy(&shnum, p + 0x3c, 2);
  const uint64_t sh_end = shoff + (uint64_t)shentsize * shnum, ph_end = phoff + (uint64_t)phentsize * phnum;
  return (size_t)(sh_end > ph_end ? sh_end : ph_end);
}

static uint64_t fnv1a(const unsigned char* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* FAKE_CUDA_EMU_MAP's host build for an image of `size` bytes at `p`, else FAKE_CUDA_EMU */
static const char* emulation_for(const unsigned char* p, size_t size, char* buf, size_t cap) {
  const char* map = getenv("FAKE_CUDA_EMU_MAP");
  FILE* f = map && *map && size ? fopen(map, "r") : NULL;
  if (f) {
    char want[32];
    snprintf(want, sizeof want, "%016llx", (unsigned long long)fnv1a(p, size));
    while (fgets(buf, (int)cap, f)) {
      buf[strcspn(buf, "\n")] = 0;
      if (strncmp(buf, want, 16) == 0 && buf[16] == ' ') {
        fclose(f);
        return buf + 17;
      }
    }
    fclose(f);
  }
  return getenv("FAKE_CUDA_EMU");
}

CUresult cuModuleLoadData(CUmodule* m, const void* image) {
  const unsigned char* p = (const unsigned char*)image;
  FakeModule* mod = (FakeModule*)calloc(1, sizeof *mod);
  if (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F') {
    mod->kind = 0;
    mod->size = elf_size(p);
  } else if (p[0] == 0x50 && p[1] == 0xed && p[2] == 0x55 && p[3] == 0xba) {
    mod->kind = 2;
    mod->size = 0;
  } else {
    mod->kind = 1;
    mod->size = strlen((const char*)image);
  }
  logf_("module_load %s %zu", mod->kind == 0 ? "cubin" : mod->kind == 1 ? "ptx" : "fatbin", mod->size);
  char line[4096];
  const char* emu = emulation_for(p, mod->size, line, sizeof line);
  if (emu && *emu) {
    mod->emu = dlopen(emu, RTLD_NOW | RTLD_LOCAL);
    if (!mod->emu) {
      logf_("emu_open_failed %s", dlerror());
      free(mod);
      return 200; /* CUDA_ERROR_INVALID_IMAGE */
    }
  }
  *m = mod;
  return OK;
}
CUresult cuModuleUnload(CUmodule m) {
  logf_("module_unload");
  FakeModule* mod = (FakeModule*)m;
  if (mod->emu) dlclose(mod->emu);
  while (mod->functions) {
    FakeFunction* next = mod->functions->next;
    free(mod->functions);
    mod->functions = next;
  }
  free(m);
  return OK;
}
static double kernel_us(const char* name);
CUresult cuModuleGetFunction(void** f, CUmodule m, const char* name) {
  FakeModule* mod = (FakeModule*)m;
  FakeFunction* fn = (FakeFunction*)calloc(1, sizeof *fn);
  snprintf(fn->name, sizeof fn->name, "%s", name);
  fn->us = kernel_us(name);
  fn->module = m;
  if (mod->emu) {
    char sym[300];
    snprintf(sym, sizeof sym, "bpk_emu_%s", name);
    fn->emu = (EmuEntry)dlsym(mod->emu, sym);
    snprintf(sym, sizeof sym, "bpk_emu_coop_%s", name);
    const int* coop = (const int*)dlsym(mod->emu, sym);
    if ((!fn->emu || !coop) && strncmp(name, "bpk_gemm_", 9) == 0) {
      /* a CUTLASS GEMM: its launches are logged (grid, block, shared memory, Params bytes), not run */
      fn->emu = NULL;
      logf_("get_function %s no_emulation", name);
      fn->next = mod->functions;
      mod->functions = fn;
      *f = fn;
      return OK;
    }
    if (!fn->emu || !coop) {
      logf_("get_function %s not_found", name);
      free(fn);
      return ERR_NOT_FOUND;
    }
    fn->coop = *coop;
  }
  logf_("get_function %s", name);
  fn->next = mod->functions;
  mod->functions = fn;
  *f = fn;
  return OK;
}
CUresult cuFuncSetAttribute(void* f, int attrib, int value) {
  logf_("func_attribute %s %d %d", ((FakeFunction*)f)->name, attrib, value);
  return OK;
}

static double g_clock_us = 0.0;

static double kernel_us(const char* name) {
  const char* spec = getenv("FAKE_CUDA_KERNEL_US");
  char buf[1024];
  if (!spec || strlen(spec) >= sizeof buf) return 50.0;
  strcpy(buf, spec);
  for (char* item = strtok(buf, ","); item; item = strtok(NULL, ",")) {
    char* eq = strchr(item, '=');
    if (!eq) continue;
    *eq = '\0';
    if (strstr(name, item)) return atof(eq + 1);
  }
  return 50.0;
}

typedef struct {
  double at_us;
} FakeEvent;

CUresult cuEventCreate(void** e, unsigned flags) {
  (void)flags;
  *e = calloc(1, sizeof(FakeEvent));
  return OK;
}
CUresult cuEventRecord(void* e, CUstream s) {
  (void)s;
  ((FakeEvent*)e)->at_us = g_clock_us;
  return OK;
}
CUresult cuEventSynchronize(void* e) {
  (void)e;
  return OK;
}
CUresult cuEventElapsedTime(float* ms, void* start, void* end) {
  *ms = (float)((((FakeEvent*)end)->at_us - ((FakeEvent*)start)->at_us) / 1000.0);
  return OK;
}
CUresult cuEventDestroy_v2(void* e) {
  free(e);
  return OK;
}

/* -- stream capture and graphs (CUDA graphs): a capturing stream records launches, memsets,
 * device-to-device copies and host work (the fake cuBLAS's GEMMs) as nodes instead of running them;
 * a host synchronisation or a copy to or from host memory on it fails as the driver's does
 * (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); cuGraphLaunch replays the nodes in order, logging
 * "graph_launch" once and "graph_node NAME ..." per kernel node (never "launch"), so a test counts the
 * driver launches of a call. */
enum { ERR_CAPTURE_UNSUPPORTED = 900, ERR_CAPTURE_INVALIDATED = 901 };
typedef struct {
  int kind; /* 0 kernel, 1 memset, 2 device copy, 3 host function */
  FakeFunction* fn;
  unsigned grid[3], block[3], smem;
  unsigned char* params;
  size_t size;
  CUdeviceptr dst, src;
  unsigned char value;
  void (*host)(void*);
  void* data;
  void (*release)(void*);
} FakeNode;
typedef struct {
  int n, cap;
  FakeNode* nodes;
  int exec; /* an instantiated copy: the first takes over the host nodes' data from its graph */
} FakeGraph;
static pthread_mutex_t g_capture_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  CUstream stream;
  FakeGraph* graph;
  int invalid;
} g_captures[64];

/* the graph `stream` is capturing into, or NULL */
static int g_open_captures = 0; /* a quick "no stream is capturing" for every copy and launch */
static FakeGraph* capturing(CUstream stream, int** invalid) {
  FakeGraph* g = NULL;
  if (!__atomic_load_n(&g_open_captures, __ATOMIC_ACQUIRE)) return NULL;
  pthread_mutex_lock(&g_capture_lock);
  for (int i = 0; i < 64; ++i)
    if (g_captures[i].graph && g_captures[i].stream == stream) {
      g = g_captures[i].graph;
      if (invalid) *invalid = &g_captures[i].invalid;
    }
  pthread_mutex_unlock(&g_capture_lock);
  return g;
}
static FakeNode* add_node(FakeGraph* g) {
  if (g->n == g->cap) {
    g->cap = g->cap ? 2 * g->cap : 16;
    g->nodes = (FakeNode*)realloc(g->nodes, sizeof(FakeNode) * (size_t)g->cap);
  }
  FakeNode* node = &g->nodes[g->n++];
  memset(node, 0, sizeof *node);
  return node;
}
static CUresult refuse_in_capture(CUstream stream, const char* what) {
  int* invalid = NULL;
  if (!capturing(stream, &invalid)) return OK;
  *invalid = 1;
  logf_("capture_refused %s stream %llu", what, (unsigned long long)(uintptr_t)stream);
  return ERR_CAPTURE_UNSUPPORTED;
}

/* For the fake cuBLAS: run `host(data)` now, or record it as a node when `stream` is capturing
 * (`release(data)` when the graph goes). Returns 1 when recorded. */
int fake_cuda_host_work(CUstream stream, void (*host)(void*), void* data, void (*release)(void*)) {
  FakeGraph* g = capturing(stream, NULL);
  if (!g) return 0;
  FakeNode* node = add_node(g);
  node->kind = 3;
  node->host = host;
  node->data = data;
  node->release = release;
  logf_("capture_host stream %llu", (unsigned long long)(uintptr_t)stream);
  return 1;
}

static CUresult run_kernel(FakeFunction* fn, const unsigned grid[3], const unsigned block[3], unsigned smem,
                           const unsigned char* buf, size_t size) {
  g_clock_us += fn->us;
  if (!fn->emu) return OK;
  if (!buf || size % 8) return ERR_INVALID_VALUE;
  uint64_t* words = (uint64_t*)malloc(size + 8);
  memcpy(words, buf, size);
  EmuLaunch launch = (EmuLaunch)dlsym(((FakeModule*)fn->module)->emu, "bpk_emu_launch");
  pthread_mutex_lock(&g_emu_lock);
  launch(fn->emu, fn->coop, grid, block, smem, words);
  pthread_mutex_unlock(&g_emu_lock);
  free(words);
  return OK;
}

CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, CUstream stream, void** params, void** extra) {
  char hex[8192] = "";
  const unsigned char* buf = NULL;
  size_t size = 0;
  for (int i = 0; extra && extra[i] != NULL; i += 2) {
    if (extra[i] == (void*)1) buf = (const unsigned char*)extra[i + 1];
    if (extra[i] == (void*)2) size = *(size_t*)extra[i + 1];
  }
  for (size_t i = 0; buf && i < size && 2 * i + 2 < sizeof hex; ++i) snprintf(hex + 2 * i, 3, "%02x", buf[i]);
  FakeGraph* g = capturing(stream, NULL);
  logf_("%s %s grid %u %u %u block %u %u %u smem %u stream %llu params %s args %s", g ? "capture_launch" : "launch",
        ((FakeFunction*)f)->name, gx, gy, gz, bx, by, bz, smem, (unsigned long long)(uintptr_t)stream,
        params ? "array" : "none", hex[0] ? hex : "-");
  if (bx * by * bz > 1024 || gx == 0 || gy == 0 || gz == 0 || bx * by * bz == 0) return ERR_INVALID_VALUE;
  const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
  if (g) { /* the driver copies the parameters when the launch is recorded */
    FakeNode* node = add_node(g);
    node->kind = 0;
    node->fn = (FakeFunction*)f;
    memcpy(node->grid, grid, sizeof grid);
    memcpy(node->block, block, sizeof block);
    node->smem = smem;
    node->size = size;
    node->params = (unsigned char*)malloc(size + 8);
    if (buf) memcpy(node->params, buf, size);
    return OK;
  }
  return run_kernel((FakeFunction*)f, grid, block, smem, buf, size);
}

CUresult cuStreamBeginCapture_v2(CUstream stream, int mode) {
  logf_("capture_begin stream %llu mode %d", (unsigned long long)(uintptr_t)stream, mode);
  if (stream == NULL || capturing(stream, NULL)) return ERR_INVALID_VALUE; /* the legacy stream cannot capture */
  pthread_mutex_lock(&g_capture_lock);
  CUresult rc = ERR_INVALID_VALUE;
  for (int i = 0; i < 64; ++i)
    if (!g_captures[i].graph) {
      g_captures[i].stream = stream;
      g_captures[i].graph = (FakeGraph*)calloc(1, sizeof(FakeGraph));
      g_captures[i].invalid = 0;
      __atomic_add_fetch(&g_open_captures, 1, __ATOMIC_RELEASE);
      rc = OK;
      break;
    }
  pthread_mutex_unlock(&g_capture_lock);
  return rc;
}
static void free_graph(FakeGraph* g) {
  for (int i = 0; i < g->n; ++i) {
    free(g->nodes[i].params);
    if (g->nodes[i].release) g->nodes[i].release(g->nodes[i].data);
  }
  free(g->nodes);
  free(g);
}
CUresult cuStreamEndCapture(CUstream stream, void** graph) {
  FakeGraph* g = NULL;
  int invalid = 0;
  pthread_mutex_lock(&g_capture_lock);
  for (int i = 0; i < 64; ++i)
    if (g_captures[i].graph && g_captures[i].stream == stream) {
      g = g_captures[i].graph;
      invalid = g_captures[i].invalid;
      g_captures[i].graph = NULL;
      __atomic_sub_fetch(&g_open_captures, 1, __ATOMIC_RELEASE);
    }
  pthread_mutex_unlock(&g_capture_lock);
  if (!g) return ERR_INVALID_VALUE;
  logf_("capture_end stream %llu nodes %d%s", (unsigned long long)(uintptr_t)stream, g->n, invalid ? " invalidated" : "");
  if (invalid) {
    free_graph(g);
    *graph = NULL;
    return ERR_CAPTURE_INVALIDATED;
  }
  *graph = g;
  return OK;
}
CUresult cuStreamIsCapturing(CUstream stream, int* status) {
  *status = capturing(stream, NULL) ? 1 : 0; /* CU_STREAM_CAPTURE_STATUS_ACTIVE / NONE */
  return OK;
}
CUresult cuGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long flags) {
  (void)flags;
  FakeGraph* g = (FakeGraph*)graph;
  FakeGraph* e = (FakeGraph*)calloc(1, sizeof(FakeGraph));
  e->exec = 1;
  e->n = e->cap = g->n;
  e->nodes = (FakeNode*)calloc((size_t)(g->n ? g->n : 1), sizeof(FakeNode));
  for (int i = 0; i < g->n; ++i) {
    e->nodes[i] = g->nodes[i];
    g->nodes[i].release = NULL; /* the exec frees it (graphs are destroyed once instantiated) */
    if (g->nodes[i].params) {
      e->nodes[i].params = (unsigned char*)malloc(g->nodes[i].size + 8);
      memcpy(e->nodes[i].params, g->nodes[i].params, g->nodes[i].size);
    }
  }
  logf_("graph_instantiate nodes %d", g->n);
  *exec = e;
  return OK;
}
CUresult cuGraphLaunch(void* exec, CUstream stream) {
  const FakeGraph* e = (const FakeGraph*)exec;
  logf_("graph_launch nodes %d stream %llu", e->n, (unsigned long long)(uintptr_t)stream);
  if (capturing(stream, NULL)) return ERR_CAPTURE_UNSUPPORTED;
  for (int i = 0; i < e->n; ++i) {
    const FakeNode* node = &e->nodes[i];
    switch (node->kind) {
      case 0:
        logf_("graph_node %s grid %u %u %u block %u %u %u smem %u", node->fn->name, node->grid[0], node->grid[1],
              node->grid[2], node->block[0], node->block[1], node->block[2], node->smem);
        if (run_kernel(node->fn, node->grid, node->block, node->smem, node->params, node->size)) return ERR_INVALID_VALUE;
        break;
      case 1: memset((void*)(uintptr_t)node->dst, node->value, node->size); break;
      case 2: memmove((void*)(uintptr_t)node->dst, (const void*)(uintptr_t)node->src, node->size); break;
      case 3: node->host(node->data); break;
    }
  }
  return OK;
}
CUresult cuGraphDestroy(void* graph) {
  free_graph((FakeGraph*)graph);
  return OK;
}
CUresult cuGraphExecDestroy(void* exec) {
  logf_("graph_exec_destroy");
  free_graph((FakeGraph*)exec);
  return OK;
}

/* cuLaunchKernelEx's config and attribute (cuda.h layout): a cluster dimension (attribute 4) is logged and
 * must divide the grid, as the driver requires; the launch itself goes through cuLaunchKernel. */
typedef struct {
  int id;
  char pad[4];
  unsigned value[16];
} FakeLaunchAttribute;
typedef struct {
  unsigned gx, gy, gz, bx, by, bz, smem;
  CUstream stream;
  FakeLaunchAttribute* attrs;
  unsigned num_attrs;
} FakeLaunchConfig;

CUresult cuLaunchKernelEx(const FakeLaunchConfig* c, void* f, void** params, void** extra) {
  unsigned cluster[3] = {1, 1, 1};
  for (unsigned i = 0; i < c->num_attrs; ++i) {
    if (c->attrs[i].id == 4) memcpy(cluster, c->attrs[i].value, sizeof cluster);
  }
  logf_("launch_ex %s cluster %u %u %u", ((FakeFunction*)f)->name, cluster[0], cluster[1], cluster[2]);
  if (!cluster[0] || !cluster[1] || !cluster[2] || c->gx % cluster[0] || c->gy % cluster[1] || c->gz % cluster[2] ||
      cluster[0] * cluster[1] * cluster[2] > 8)
    return ERR_INVALID_VALUE;
  return cuLaunchKernel(f, c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->smem, c->stream, params, extra);
}

/* A TMA descriptor: logged (data type, rank, address, dims, byte strides, box, swizzle) and checked as the
 * driver documents (rank 1..5, 16-byte-aligned address, strides multiples of 16 below 2^40 and not zero
 * here, box sides 1..256); the 128 bytes are filled with a pattern. */
CUresult cuTensorMapEncodeTiled(void* map, int type, unsigned rank, void* address, const uint64_t* dims,
                                const uint64_t* strides, const unsigned* box, const unsigned* element_strides,
                                int interleave, int swizzle, int l2, int fill) {
  (void)element_strides;
  (void)interleave;
  (void)l2;
  (void)fill;
  char text[512];
  int at = snprintf(text, sizeof text, "tensor_map type %d rank %u addr %llu dims", type, rank,
                    (unsigned long long)(uintptr_t)address);
  int ok = rank >= 1 && rank <= 5 && (uintptr_t)address % 16 == 0;
  for (unsigned i = 0; i < rank && i < 5; ++i) {
    at += snprintf(text + at, sizeof text - at, " %llu", (unsigned long long)dims[i]);
    ok = ok && dims[i] >= 1;
  }
  at += snprintf(text + at, sizeof text - at, " strides");
  for (unsigned i = 0; i + 1 < rank && i < 4; ++i) {
    at += snprintf(text + at, sizeof text - at, " %llu", (unsigned long long)strides[i]);
    ok = ok && strides[i] % 16 == 0 && strides[i] > 0 && strides[i] < (1ull << 40);
  }
  at += snprintf(text + at, sizeof text - at, " box");
  for (unsigned i = 0; i < rank && i < 5; ++i) {
    at += snprintf(text + at, sizeof text - at, " %u", box[i]);
    ok = ok && box[i] >= 1 && box[i] <= 256;
  }
  snprintf(text + at, sizeof text - at, " swizzle %d", swizzle);
  logf_("%s", text);
  memset(map, 0x5A, 128);
  return ok ? OK : ERR_INVALID_VALUE;
}

CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
  void* m = aligned_alloc(256, (n + 255) / 256 * 256);
  if (!m) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
  *p = (CUdeviceptr)(uintptr_t)m;
  logf_("mem_alloc %zu", n);
  return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  free((void*)(uintptr_t)p);
  logf_("mem_free");
  return OK;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void* s, size_t n) {
  memcpy((void*)(uintptr_t)d, s, n);
  logf_("copy_htod %zu", n);
  return OK;
}
CUresult cuMemcpyDtoH_v2(void* d, CUdeviceptr s, size_t n) {
  memcpy(d, (const void*)(uintptr_t)s, n);
  logf_("copy_dtoh %zu", n);
  return OK;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* s, size_t n, CUstream st) {
  if (refuse_in_capture(st, "copy_htod")) return ERR_CAPTURE_UNSUPPORTED;
  return cuMemcpyHtoD_v2(d, s, n);
}
/* Page-locked host memory (cuMemHostAlloc): a copy into it may be captured, as the driver allows for
 * pinned memory and refuses for pageable; the allocations are remembered to tell them apart. */
static pthread_mutex_t g_pinned_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  char* at;
  size_t n;
} g_pinned[256];
static int pinned(const void* p, size_t n) {
  int found = 0;
  pthread_mutex_lock(&g_pinned_lock);
  for (int i = 0; i < 256; ++i)
    if (g_pinned[i].at && (const char*)p >= g_pinned[i].at && (const char*)p + n <= g_pinned[i].at + g_pinned[i].n)
      found = 1;
  pthread_mutex_unlock(&g_pinned_lock);
  return found;
}
CUresult cuMemHostAlloc(void** p, size_t n, unsigned flags) {
  (void)flags;
  *p = aligned_alloc(256, (n + 255) / 256 * 256);
  if (!*p) return 2;
  CUresult rc = 2;
  pthread_mutex_lock(&g_pinned_lock);
  for (int i = 0; i < 256; ++i)
    if (!g_pinned[i].at) {
      g_pinned[i].at = (char*)*p;
      g_pinned[i].n = n;
      rc = OK;
      break;
    }
  pthread_mutex_unlock(&g_pinned_lock);
  logf_("host_alloc %zu", n);
  return rc;
}
CUresult cuMemFreeHost(void* p) {
  pthread_mutex_lock(&g_pinned_lock);
  for (int i = 0; i < 256; ++i)
    if (g_pinned[i].at == (char*)p) g_pinned[i].at = NULL;
  pthread_mutex_unlock(&g_pinned_lock);
  free(p);
  logf_("host_free");
  return OK;
}
CUresult cuMemcpyDtoHAsync_v2(void* d, CUdeviceptr s, size_t n, CUstream st) {
  FakeGraph* g = capturing(st, NULL);
  if (g && pinned(d, n)) {
    logf_("capture_dtoh_pinned %zu", n);
    FakeNode* node = add_node(g);
    node->kind = 2;
    node->dst = (CUdeviceptr)(uintptr_t)d;
    node->src = s;
    node->size = n;
    return OK;
  }
  if (refuse_in_capture(st, "copy_dtoh")) return ERR_CAPTURE_UNSUPPORTED;
  return cuMemcpyDtoH_v2(d, s, n);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
  FakeGraph* g = capturing(st, NULL);
  logf_("%s %zu", g ? "capture_dtod" : "copy_dtod", n);
  if (g) {
    FakeNode* node = add_node(g);
    node->kind = 2;
    node->dst = d;
    node->src = s;
    node->size = n;
    return OK;
  }
  memmove((void*)(uintptr_t)d, (const void*)(uintptr_t)s, n);
  return OK;
}
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
  memset((void*)(uintptr_t)d, v, n);
  return OK;
}
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream st) {
  FakeGraph* g = capturing(st, NULL);
  if (g) {
    FakeNode* node = add_node(g);
    node->kind = 1;
    node->dst = d;
    node->value = v;
    node->size = n;
    return OK;
  }
  return cuMemsetD8_v2(d, v, n);
}
CUresult cuStreamCreate(CUstream* s, unsigned flags) {
  (void)flags;
  static int streams = 0;
  *s = (CUstream)(uintptr_t)(0x1000 + __atomic_add_fetch(&streams, 1, __ATOMIC_RELAXED));
  return OK;
}
CUresult cuStreamWaitEvent(CUstream s, void* e, unsigned flags) {
  (void)e;
  (void)flags;
  logf_("stream_wait_event %llu", (unsigned long long)(uintptr_t)s);
  return OK;
}
CUresult cuStreamDestroy_v2(CUstream s) {
  (void)s;
  return OK;
}
CUresult cuStreamSynchronize(CUstream s) {
  logf_("stream_sync %llu", (unsigned long long)(uintptr_t)s);
  return refuse_in_capture(s, "stream_sync");
}
CUresult cuGetErrorName(CUresult e, const char** s) {
  *s = e == OK                        ? "CUDA_SUCCESS"
       : e == ERR_INVALID_VALUE         ? "CUDA_ERROR_INVALID_VALUE"
       : e == ERR_CAPTURE_UNSUPPORTED   ? "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
       : e == ERR_CAPTURE_INVALIDATED   ? "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"
                                        : "CUDA_ERROR_UNKNOWN";
  return OK;
}
CUresult cuGetErrorString(CUresult e, const char** s) {
  *s = e == OK ? "no error" : e == ERR_INVALID_VALUE ? "invalid argument" : "unknown error";
  return OK;
}

struct Entry {
  const char* name;
  void* fn;
};
CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, unsigned long long flags, int* status);
#define E(n, f) {n, (void*)&f}
static const struct Entry kEntries[] = {
    E("cuDriverGetVersion", cuDriverGetVersion), E("cuInit", cuInit), E("cuDeviceGetCount", cuDeviceGetCount),
    E("cuDeviceGet", cuDeviceGet), E("cuDeviceGetName", cuDeviceGetName),
    E("cuDeviceGetAttribute", cuDeviceGetAttribute), E("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain),
    E("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2), E("cuCtxSetCurrent", cuCtxSetCurrent),
    E("cuCtxGetCurrent", cuCtxGetCurrent), E("cuCtxPushCurrent", cuCtxPushCurrent_v2),
    E("cuCtxPopCurrent", cuCtxPopCurrent_v2), E("cuCtxSynchronize", cuCtxSynchronize),
    E("cuModuleLoadData", cuModuleLoadData), E("cuModuleUnload", cuModuleUnload),
    E("cuModuleGetFunction", cuModuleGetFunction), E("cuFuncSetAttribute", cuFuncSetAttribute),
    E("cuLaunchKernel", cuLaunchKernel), E("cuLaunchKernelEx", cuLaunchKernelEx),
    E("cuTensorMapEncodeTiled", cuTensorMapEncodeTiled), E("cuMemAlloc", cuMemAlloc_v2), E("cuMemFree", cuMemFree_v2),
    E("cuMemcpyHtoD", cuMemcpyHtoD_v2), E("cuMemcpyDtoH", cuMemcpyDtoH_v2),
    E("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2), E("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2),
    E("cuMemcpyDtoDAsync", cuMemcpyDtoDAsync_v2), E("cuMemHostAlloc", cuMemHostAlloc), E("cuMemFreeHost", cuMemFreeHost),
    E("cuMemsetD8", cuMemsetD8_v2), E("cuMemsetD8Async", cuMemsetD8Async), E("cuStreamCreate", cuStreamCreate),
    E("cuStreamDestroy", cuStreamDestroy_v2), E("cuStreamWaitEvent", cuStreamWaitEvent), E("cuStreamSynchronize", cuStreamSynchronize),
    E("cuGetErrorName", cuGetErrorName), E("cuGetErrorString", cuGetErrorString),
    E("cuEventCreate", cuEventCreate), E("cuEventRecord", cuEventRecord), E("cuEventSynchronize", cuEventSynchronize),
    E("cuEventElapsedTime", cuEventElapsedTime), E("cuEventDestroy", cuEventDestroy_v2),
    E("cuGetProcAddress", cuGetProcAddress_v2), E("cuStreamBeginCapture", cuStreamBeginCapture_v2),
    E("cuStreamEndCapture", cuStreamEndCapture), E("cuStreamIsCapturing", cuStreamIsCapturing),
    E("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags), E("cuGraphInstantiate", cuGraphInstantiateWithFlags),
    E("cuGraphLaunch", cuGraphLaunch), E("cuGraphDestroy", cuGraphDestroy), E("cuGraphExecDestroy", cuGraphExecDestroy),
};

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, unsigned long long flags, int* status) {
  (void)version;
  (void)flags;
  for (size_t i = 0; i < sizeof kEntries / sizeof kEntries[0]; ++i) {
    if (strcmp(symbol, kEntries[i].name) == 0) {
      *pfn = kEntries[i].fn;
      if (status) *status = 0; /* CU_GET_PROC_ADDRESS_SUCCESS */
      return OK;
    }
  }
  *pfn = NULL;
  if (status) *status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
  return ERR_NOT_FOUND;
}
CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, unsigned long long flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
