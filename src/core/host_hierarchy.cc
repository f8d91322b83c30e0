#include "src/core/host_hierarchy.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <sstream>
#include <vector>

#include "src/bootstrap/local_ranks.h"
#include "src/common/params.h"

namespace squall::core {
namespace {

constexpr size_t kKeyBytes = 120;
constexpr size_t kNameBytes = 64;

// What every rank contributes to the first all-gather.
struct KeyRecord {
  uint8_t off = 0;  // SQUALL_HIERARCHY=off on this rank
  uint8_t pad[7] = {};
  uint64_t window = 0;  // SQUALL_SHM_WINDOW_BYTES
  std::array<char, kKeyBytes> key{};
};

bool failsByRequest(int rank) {
  std::stringstream list(paramString(Param::kShmFailRanks));
  std::string item;
  while (std::getline(list, item, ','))
    if (!item.empty() && item == std::to_string(rank)) return true;
  return false;
}

size_t windowParam() {
  const int64_t w = paramInt(Param::kShmWindowBytes);
  if (w < 4096) {
    SQUALL_WARN(Subsys::kEnv,
                "SQUALL_SHM_WINDOW_BYTES must be at least 4096, not %lld; using 4 MiB",
                static_cast<long long>(w));
    return size_t{4} << 20;
  }
  // Whole cache lines, so every slot stays aligned.
  return static_cast<size_t>(w) / 64 * 64;
}

}  // namespace

std::string hostKey() {
  const std::string id = paramString(Param::kHostId);
  if (!id.empty()) return "id:" + id;
  const std::string boot = bootstrap::machineId();
  struct stat st {};
  const unsigned long long netns =
      ::stat("/proc/self/ns/net", &st) == 0 ? static_cast<unsigned long long>(st.st_ino) : 0;
  return boot + "/net:" + std::to_string(netns);
}

Status discoverHierarchy(bootstrap::Bootstrap& bootstrap, std::unique_ptr<coll::Hierarchy>* out) {
  out->reset();
  const int n = bootstrap.size(), rank = bootstrap.rank();
  const auto nn = static_cast<size_t>(n);
  const std::string mode = paramString(Param::kHierarchy);
  if (mode != "auto" && mode != "off")
    SQUALL_WARN(Subsys::kEnv, "SQUALL_HIERARCHY is '%s'; expected auto or off; using auto",
                mode.c_str());
  KeyRecord mine;
  mine.off = mode == "off" ? 1 : 0;
  mine.window = windowParam();
  const std::string key = hostKey();
  std::memcpy(mine.key.data(), key.data(), std::min(key.size(), kKeyBytes - 1));
  std::vector<KeyRecord> all(nn);
  SQUALL_TRY(bootstrap.allGather(&mine, sizeof(KeyRecord), all.data()));

  std::vector<std::string> keys(nn);
  bool off = false;
  size_t window = 0;
  for (size_t r = 0; r < nn; ++r) {
    off = off || all[r].off != 0;
    window = std::max<size_t>(window, all[r].window);
    keys[r] = std::string(all[r].key.data(), strnlen(all[r].key.data(), kKeyBytes));
  }
  if (off) {
    SQUALL_INFO(Subsys::kInit, "compressed allreduce: flat (SQUALL_HIERARCHY=off)");
    return Status::kOk;
  }
  auto h = std::make_unique<coll::Hierarchy>();
  std::string why;
  if (!coll::layoutFromKeys(keys, rank, &h->layout, &why)) {
    SQUALL_INFO(Subsys::kInit, "compressed allreduce: flat, %s", why.c_str());
    return Status::kOk;
  }
  h->windowBytes = window;
  const coll::HostLayout& l = h->layout;
  const size_t bytes = 2 * static_cast<size_t>(l.local) * window;

  // Local index 0 creates the segment and publishes its name.
  std::array<char, kNameBytes> name{};
  bool ok = true;
  if (l.localIndex == 0) {
    std::string created;
    if (failsByRequest(rank)) {
      SQUALL_FAIL(Status::kSystemError, Subsys::kColl,
                  "rank %d does not create its shared-memory segment (SQUALL_SHM_FAIL_RANKS)",
                  rank);
      ok = false;
    } else {
      ok = h->segment.create(bytes, &created) == Status::kOk;
    }
    if (ok) std::memcpy(name.data(), created.data(), std::min(created.size(), kNameBytes - 1));
  }
  std::vector<std::array<char, kNameBytes>> names(nn);
  SQUALL_TRY(bootstrap.allGather(name.data(), kNameBytes, names.data()));
  if (l.localIndex != 0) {
    const std::array<char, kNameBytes>& theirs = names[static_cast<size_t>(l.localRanks[0])];
    const std::string segment(theirs.data(), strnlen(theirs.data(), kNameBytes));
    if (segment.empty()) {
      ok = false;  // local rank 0 failed and said why
    } else if (failsByRequest(rank)) {
      SQUALL_FAIL(Status::kSystemError, Subsys::kColl,
                  "rank %d does not open its host's shared-memory segment (SQUALL_SHM_FAIL_RANKS)",
                  rank);
      ok = false;
    } else {
      ok = h->segment.open(segment, bytes) == Status::kOk;
    }
  }

  // Every rank must agree: one that could not map the segment makes all of
  // them run flat.
  const uint8_t mapped = ok ? 1 : 0;
  std::vector<uint8_t> verdicts(nn);
  SQUALL_TRY(bootstrap.allGather(&mapped, 1, verdicts.data()));
  h->segment.unlinkName();  // everyone who will map it has
  std::string failed;
  for (size_t r = 0; r < nn; ++r) {
    if (verdicts[r] != 0) continue;
    if (!failed.empty()) failed += ", ";
    failed += std::to_string(r);
  }
  if (!failed.empty()) {
    SQUALL_WARN(Subsys::kInit,
                "compressed allreduce: flat, because rank(s) %s could not set up the %zu-byte "
                "shared-memory segment of the hierarchical algorithm (see the error above on "
                "those ranks); give their /dev/shm room (or one per host shared by its ranks), "
                "lower SQUALL_SHM_WINDOW_BYTES, or set SQUALL_HIERARCHY=off to silence this",
                failed.c_str(), bytes);
    return Status::kOk;
  }
  SQUALL_INFO(Subsys::kInit,
              "compressed allreduce: hierarchical, %d hosts x %d ranks (host %d, local index %d), "
              "%zu bytes of shared memory",
              l.hosts, l.local, l.host, l.localIndex, bytes);
  *out = std::move(h);
  return Status::kOk;
}

}  // namespace squall::core
