// The NCCL engine (built with CUDA and NCCL): a borrowed ncclComm_t behind
// transport::nccl::DeviceComm, compressors holding the device compressed
// state (src/coll/device), and optimizers whose backend is device memory
// over the same DeviceComm (src/optim/cuda). It runs only stream-ordered operations on device
// buffers; Comm refuses the host collectives before they get here.
#include <cuda_runtime_api.h>

#include <memory>
#include <utility>

#include "src/coll/device/device_allreduce.h"
#include "src/common/cuda_status.h"
#include "src/core/engine.h"
#include "src/optim/cuda/device_optimizer.h"
#include "src/transport/nccl/device_comm.h"

namespace squall::core {
namespace {

using transport::nccl::DeviceComm;

class DeviceCompressor final : public Compressor {
 public:
  DeviceCompressor(const Comm* comm, size_t count, const codec::Spec& spec,
                   std::unique_ptr<coll::device::DeviceCompressedState> state)
      : Compressor(comm, count, spec), state_(std::move(state)) {}

  Status reset() override {
    SQUALL_TRY(state_->reset(lastStream_));
    SQUALL_CUDA_TRY(cudaStreamSynchronize(lastStream_));
    return Status::kOk;
  }
  Status stats(CompressorStats* out) override {
    CompressorStats s;
    s.calls = calls_;
    if (state_->worker() != nullptr) {  // waits for the last stream used
      int current = 0;
      unsigned long long skipped = 0;
      SQUALL_TRY(codec::cudaResidualQuery(*state_->worker(), lastStream_, &current, &skipped));
      s.skippedCalls = skipped;
    }
    s.bytesSent = calls_ != 0 ? state_->bytesSent() : 0;
    s.bytesReceived = calls_ != 0 ? state_->bytesReceived() : 0;
    s.algorithm = calls_ != 0 ? "twophase" : "none";  // the device path is always flat
    s.sliceCount = count();
    *out = s;
    return Status::kOk;
  }

  Status run(const DeviceComm& comm, const void* in, void* out, DataType dtype, ReduceOp op,
             cudaStream_t stream) {
    SQUALL_TRY(coll::device::compressedAllReduce(comm, stream, in, out, dtype, op, state_.get()));
    lastStream_ = stream;
    ++calls_;
    return Status::kOk;
  }

 private:
  std::unique_ptr<coll::device::DeviceCompressedState> state_;
  cudaStream_t lastStream_ = nullptr;  // for reset and stats
  uint64_t calls_ = 0;
};

class NcclEngine final : public Engine {
 public:
  explicit NcclEngine(const DeviceComm& comm) : comm_(comm) {}

  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  const char* transportName() const override { return "nccl"; }

  Status createCompressor(const Comm* owner, size_t count, const codec::Spec& spec,
                          std::unique_ptr<Compressor>* out) override {
    std::unique_ptr<coll::device::DeviceCompressedState> state;
    SQUALL_TRY(coll::device::DeviceCompressedState::create(comm_.size(), comm_.rank(), count, spec,
                                                           &state));
    *out = std::make_unique<DeviceCompressor>(owner, count, spec, std::move(state));
    return Status::kOk;
  }

  Status compressedAllReduce(const void*, void*, DataType, ReduceOp, Compressor&,
                             coll::OperationPtr*) override {
    return SQUALL_FAIL(Status::kInternal, Subsys::kApi,
                       "a host compressed allreduce reached the NCCL engine; please report this");
  }

  Status compressedAllReduceOnStream(const void* in, void* out, DataType dtype, ReduceOp op,
                                     Compressor& c, void* stream) override {
    return static_cast<DeviceCompressor&>(c).run(comm_, in, out, dtype, op,
                                                 static_cast<cudaStream_t>(stream));
  }

  Status createOptimizer(size_t count, const optim::Config& config,
                         std::unique_ptr<optim::Optimizer>* out) override {
    return optim::cuda::createDeviceOptimizer(comm_, count, config, out);
  }

 private:
  DeviceComm comm_;
};

}  // namespace

bool devicePathBuilt() { return true; }

Status createNcclEngine(void* ncclComm, std::unique_ptr<Engine>* out) {
  DeviceComm comm;
  SQUALL_TRY(DeviceComm::wrap(ncclComm, &comm));
  *out = std::make_unique<NcclEngine>(comm);
  return Status::kOk;
}

}  // namespace squall::core
