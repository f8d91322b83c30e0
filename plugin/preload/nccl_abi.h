// The few NCCL types the interposer's exported functions need, declared here
// from NCCL's documented ABI (stable since NCCL 2.x), so the plugin does not
// include nccl.h; the enum values are Squall's one copy in nccl_abi_values.h.
#pragma once

#include <cstddef>

#include "src/transport/nccl/nccl_abi_values.h"

extern "C" {
typedef int ncclResult_t;  // ncclSuccess = 0
typedef struct ncclComm* ncclComm_t;
typedef struct ncclConfigOpaque ncclConfig_t;    // only passed through
typedef struct ncclSimInfoOpaque ncclSimInfo_t;  // only passed through
typedef struct {
  char internal[128];
} ncclUniqueId;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void* cudaStream_t;
}

static_assert(sizeof(ncclUniqueId) == 128);
