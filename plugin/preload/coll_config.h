// Whether the interposer can honour the per-call config of an
// ncclAllReduceConfig call (NCCL 2.31 on): it can when there is none, or when
// the config asks for nothing but what the plain ncclAllReduce does. A config
// that tunes NCCL's own kernels (CTAs, cluster size, CTA policy), filters its
// algorithms, tags the call for profiler plugins, asks for a launch event or
// carries vendor options cannot be honoured by Squall's compressed path, and
// neither can one whose head it does not know (another magic, another size):
// those calls go to the real NCCL unchanged.
#pragma once

#include <cstdint>

namespace squall::preload {

enum class CollConfigIssue : uint8_t {
  kNone = 0,       // no config, or every member left at NCCL's default
  kMagic,          // not NCCL's magic: not made by NCCL's initializer
  kSize,           // not the layout known here (an older, a newer or a garbled one)
  kVendorOptions,  // ext: a list of vendor options
  kMinCtas,
  kMaxCtas,
  kNvlsCtas,
  kClusterSize,
  kAlgorithms,  // a non-empty algorithm filter
  kCtaPolicy,
  kProfilerTag,    // a non-zero profiler tag
  kLaunchedEvent,  // an event to record at kernel launch
  kCount
};

// The member at fault as NCCL names it ("algSelection"), or "magic", "size".
const char* collConfigIssueName(CollConfigIssue issue);

// The first thing in `config` (an ncclCollConfig_t, or null) that the
// interposer cannot honour. Reads the head first, and the members after it
// only when the size is the layout it knows (coll_config::Fields).
CollConfigIssue collConfigIssue(const void* config);

}  // namespace squall::preload
