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
