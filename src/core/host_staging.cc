// Device buffers on a host engine (built with CUDA and NCCL): copied through
// host memory around the host algorithms. Each call waits for the stream
// twice, so it cannot be captured in a CUDA graph; the NCCL engine is the
// stream-ordered path.
#include <cuda_runtime_api.h>

#include <vector>

#include "src/common/cuda_status.h"
#include "src/core/engine.h"

namespace squall::core {
namespace {

// Pinned buffers of a compressor, grown to the largest call so far.
class PinnedStaging final : public Staging {
 public:
  ~PinnedStaging() override {
    cudaFreeHost(in_);
    cudaFreeHost(out_);
  }
  Status reserve(size_t need) {
    if (need <= bytes_) return Status::kOk;
    cudaFreeHost(in_);
    cudaFreeHost(out_);
    in_ = out_ = nullptr;
    bytes_ = 0;
    SQUALL_CUDA_TRY(cudaMallocHost(&in_, need));
    SQUALL_CUDA_TRY(cudaMallocHost(&out_, need));
    bytes_ = need;
    return Status::kOk;
  }
  void* in() const { return in_; }
  void* out() const { return out_; }

 private:
  void* in_ = nullptr;
  void* out_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace

Status stagedCompressedAllReduce(coll::Communicator& comm, coll::CompressedState& state,
                                 std::unique_ptr<Staging>* staging, const void* in, void* out,
                                 DataType dtype, ReduceOp op, void* cudaStream) {
  auto stream = static_cast<cudaStream_t>(cudaStream);
  const size_t bytes = state.count() * dataTypeSize(dtype);
  if (*staging == nullptr) *staging = std::make_unique<PinnedStaging>();
  auto* pinned = static_cast<PinnedStaging*>(staging->get());
  SQUALL_TRY(pinned->reserve(bytes));
  if (bytes != 0) {
    SQUALL_CUDA_TRY(cudaMemcpyAsync(pinned->in(), in, bytes, cudaMemcpyDefault, stream));
    SQUALL_CUDA_TRY(cudaStreamSynchronize(stream));
  }
  SQUALL_TRY(comm.compressedAllReduce(pinned->in(), pinned->out(), dtype, op, &state));
  if (bytes != 0) {
    SQUALL_CUDA_TRY(cudaMemcpyAsync(out, pinned->out(), bytes, cudaMemcpyDefault, stream));
    SQUALL_CUDA_TRY(cudaStreamSynchronize(stream));
  }
  return Status::kOk;
}

// Copy in, wait, step on the host, copy back, wait. Two pageable copies and
// two stream synchronisations per step.
Status stagedOptimizerStep(optim::Optimizer& o, float* params, const float* grads, float lr,
                           void* cudaStream) {
  const size_t n = o.count();
  auto s = static_cast<cudaStream_t>(cudaStream);
  std::vector<float> x(n), g(n);
  if (n != 0) {
    SQUALL_CUDA_TRY(
        cudaMemcpyAsync(x.data(), params, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    SQUALL_CUDA_TRY(cudaMemcpyAsync(g.data(), grads, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    SQUALL_CUDA_TRY(cudaStreamSynchronize(s));
  }
  SQUALL_TRY(o.step(x.data(), g.data(), lr));
  if (n != 0) {
    SQUALL_CUDA_TRY(
        cudaMemcpyAsync(params, x.data(), n * sizeof(float), cudaMemcpyHostToDevice, s));
    SQUALL_CUDA_TRY(cudaStreamSynchronize(s));
  }
  return Status::kOk;
}

}  // namespace squall::core
