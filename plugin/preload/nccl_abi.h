// The few NCCL types the interposer's exported functions need, declared here
// from NCCL's documented ABI (stable since NCCL 2.x), so the plugin does not
// include nccl.h; the enum values are Squall's one copy in nccl_abi_values.h.
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>

#include "src/transport/nccl/nccl_abi_values.h"

extern "C" {
typedef int ncclResult_t;  // ncclSuccess = 0
typedef struct ncclComm* ncclComm_t;
typedef struct ncclConfigOpaque ncclConfig_t;    // read through ConfigHead only
typedef struct ncclSimInfoOpaque ncclSimInfo_t;  // only passed through
// NCCL 2.31+, read through coll_config::Fields only.
typedef struct ncclCollConfigOpaque ncclCollConfig_t;
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

namespace squall::preload::coll_config {

// The per-call config of the nccl*Config collectives (NCCL 2.31 on; this is
// the layout NCCL 2.32 names v23200), as the interposer reads it. Like
// ncclConfig_t it starts with its own size, NCCL's magic and the version the
// caller compiled against, and later versions only append members, so the
// size says which members a config has. After the head: a list of
// vendor-specific options (the official NCCL ignores them); four resource
// limits (least and most CTAs, the NVLS CTA cap, the thread-block cluster
// size); an algorithm filter given as text, and whether a filter that cannot
// be met is an error (1 by default); a CTA policy bitmask; a tag handed to
// profiler plugins (0: none); and an event NCCL records when the kernel has
// been launched. An int NCCL should choose is nccl_config::kUnset, a pointer
// left unset is null, and an empty filter text is no filter.
struct Fields {
  size_t size;
  unsigned magic;
  unsigned version;
  const void* vendorOptions;
  int minCtas;
  int maxCtas;
  int nvlsCtas;
  int clusterSize;
  const char* algorithms;
  int algorithmsRequired;
  int ctaPolicy;
  uint64_t profilerTag;
  const void* launchedEvent;
};
static_assert(offsetof(Fields, magic) == 8 && offsetof(Fields, version) == 12);
static_assert(offsetof(Fields, vendorOptions) == 16 && offsetof(Fields, minCtas) == 24);
static_assert(offsetof(Fields, maxCtas) == 28 && offsetof(Fields, nvlsCtas) == 32);
static_assert(offsetof(Fields, clusterSize) == 36 && offsetof(Fields, algorithms) == 40);
static_assert(offsetof(Fields, algorithmsRequired) == 48 && offsetof(Fields, ctaPolicy) == 52);
static_assert(offsetof(Fields, profilerTag) == 56 && offsetof(Fields, launchedEvent) == 64);
static_assert(sizeof(Fields) == 72);

}  // namespace squall::preload::coll_config

namespace squall::preload::nccl_flags {
// ncclCommSuspend: release the communicator's dynamic device memory too.
constexpr int kSuspendMemory = 0x01;
}  // namespace squall::preload::nccl_flags
