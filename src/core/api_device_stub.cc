// The GPU entry points of the C API in a build without CUDA or NCCL: they
// exist, and say so.
#include "src/core/api.h"
#include "src/core/api_objects.h"

using squall::Status;
using squall::Subsys;

namespace squall::core {

namespace {
Status unsupported(const char* what) {
  return SQUALL_FAIL(Status::kUnsupported, Subsys::kApi,
                     "%s needs Squall built with CUDA and NCCL (nvcc and libnccl found at "
                     "configure time, -Dcuda=enabled -Dnccl=enabled); this build has no GPU path",
                     what);
}
}  // namespace

Status createDeviceCompressor(squallComm_t, size_t, const codec::Spec&, squallCompressor*) {
  return unsupported("a compressor on a communicator from NCCL");
}
Status resetDeviceCompressor(squallCompressor*) {
  return unsupported("squallCompressorReset of a device compressor");
}
Status deviceCompressorStats(squallCompressor*, squallCompressorStats_t*) {
  return unsupported("squallCompressorGetStats of a device compressor");
}

Status createDeviceOptimizer(squallComm_t, size_t, const optim::Config&,
                             std::unique_ptr<DeviceAttachment>*) {
  return unsupported("an optimizer on a communicator from NCCL");
}
Status deviceOptimizerStep(DeviceAttachment*, float*, const float*, float, void*) {
  return unsupported("squallOptimizerStepOnStream");
}
Status stagedOptimizerStep(optim::Optimizer*, float*, const float*, float, void*) {
  return unsupported("squallOptimizerStepOnStream");
}
Status deviceOptimizerInfo(DeviceAttachment*, optim::Info*) {
  return unsupported("a device optimizer");
}
Status deviceOptimizerStateSize(DeviceAttachment*, size_t*) {
  return unsupported("a device optimizer");
}
Status deviceOptimizerSaveState(DeviceAttachment*, void*, size_t, size_t*) {
  return unsupported("a device optimizer");
}
Status deviceOptimizerLoadState(DeviceAttachment*, const void*, size_t) {
  return unsupported("a device optimizer");
}

}  // namespace squall::core

extern "C" {

squallResult_t squallCommInitFromNccl(squallComm_t*, void*) {
  return SQUALL_API_GUARD({ return squall::core::unsupported("squallCommInitFromNccl"); });
}

squallResult_t squallCompressedAllReduceOnStream(const void*, void*, squallDataType_t,
                                                 squallRedOp_t, squallCompressor_t, squallComm_t,
                                                 void*) {
  return SQUALL_API_GUARD(
      { return squall::core::unsupported("squallCompressedAllReduceOnStream"); });
}

}  // extern "C"
