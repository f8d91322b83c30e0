// Device buffers on a host engine (built with CUDA and NCCL): copied through
// host memory around the host algorithms. Each call waits for the stream
// twice, so it cannot be captured in a CUDA graph; the NCCL engine is the
// stream-ordered path.
#include <cuda_runtime_api.h>

#include <algorithm>
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

// Copies inBytes of `in` into the pinned input, waits, runs `collective` on
// the pinned buffers, copies outBytes of the pinned output to `out`, waits.
template <typename Collective>
Status staged(std::unique_ptr<Staging>* staging, const void* in, size_t inBytes, void* out,
              size_t outBytes, cudaStream_t stream, Collective collective) {
  if (*staging == nullptr) *staging = std::make_unique<PinnedStaging>();
  auto* pinned = static_cast<PinnedStaging*>(staging->get());
  SQUALL_TRY(pinned->reserve(std::max(inBytes, outBytes)));
  if (inBytes != 0) {
    SQUALL_CUDA_TRY(cudaMemcpyAsync(pinned->in(), in, inBytes, cudaMemcpyDefault, stream));
    SQUALL_CUDA_TRY(cudaStreamSynchronize(stream));
  }
  SQUALL_TRY(collective(pinned->in(), pinned->out()));
  if (outBytes != 0) {
    SQUALL_CUDA_TRY(cudaMemcpyAsync(out, pinned->out(), outBytes, cudaMemcpyDefault, stream));
    SQUALL_CUDA_TRY(cudaStreamSynchronize(stream));
  }
  return Status::kOk;
}

}  // namespace

Status stagedCall(std::unique_ptr<Staging>* staging, const void* in, size_t inBytes, void* out,
                  size_t outBytes, void* cudaStream,
                  const std::function<Status(const void*, void*)>& run) {
  return staged(staging, in, inBytes, out, outBytes, static_cast<cudaStream_t>(cudaStream), run);
}

Status stagedCompressedAllReduce(coll::Communicator& comm, coll::CompressedState& state,
                                 std::unique_ptr<Staging>* staging, const void* in, void* out,
                                 DataType dtype, ReduceOp op, void* cudaStream) {
  const size_t bytes = state.count() * dataTypeSize(dtype);
  return staged(staging, in, bytes, out, bytes, static_cast<cudaStream_t>(cudaStream),
                [&](const void* pinnedIn, void* pinnedOut) {
                  return comm.compressedAllReduce(pinnedIn, pinnedOut, dtype, op, &state);
                });
}

// The pinned output is a buffer of its own (never the input's piece), so
// the device's in-place call is out of place here.
Status stagedCompressedReduceScatter(coll::Communicator& comm, coll::CompressedState& state,
                                     std::unique_ptr<Staging>* staging, const void* in, void* out,
                                     DataType dtype, ReduceOp op, void* cudaStream) {
  const size_t esize = dataTypeSize(dtype);
  return staged(staging, in, state.count() * esize, out, state.chunk() * esize,
                static_cast<cudaStream_t>(cudaStream), [&](const void* pinnedIn, void* pinnedOut) {
                  return comm.compressedReduceScatter(pinnedIn, pinnedOut, state.chunk(), dtype, op,
                                                      &state);
                });
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
