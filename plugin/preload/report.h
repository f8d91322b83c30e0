// What the interposer did, per process: counters updated by every call, and
// at exit a JSON file (SQUALL_PRELOAD_REPORT=PATH -> PATH.<rank>.json) and,
// at SQUALL_DEBUG=INFO, one summary line.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "plugin/preload/coll_config.h"
#include "plugin/preload/policy.h"

namespace squall::preload {

class Report {
 public:
  static Report& get();

  // A call of `coll` that ran compressed with `codec`: what it sent, and what
  // the same collective at full precision would have sent.
  void compressed(codec::CodecId codec, uint64_t bytesSent, uint64_t bytesFull,
                  Coll coll = Coll::kAllReduce);
  // A call passed through (sent at full precision).
  void passed(Verdict why, uint64_t bytesFull, Coll coll = Coll::kAllReduce);
  // A call passed through for its ncclCollConfig_t (Verdict::kCollConfig),
  // counted by what in the config could not be honoured.
  void passedForConfig(CollConfigIssue why, uint64_t bytesFull, Coll coll = Coll::kAllReduce);
  void evicted(uint64_t entries) { evictions_ += entries; }
  void relearned() { ++relearns_; }
  // A call cut differently from before: it took over what other residuals owed.
  void recut() { ++recuts_; }
  // Elements of a compressed call sent at full precision: learnt tensors
  // below SQUALL_PRELOAD_MIN_BYTES inside a fused buffer.
  void keptFull(uint64_t elements) { keptFull_ += elements; }
  // The process's rank for the file name, first caller wins.
  void setRank(int rank);
  // Used when neither setRank nor the launcher's variables gave one.
  void setFallbackRank(int rank) {
    int unset = -1;
    fallback_.compare_exchange_strong(unset, rank);
  }

  // `gatherCodec`: the two-phase allreduce's second-round code
  // (Policy::gather).
  std::string json(const std::string& codec, const std::string& gatherCodec = "") const;
  // Writes the file and the INFO line once (later calls do nothing).
  void finish(const Policy& policy);

 private:
  std::atomic<uint64_t> callsCompressed_{0}, callsPassed_{0}, bytesSent_{0}, bytesFull_{0};
  std::atomic<uint64_t> evictions_{0}, relearns_{0}, recuts_{0}, keptFull_{0};
  std::atomic<uint64_t> reasons_[static_cast<int>(Verdict::kCount)] = {};
  std::atomic<uint64_t> configIssues_[static_cast<int>(CollConfigIssue::kCount)] = {};
  // Per codec: the compressed calls that used it, the bytes they sent, and
  // what a full-precision allreduce of them would have sent.
  std::atomic<uint64_t> callsByCodec_[codec::kNumCodecs] = {};
  std::atomic<uint64_t> bytesByCodec_[codec::kNumCodecs] = {};
  std::atomic<uint64_t> fullByCodec_[codec::kNumCodecs] = {};
  // Per collective: calls compressed and passed, bytes sent and at full
  // precision.
  struct PerColl {
    std::atomic<uint64_t> compressed{0}, passed{0}, bytesSent{0}, bytesFull{0};
  };
  PerColl byColl_[static_cast<int>(Coll::kCount)];
  std::atomic<int> rank_{-1}, fallback_{-1};
  std::atomic<bool> finished_{false};
};

}  // namespace squall::preload
