// The host structure of a communicator, for the hierarchical compressed
// allreduce (hierarchical_allreduce.cc): which ranks share a host, and the
// shared-memory segment the ranks of this host reduce through.
//
// Hosts are told apart by a key (host_key in the core layer: SQUALL_HOSTID,
// else boot id + network namespace). The hierarchy applies only when there
// are H >= 2 hosts and every host has the same L >= 2 ranks; then local
// index j = the rank's position among its host's ranks in global rank order,
// host index h = the order in which hosts first appear in rank order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "src/common/status.h"

namespace squall::coll {

struct HostLayout {
  int hosts = 1;                // H
  int local = 1;                // L, ranks per host
  int host = 0;                 // h of this rank
  int localIndex = 0;           // j of this rank
  std::vector<int> localRanks;  // global ranks of this host, by local index
  std::vector<int> crossRanks;  // global ranks with this local index, by host
};

// The layout of `rank` given every rank's host key. Returns false, with
// *why saying so in a sentence, when the hierarchy does not apply (one host,
// one rank per host, or hosts with different numbers of ranks).
bool layoutFromKeys(const std::vector<std::string>& keys, int rank, HostLayout* out,
                    std::string* why);

// A POSIX shared-memory segment mapped into this process. The creator
// writes a header (magic, a random nonce, the size) that openers check, so a
// name reused by something else is refused. The name is unlinked as soon as
// every local rank has mapped it (unlinkName), so nothing outlives a crash.
class ShmSegment {
 public:
  ShmSegment() = default;
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Creates a segment of `bytes` usable bytes (after the header) under a
  // fresh random name (O_CREAT | O_EXCL, mode 0600); *name receives it.
  Status create(size_t bytes, std::string* name);
  // Maps the segment `name` made by create(bytes) on another rank.
  Status open(const std::string& name, size_t bytes);
  // Removes the name (the mapping stays). Idempotent.
  void unlinkName();

  uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  void release();
  void* map_ = nullptr;
  size_t mapBytes_ = 0;
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;  // until unlinked (creator only)
};

// What a communicator needs to run the hierarchical algorithm: the layout,
// the segment (2 buffers x L slots of windowBytes) and the window.
struct Hierarchy {
  HostLayout layout;
  ShmSegment segment;
  size_t windowBytes = 0;

  uint8_t* slot(size_t buffer, size_t localIndex) const {
    return segment.data() + (buffer * static_cast<size_t>(layout.local) + localIndex) * windowBytes;
  }
};

}  // namespace squall::coll
