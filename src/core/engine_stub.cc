// The GPU path of core in a build without CUDA or NCCL: communicators from
// NCCL and device buffers on host communicators are refused, saying why.
#include "src/core/engine.h"

namespace squall::core {
namespace {

Status gpuPathMissing(const char* what) {
  return SQUALL_FAIL(Status::kUnsupported, Subsys::kApi,
                     "%s needs Squall built with CUDA and NCCL (nvcc and libnccl found at "
                     "configure time, -Dcuda=enabled -Dnccl=enabled); this build has no GPU path",
                     what);
}

}  // namespace

bool devicePathBuilt() { return false; }

Status createNcclEngine(void*, std::unique_ptr<Engine>*) {
  return gpuPathMissing("squallCommInitFromNccl");
}

Status stagedCompressedAllReduce(coll::Communicator&, coll::CompressedState&,
                                 std::unique_ptr<Staging>*, const void*, void*, DataType, ReduceOp,
                                 void*) {
  return gpuPathMissing("squallCompressedAllReduceOnStream");
}

Status stagedCompressedReduceScatter(coll::Communicator&, coll::CompressedState&,
                                     std::unique_ptr<Staging>*, const void*, void*, DataType,
                                     ReduceOp, void*) {
  return gpuPathMissing("squallCompressedReduceScatterOnStream");
}

Status stagedCall(std::unique_ptr<Staging>*, const void*, size_t, void*, size_t, void*,
                  const std::function<Status(const void*, void*)>&) {
  return gpuPathMissing("squallCompressedAllGatherOnStream");
}

Status stagedOptimizerStep(optim::Optimizer&, float*, const float*, float, void*) {
  return gpuPathMissing("squallOptimizerStepOnStream");
}

// No CUDA: no stream is captured, and nothing is on a device.
Status streamIsCapturing(void*, bool* capturing) {
  *capturing = false;
  return Status::kOk;
}

void releaseLater(std::shared_ptr<void> doomed, int) { doomed.reset(); }

}  // namespace squall::core
