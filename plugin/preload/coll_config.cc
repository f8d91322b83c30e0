#include "plugin/preload/coll_config.h"

#include <cstddef>
#include <cstring>

#include "plugin/preload/nccl_abi.h"

namespace squall::preload {

const char* collConfigIssueName(CollConfigIssue issue) {
  switch (issue) {
    case CollConfigIssue::kNone: return "none";
    case CollConfigIssue::kMagic: return "magic";
    case CollConfigIssue::kSize: return "size";
    case CollConfigIssue::kVendorOptions: return "ext";
    case CollConfigIssue::kMinCtas: return "minCTAs";
    case CollConfigIssue::kMaxCtas: return "maxCTAs";
    case CollConfigIssue::kNvlsCtas: return "nvlsCTAs";
    case CollConfigIssue::kClusterSize: return "cgaClusterSize";
    case CollConfigIssue::kAlgorithms: return "algSelection";
    case CollConfigIssue::kCtaPolicy: return "CTAPolicy";
    case CollConfigIssue::kProfilerTag: return "userProfilerTag";
    case CollConfigIssue::kLaunchedEvent: return "launchCompletionEvent";
    case CollConfigIssue::kCount: break;
  }
  return "?";
}

CollConfigIssue collConfigIssue(const void* config) {
  if (config == nullptr) return CollConfigIssue::kNone;
  // The head first (size, magic, version, as ncclConfig_t's), the rest only
  // from a config of the known size.
  coll_config::Fields f{};
  std::memcpy(&f, config, offsetof(coll_config::Fields, vendorOptions));
  if (f.magic != nccl_config::kMagic) return CollConfigIssue::kMagic;
  // Another size is a layout not known here: members a newer NCCL appends
  // may ask for anything.
  if (f.size != sizeof f) return CollConfigIssue::kSize;
  std::memcpy(&f, config, sizeof f);
  using nccl_config::kUnset;
  // NCCL ignores the vendor options; a vendor's library behind the
  // interposer may not, and only it knows what they ask.
  if (f.vendorOptions != nullptr) return CollConfigIssue::kVendorOptions;
  if (f.minCtas != kUnset) return CollConfigIssue::kMinCtas;
  if (f.maxCtas != kUnset) return CollConfigIssue::kMaxCtas;
  if (f.nvlsCtas != kUnset) return CollConfigIssue::kNvlsCtas;
  if (f.clusterSize != kUnset) return CollConfigIssue::kClusterSize;
  // algorithmsRequired says only what an unmet filter does: without a
  // filter it has no effect, whatever its value.
  if (f.algorithms != nullptr && f.algorithms[0] != '\0') return CollConfigIssue::kAlgorithms;
  if (f.ctaPolicy != kUnset) return CollConfigIssue::kCtaPolicy;
  if (f.profilerTag != 0) return CollConfigIssue::kProfilerTag;
  if (f.launchedEvent != nullptr) return CollConfigIssue::kLaunchedEvent;
  return CollConfigIssue::kNone;
}

}  // namespace squall::preload
