// The CUDA devices of this machine, and the check that pointers handed to a CUDA plan are memory
// its device can use, before anything runs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>

#include "block/exec.h"

namespace lnmlp::cuda {

using block::NamedPointer;  // NULL entries are skipped (the core has checked which may be NULL)

// Number of CUDA devices; throws NOT_SUPPORTED (naming the CUDA error) when there is no usable
// driver or no device.
int device_count();

// Fails with LNMLP_ERROR_INVALID_ARGUMENT for a stream that is not one of `device` (the plan's
// device must be current: NULL is its default stream), naming the stream's device; without this
// check, work enqueued on it fails late with "invalid resource handle".
void check_stream(cudaStream_t stream, int device);

// check_stream, then fails with LNMLP_ERROR_MISALIGNED for a pointer not aligned to `alignment`
// bytes, and with LNMLP_ERROR_INVALID_ARGUMENT for plain host memory or memory of another device
// (detected with cudaPointerGetAttributes; that query is skipped while `stream` is being captured
// into a graph).
void check_device_pointers(std::initializer_list<NamedPointer> list, int device, int64_t alignment,
                           cudaStream_t stream);

}  // namespace lnmlp::cuda
