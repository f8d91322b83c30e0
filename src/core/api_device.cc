// The GPU entry points of the C API (built with CUDA and NCCL): communicators
// from NCCL, device compressors, and the compressed allreduce on a CUDA
// stream, either on the device over NCCL (src/coll/device) or staged through
// pinned host memory over a host communicator.
#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "src/coll/device/device_allreduce.h"
#include "src/common/cuda_status.h"
#include "src/core/api.h"
#include "src/core/api_objects.h"
#include "src/optim/cuda/device_optimizer.h"
#include "src/optim/optimizer.h"

using squall::DataType;
using squall::ReduceOp;
using squall::Status;
using squall::Subsys;
namespace core = squall::core;
namespace device = squall::coll::device;

namespace squall::core {
namespace {

// The device state of a compressor on a communicator from NCCL.
struct DeviceState final : DeviceAttachment {
  std::unique_ptr<device::DeviceCompressedState> state;
  cudaStream_t lastStream = nullptr;  // for Reset and GetStats
};

// Pinned staging buffers of a compressor on a host communicator.
struct Staging final : DeviceAttachment {
  void* in = nullptr;
  void* out = nullptr;
  size_t bytes = 0;
  ~Staging() override {
    cudaFreeHost(in);
    cudaFreeHost(out);
  }
  Status reserve(size_t need) {
    if (need <= bytes) return Status::kOk;
    cudaFreeHost(in);
    cudaFreeHost(out);
    in = out = nullptr;
    bytes = 0;
    SQUALL_CUDA_TRY(cudaMallocHost(&in, need));
    SQUALL_CUDA_TRY(cudaMallocHost(&out, need));
    bytes = need;
    return Status::kOk;
  }
};

Status toTypes(const squallDataType_t& dtype, const squallRedOp_t& op, DataType* t, ReduceOp* o) {
  const int d = rawEnum(dtype);
  const int r = rawEnum(op);
  SQUALL_REQUIRE(d == squallFloat32 || d == squallFloat16 || d == squallBfloat16,
                 Status::kInvalidArgument, Subsys::kApi,
                 "the compressed allreduce takes squallFloat32, squallFloat16 or squallBfloat16, "
                 "not data type %d",
                 d);
  SQUALL_REQUIRE(r == squallSum || r == squallAvg, Status::kInvalidArgument, Subsys::kApi,
                 "the compressed allreduce supports squallSum and squallAvg, not reduction %d", r);
  *t = static_cast<DataType>(d);
  *o = static_cast<ReduceOp>(r);
  return Status::kOk;
}

DeviceState* deviceStateOf(squallCompressor* c) {
  return dynamic_cast<DeviceState*>(c->device.get());
}

}  // namespace

Status createDeviceCompressor(squallComm_t comm, size_t count, const codec::Spec& spec,
                              squallCompressor* compressor) {
  auto d = std::make_unique<DeviceState>();
  SQUALL_TRY(device::DeviceCompressedState::create(comm->nccl->size(), comm->nccl->rank(), count,
                                                   spec, &d->state));
  compressor->device = std::move(d);
  return Status::kOk;
}

Status resetDeviceCompressor(squallCompressor* compressor) {
  DeviceState* d = deviceStateOf(compressor);
  SQUALL_REQUIRE(d != nullptr, Status::kInvalidArgument, Subsys::kApi, "the compressor is NULL");
  SQUALL_TRY(d->state->reset(d->lastStream));
  SQUALL_CUDA_TRY(cudaStreamSynchronize(d->lastStream));
  return Status::kOk;
}

Status deviceCompressorStats(squallCompressor* compressor, squallCompressorStats_t* stats) {
  DeviceState* d = deviceStateOf(compressor);
  SQUALL_REQUIRE(d != nullptr, Status::kInvalidArgument, Subsys::kApi, "the compressor is NULL");
  stats->calls = compressor->calls;
  stats->skippedCalls = 0;
  if (d->state->worker() != nullptr) {  // waits for the last stream used
    int current = 0;
    unsigned long long skipped = 0;
    SQUALL_TRY(codec::cudaResidualQuery(*d->state->worker(), d->lastStream, &current, &skipped));
    stats->skippedCalls = skipped;
  }
  stats->bytesSent = compressor->calls != 0 ? d->state->bytesSent() : 0;
  stats->bytesReceived = compressor->calls != 0 ? d->state->bytesReceived() : 0;
  return Status::kOk;
}

namespace {
struct DeviceOptimizerState final : DeviceAttachment {
  std::unique_ptr<optim::Optimizer> impl;
};

optim::Optimizer* deviceOptimizerOf(DeviceAttachment* a) {
  auto* d = dynamic_cast<DeviceOptimizerState*>(a);
  return d != nullptr ? d->impl.get() : nullptr;
}
#define SQUALL_DEVICE_OPTIMIZER(var, attachment)                         \
  optim::Optimizer* var = deviceOptimizerOf(attachment);                 \
  SQUALL_REQUIRE(var != nullptr, Status::kInvalidArgument, Subsys::kApi, \
                 "the optimizer has no device state")
}  // namespace

Status createDeviceOptimizer(squallComm_t comm, size_t count, const optim::Config& config,
                             std::unique_ptr<DeviceAttachment>* out) {
  auto d = std::make_unique<DeviceOptimizerState>();
  SQUALL_TRY(optim::cuda::createDeviceOptimizer(*comm->nccl, count, config, &d->impl));
  *out = std::move(d);
  return Status::kOk;
}

Status deviceOptimizerStep(DeviceAttachment* a, float* dParams, const float* dGrads, float lr,
                           void* stream) {
  SQUALL_DEVICE_OPTIMIZER(o, a);
  return o->stepOnStream(dParams, dGrads, lr, stream);
}

// Host staging: copy in, wait, step on the host, copy back, wait. Two
// pageable copies and two stream synchronisations per step.
Status stagedOptimizerStep(optim::Optimizer* o, float* dParams, const float* dGrads, float lr,
                           void* stream) {
  const size_t n = o->count();
  auto s = static_cast<cudaStream_t>(stream);
  std::vector<float> x(n), g(n);
  if (n != 0) {
    SQUALL_CUDA_TRY(
        cudaMemcpyAsync(x.data(), dParams, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    SQUALL_CUDA_TRY(
        cudaMemcpyAsync(g.data(), dGrads, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    SQUALL_CUDA_TRY(cudaStreamSynchronize(s));
  }
  SQUALL_TRY(o->step(x.data(), g.data(), lr));
  if (n != 0) {
    SQUALL_CUDA_TRY(
        cudaMemcpyAsync(dParams, x.data(), n * sizeof(float), cudaMemcpyHostToDevice, s));
    SQUALL_CUDA_TRY(cudaStreamSynchronize(s));
  }
  return Status::kOk;
}

Status deviceOptimizerInfo(DeviceAttachment* a, optim::Info* info) {
  SQUALL_DEVICE_OPTIMIZER(o, a);
  *info = o->info();
  return Status::kOk;
}

Status deviceOptimizerStateSize(DeviceAttachment* a, size_t* bytes) {
  SQUALL_DEVICE_OPTIMIZER(o, a);
  *bytes = o->stateSize();
  return Status::kOk;
}

Status deviceOptimizerSaveState(DeviceAttachment* a, void* buffer, size_t capacity,
                                size_t* written) {
  SQUALL_DEVICE_OPTIMIZER(o, a);
  return o->saveState(buffer, capacity, written);
}

Status deviceOptimizerLoadState(DeviceAttachment* a, const void* buffer, size_t bytes) {
  SQUALL_DEVICE_OPTIMIZER(o, a);
  return o->loadState(buffer, bytes);
}

}  // namespace squall::core

extern "C" {

squallResult_t squallCommInitFromNccl(squallComm_t* comm, void* ncclComm) {
  return SQUALL_API_GUARD({
    SQUALL_REQUIRE(comm != nullptr && ncclComm != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the communicator output and the ncclComm_t must be set");
    auto c = std::make_unique<squallComm>();
    c->nccl = std::make_unique<squall::transport::nccl::DeviceComm>();
    SQUALL_TRY(squall::transport::nccl::DeviceComm::wrap(ncclComm, c->nccl.get()));
    *comm = c.release();
    return Status::kOk;
  });
}

squallResult_t squallCompressedAllReduceOnStream(const void* sendbuf, void* recvbuf,
                                                 squallDataType_t dtype, squallRedOp_t op,
                                                 squallCompressor_t compressor, squallComm_t comm,
                                                 void* cudaStream) {
  return SQUALL_API_GUARD({
    SQUALL_REQUIRE(comm != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the communicator is NULL");
    SQUALL_REQUIRE(compressor != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the compressor is NULL; create one with squallCompressorCreate");
    SQUALL_REQUIRE(compressor->comm == comm, Status::kInvalidUsage, Subsys::kApi,
                   "the compressor was created for another communicator; create one per "
                   "communicator and buffer");
    DataType t = DataType::kF32;
    ReduceOp o = ReduceOp::kSum;
    SQUALL_TRY(core::toTypes(dtype, op, &t, &o));
    auto stream = static_cast<cudaStream_t>(cudaStream);

    if (comm->nccl != nullptr) {
      core::DeviceState* d = core::deviceStateOf(compressor);
      SQUALL_REQUIRE(d != nullptr, Status::kInternal, Subsys::kApi,
                     "a compressor of a communicator from NCCL has no device state");
      SQUALL_TRY(
          device::compressedAllReduce(*comm->nccl, stream, sendbuf, recvbuf, t, o, d->state.get()));
      d->lastStream = stream;
      ++compressor->calls;
      return Status::kOk;
    }

    // Host communicator: stage through pinned memory.
    SQUALL_REQUIRE(comm->coll != nullptr && compressor->state != nullptr, Status::kInvalidArgument,
                   Subsys::kApi, "the communicator is not initialised");
    const size_t bytes = compressor->state->count() * squall::dataTypeSize(t);
    if (compressor->device == nullptr) compressor->device = std::make_unique<core::Staging>();
    auto* staging = dynamic_cast<core::Staging*>(compressor->device.get());
    SQUALL_REQUIRE(staging != nullptr, Status::kInternal, Subsys::kApi,
                   "a host compressor holds device state");
    SQUALL_TRY(staging->reserve(bytes));
    if (bytes != 0) {
      SQUALL_CUDA_TRY(cudaMemcpyAsync(staging->in, sendbuf, bytes, cudaMemcpyDefault, stream));
      SQUALL_CUDA_TRY(cudaStreamSynchronize(stream));
    }
    SQUALL_TRY(
        comm->coll->compressedAllReduce(staging->in, staging->out, t, o, compressor->state.get()));
    ++compressor->calls;
    if (bytes != 0) {
      SQUALL_CUDA_TRY(cudaMemcpyAsync(recvbuf, staging->out, bytes, cudaMemcpyDefault, stream));
      SQUALL_CUDA_TRY(cudaStreamSynchronize(stream));
    }
    return Status::kOk;
  });
}

}  // extern "C"
