// The few NCCL types the interposer's exported functions need, declared here
// from NCCL's documented ABI (stable since NCCL 2.x), so the plugin does not
// include nccl.h; the enum values are Squall's one copy in nccl_abi_values.h.
#pragma once

#include <climits>
#include <cstddef>

#include "src/transport/nccl/nccl_abi_values.h"

extern "C" {
typedef int ncclResult_t;  // ncclSuccess = 0
typedef struct ncclComm* ncclComm_t;
typedef struct ncclConfigOpaque ncclConfig_t;    // read through ConfigHead only
typedef struct ncclSimInfoOpaque ncclSimInfo_t;  // only passed through
typedef struct {
  char internal[128];
} ncclUniqueId;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void* cudaStream_t;
}

static_assert(sizeof(ncclUniqueId) == 128);

namespace squall::preload::nccl_config {

// The first members of ncclConfig_t, laid out alike in every NCCL since 2.14
// (later versions only append members): the struct's size, a magic number
// NCCL's initializer writes, the NCCL version the caller compiled against
// (major * 10000 + minor * 100 + patch), and whether calls on the
// communicator block (1), return ncclInProgress while NCCL finishes them in
// the background (0), or take NCCL's default (kUnset: blocking, unless the
// environment says otherwise).
struct Head {
  size_t size;
  unsigned magic;
  unsigned version;
  int blocking;
};
constexpr unsigned kMagic = 0xcafebeefu;
constexpr unsigned kBlockingSince = 21400;  // NCCL ignores `blocking` of older configs
constexpr int kUnset = INT_MIN;

}  // namespace squall::preload::nccl_config

namespace squall::preload::nccl_flags {
// ncclCommSuspend: release the communicator's dynamic device memory too.
constexpr int kSuspendMemory = 0x01;
}  // namespace squall::preload::nccl_flags
