// What every CUDA source of the library shares (the CUDA codec, the device
// allreduce, the device optimizer, core's NCCL engine): a CUDA error as a
// Status, and the kernel launch (through a function, so that the CPU emulation
// in tests/gpu/emu, which defines its own launchKernel, can run the same code).
// Header only, and included only by sources built with CUDA: the common
// library itself never needs the CUDA runtime.
#pragma once

#include <cuda_runtime_api.h>

#include "src/common/status.h"

namespace squall {

// kOk for cudaSuccess; otherwise the failure, logged and naming `what`
// (kOutOfMemory for a failed allocation, kSystemError for anything else).
inline Status cudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::kOk;
  return SQUALL_FAIL(err == cudaErrorMemoryAllocation ? Status::kOutOfMemory : Status::kSystemError,
                     Subsys::kCuda, "%s failed: %s (%s)", what, cudaGetErrorName(err),
                     cudaGetErrorString(err));
}

}  // namespace squall

// Returns from the calling function when the CUDA call `expr` fails.
#define SQUALL_CUDA_TRY(expr) SQUALL_TRY(::squall::cudaStatus((expr), #expr))

#if defined(__CUDACC__) && !defined(SQUALL_CUDA_EMULATION)
template <typename... Params, typename... Args>
void launchKernel(void (*kernel)(Params...), unsigned grid, unsigned threads, cudaStream_t stream,
                  Args... args) {
  kernel<<<grid, threads, 0, stream>>>(args...);
}
#endif
