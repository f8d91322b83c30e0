// The optimizers of optimizer.h on device buffers, over NCCL: the one
// schedule of optimizer.cc over a backend (backend.h) whose m, v, x_prev, u
// and scratch buffers are device memory, whose element-wise work is
// update_kernels.cu (bit-identical to the CPU kernels), and whose collectives
// are NCCL on the step's stream:
//
//   full-precision average: an NCCL allreduce (sum), then / n on the device (the
//     host collectives' avg);
//   compressed average:     coll::device::compressedAllReduce
//     (DeviceCompressedState), residual indices saved and restored on the
//     device for the rollback of a skipped step;
//   refusal:                a step that communicates opens with an
//     allgather of one status word per rank, which the host reads, so a
//     rank refusing its step fails its peers' step at once (NCCL has no abort
//     notice to carry it).
//
// A step waits for its stream once for the status words (when it
// communicates) and once for each skip decision (a kernel flags non-finite
// values, the host reads the flag), because both decide host state: the step
// count, the Adam update count that the next step's bias correction uses,
// skippedSteps. So a step cannot be captured in a CUDA graph. State save/load
// stages through host memory into the blob of state_blob.h, the same format
// the host optimizer writes.
#pragma once

#include <cstddef>
#include <memory>

#include "src/common/status.h"
#include "src/optim/optimizer.h"
#include "src/transport/nccl/device_comm.h"

namespace squall::optim::cuda {

// An optimizer over device memory, stepped with Optimizer::stepOnStream
// (device pointers, a cudaStream_t), over a copy of `comm` (its ncclComm_t
// must outlive the optimizer).
Status createDeviceOptimizer(const transport::nccl::DeviceComm& comm, size_t count,
                             const Config& config, std::unique_ptr<Optimizer>* out);

}  // namespace squall::optim::cuda
