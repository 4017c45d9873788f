// Triton's datatypes and the runtime's (BPK_*), both ways.
#pragma once

#include <bladepack/runtime.h>

#include "triton_abi.h"

namespace bpk_triton {

inline int triton_to_bpk(TRITONSERVER_DataType t) {
  switch (t) {
    case TRITONSERVER_TYPE_BOOL: return BPK_BOOL;
    case TRITONSERVER_TYPE_UINT8: return BPK_UINT8;
    case TRITONSERVER_TYPE_INT8: return BPK_INT8;
    case TRITONSERVER_TYPE_INT16: return BPK_INT16;
    case TRITONSERVER_TYPE_INT32: return BPK_INT32;
    case TRITONSERVER_TYPE_INT64: return BPK_INT64;
    case TRITONSERVER_TYPE_FP16: return BPK_FLOAT16;
    case TRITONSERVER_TYPE_FP32: return BPK_FLOAT32;
    case TRITONSERVER_TYPE_FP64: return BPK_FLOAT64;
    case TRITONSERVER_TYPE_BF16: return BPK_BFLOAT16;
    default: return -1;
  }
}

inline TRITONSERVER_DataType bpk_to_triton(int32_t d) {
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
    case BPK_BFLOAT16: return TRITONSERVER_TYPE_BF16;
    default: return TRITONSERVER_TYPE_INVALID;
  }
}

}  // namespace bpk_triton
