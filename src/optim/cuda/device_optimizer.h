// The optimizers of optimizer.h on device buffers, over NCCL: the same state
// machine, step for step, with m, v, x_prev and u in device memory and the
// element-wise work in update_kernels.cu (bit-identical to the CPU kernels).
//
//   warmup / sync Adam: an NCCL allreduce (sum) of the gradient, then / n on the
//     device (the host path's allreduce avg);
//   compressed stage:   the momentum through coll::device::compressedAllReduce
//     (DeviceCompressedState), residuals rolled back on a non-finite result;
//   SlowMo:             NCCL allreduce (sum) / n of the parameters, or the
//     compressed drift x - x_prev, then the SlowMo kernel.
//
// Every step is enqueued on the caller's stream, and waits for it once: the
// skip decision for non-finite values reads a device flag on the host (one
// cudaStreamSynchronize per step; two on SlowMo synchronisation steps), so a
// step cannot be captured in a CUDA graph. Nothing else waits for the host.
// State save/load stages through host memory into the blob of state_blob.h,
// the same format the host optimizer writes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "src/coll/device/device_allreduce.h"
#include "src/common/status.h"
#include "src/optim/optimizer.h"
#include "src/transport/nccl/device_comm.h"

namespace squall::optim::cuda {

class DeviceOptimizer {
 public:
  // Steps over `comm` (its ncclComm_t must outlive this).
  static Status create(const transport::nccl::DeviceComm& comm, size_t count, const Config& config,
                       std::unique_ptr<DeviceOptimizer>* out);
  ~DeviceOptimizer();
  DeviceOptimizer(const DeviceOptimizer&) = delete;
  DeviceOptimizer& operator=(const DeviceOptimizer&) = delete;

  // One step on device buffers; lr > 0 overrides the configured rate. Returns
  // after `stream` has finished the step's skip decision (see above).
  Status step(float* dParams, const float* dGrads, float lr, cudaStream_t stream);

  Info info() const;
  size_t count() const { return count_; }
  const Config& config() const { return config_; }

  // Waits for the last stream a step used.
  size_t stateSize() const;
  Status saveState(void* buffer, size_t capacity, size_t* written);
  Status loadState(const void* buffer, size_t bytes);

 private:
  DeviceOptimizer() = default;
  Status adamStep(float* x, const float* g, float lr, bool allReduce, cudaStream_t s);
  Status compressedStep(float* x, const float* g, float lr, cudaStream_t s);
  Status slowmoSync(float* x, float lr, cudaStream_t s);
  Status fullAverage(const float* in, float* out, cudaStream_t s);
  Status compressedAverage(coll::device::DeviceCompressedState* state, float* buffer, bool* finite,
                           cudaStream_t s);
  Status readFlag(const float* data, bool* finite, cudaStream_t s);
  Status switchToCompressed(cudaStream_t s);
  Status stageResidual(const codec::DeviceResidual* r, size_t n, std::vector<float>* out);
  Status restoreResidual(const codec::DeviceResidual* r, const float* data, size_t n);

  transport::nccl::DeviceComm comm_;
  int nranks_ = 1;
  int rank_ = 0;
  size_t count_ = 0;
  Config config_;
  int64_t warmupSteps_ = 0;
  int64_t step_ = 0;
  int64_t adamSteps_ = 0;
  Phase phase_ = Phase::kWarmup;
  uint64_t bytesSent_ = 0;
  uint64_t skipped_ = 0;
  cudaStream_t lastStream_ = nullptr;

  float* m_ = nullptr;  // device buffers of count_ floats
  float* v_ = nullptr;
  float* scratch_ = nullptr;
  float* xPrev_ = nullptr;
  float* u_ = nullptr;
  float* xAvg_ = nullptr;
  int* flag_ = nullptr;  // [0] non-finite flag, [1..4] saved residual indices
  std::unique_ptr<coll::device::DeviceCompressedState> momentum_, slowmoState_;
};

}  // namespace squall::optim::cuda
