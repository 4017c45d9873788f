// bpk_model_run_dlpack: DLPack tensors in and out of a model (include/bladepack/runtime.h).
//
// In: borrowed DLTensors (host, or the CUDA model's device), optional caller output tensors, the
// caller's stream. Out: the model run with each tensor where it lives (Model::Placement), and for each
// output the caller left NULL a DLManagedTensorVersioned the runtime allocated on the model's device,
// whose deleter frees it and may run after the model is freed (it owns the driver and the device's
// primary context through NativeCuda::alloc_owned). Errors name the tensor and what is allowed, as the
// Python loader's DLPack import does: its device, a stride that is not row-major, a dtype with no
// bpk_dtype.
#pragma once

#include <cstdint>

#include "bladepack/runtime.h"
#include "model.h"

namespace bpk {

void run_dlpack(const Model& model, const DLTensor* const* inputs, int64_t num_inputs,
                DLManagedTensorVersioned** outputs, int64_t num_outputs, const bpk_run_options* options);

}  // namespace bpk
