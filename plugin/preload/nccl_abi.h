// The few NCCL types the interposer's exported functions need, declared here
// from NCCL's documented ABI (values stable since NCCL 2.x), so the plugin
// does not include nccl.h.
#pragma once

#include <cstddef>

extern "C" {
typedef int ncclResult_t;  // ncclSuccess = 0
typedef struct ncclComm* ncclComm_t;
typedef struct ncclConfigOpaque ncclConfig_t;  // only passed through
typedef struct {
  char internal[128];
} ncclUniqueId;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void* cudaStream_t;
}

namespace squall::preload::nccl {
constexpr ncclResult_t kSuccess = 0;
constexpr ncclResult_t kSystemError = 2;
constexpr ncclResult_t kInternalError = 3;
constexpr ncclResult_t kInvalidUsage = 5;
constexpr ncclDataType_t kFloat16 = 6, kFloat32 = 7, kBfloat16 = 9;
constexpr ncclRedOp_t kSum = 0, kAvg = 4;
static_assert(sizeof(ncclUniqueId) == 128);
}  // namespace squall::preload::nccl
