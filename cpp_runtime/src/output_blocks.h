// Host memory for the outputs the runtime allocates (bpk_model_run with data NULL, DLPack results).
//
// In: a byte count. Out: kAlign-aligned memory that bpk_free (release_output) gives back. Note
// [Output blocks]: a decode loop's outputs (the KV cache, one token longer each call) grow a little
// on every call, and a caller frees each call's outputs before the next. Given back to malloc, each
// freed block was split by the next call's small allocations (its prepared signature, its launch
// words) before the next outputs, a few bytes larger, were asked for, so the heap grew by the
// outputs' size per call: the LLaMA sample's step at batch 16 reached 600 MB of resident memory after
// 800 steps, every call's outputs on fresh pages. Blocks of at least 64 KiB are therefore sized by
// class (alloc_size: eight steps per power of two) and kept when freed — at most kKeepBlocks of them and
// kKeepBytes in all, the oldest let go first — for the next output of the same class. The cache is
// the process's, as malloc's is: a block may be freed after its model (bpk_free of a DLPack result
// after bpk_model_free).
#pragma once

#include <cstddef>

namespace bpk {

constexpr size_t kKeepBlocks = 32;
constexpr size_t kKeepBytes = size_t(256) << 20;

// kAlign-aligned memory for at least one byte, or null; release it with release_output.
void* alloc_output(size_t bytes);
// Gives back what alloc_output returned (a kept block or free); null is ignored. Any other pointer of
// the malloc family is freed.
void release_output(void* p);

}  // namespace bpk
