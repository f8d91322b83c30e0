#include "plugin/preload/report.h"

#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>

#include "src/common/log.h"

namespace squall::preload {

Report& Report::get() {
  static Report* report = new Report();  // never destroyed: calls may come during exit
  return *report;
}

void Report::compressed(codec::CodecId codec, uint64_t bytesSent, uint64_t bytesFull, Coll coll) {
  PerColl& c = byColl_[static_cast<int>(coll)];
  ++c.compressed;
  c.bytesSent += bytesSent;
  c.bytesFull += bytesFull;
  ++callsCompressed_;
  ++callsByCodec_[static_cast<int>(codec)];
  bytesByCodec_[static_cast<int>(codec)] += bytesSent;
  fullByCodec_[static_cast<int>(codec)] += bytesFull;
  ++reasons_[static_cast<int>(Verdict::kCompress)];
  bytesSent_ += bytesSent;
  bytesFull_ += bytesFull;
}

void Report::passed(Verdict why, uint64_t bytesFull, Coll coll) {
  PerColl& c = byColl_[static_cast<int>(coll)];
  ++c.passed;
  c.bytesSent += bytesFull;
  c.bytesFull += bytesFull;
  ++callsPassed_;
  ++reasons_[static_cast<int>(why)];
  bytesSent_ += bytesFull;
  bytesFull_ += bytesFull;
}

void Report::passedForConfig(CollConfigIssue why, uint64_t bytesFull, Coll coll) {
  ++configIssues_[static_cast<int>(why)];
  passed(Verdict::kCollConfig, bytesFull, coll);
}

void Report::setRank(int rank) {
  int unset = -1;
  rank_.compare_exchange_strong(unset, rank);
}

namespace {
// The rank for the file name when no communicator told it: the launchers'.
int rankFromEnvironment() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return -1;
}
}  // namespace

std::string Report::json(const std::string& codec, const std::string& gatherCodec) const {
  char buffer[1024];
  std::snprintf(buffer, sizeof(buffer),
                "{\n  \"rank\": %d,\n  \"codec\": \"%s\",\n  \"gather_codec\": \"%s\","
                "\n  \"calls_compressed\": %" PRIu64 ",\n  \"calls_passed\": %" PRIu64
                ",\n  \"bytes_sent\": %" PRIu64 ",\n  \"bytes_full_precision\": %" PRIu64
                ",\n  \"residual_evictions\": %" PRIu64 ",\n  \"step_relearns\": %" PRIu64
                ",\n  \"calls_recut\": %" PRIu64 ",\n  \"elements_kept_full\": %" PRIu64
                ",\n  \"calls_by_reason\": {",
                rank_.load(), codec.c_str(), gatherCodec.c_str(), callsCompressed_.load(),
                callsPassed_.load(), bytesSent_.load(), bytesFull_.load(), evictions_.load(),
                relearns_.load(), recuts_.load(), keptFull_.load());
  std::string out = buffer;
  for (int i = 0; i < static_cast<int>(Verdict::kCount); ++i) {
    std::snprintf(buffer, sizeof(buffer), "%s\"%s\": %" PRIu64, i == 0 ? "" : ", ",
                  verdictName(static_cast<Verdict>(i)), reasons_[i].load());
    out += buffer;
  }
  out += "}";
  // The calls passed for their ncclCollConfig_t, by what they set.
  out += ",\n  \"coll_config_passed\": {";
  for (int i = 1; i < static_cast<int>(CollConfigIssue::kCount); ++i) {
    std::snprintf(buffer, sizeof(buffer), "%s\"%s\": %" PRIu64, i == 1 ? "" : ", ",
                  collConfigIssueName(static_cast<CollConfigIssue>(i)), configIssues_[i].load());
    out += buffer;
  }
  out += "}";
  // Which code the compressed calls used: calls, bytes sent and bytes they
  // would have sent at full precision, per codec.
  auto perCodec = [&](const char* name, const std::atomic<uint64_t>* counts) {
    out += std::string(",\n  \"") + name + "\": {";
    for (int i = 1; i < codec::kNumCodecs; ++i) {  // none is never a compressed call's code
      std::snprintf(buffer, sizeof(buffer), "%s\"%s\": %" PRIu64, i == 1 ? "" : ", ",
                    codec::codecName(static_cast<codec::CodecId>(i)), counts[i].load());
      out += buffer;
    }
    out += "}";
  };
  perCodec("calls_by_codec", callsByCodec_);
  perCodec("bytes_by_codec", bytesByCodec_);
  perCodec("bytes_full_precision_by_codec", fullByCodec_);
  // The same totals per collective (a reduce-scatter's full-precision bytes
  // are NCCL's reduce-scatter's, (n - 1) / n of its input).
  out += ",\n  \"by_collective\": {";
  for (int i = 0; i < static_cast<int>(Coll::kCount); ++i) {
    const PerColl& c = byColl_[i];
    std::snprintf(buffer, sizeof(buffer),
                  "%s\"%s\": {\"calls_compressed\": %" PRIu64 ", \"calls_passed\": %" PRIu64
                  ", \"bytes_sent\": %" PRIu64 ", \"bytes_full_precision\": %" PRIu64 "}",
                  i == 0 ? "" : ", ", collName(static_cast<Coll>(i)), c.compressed.load(),
                  c.passed.load(), c.bytesSent.load(), c.bytesFull.load());
    out += buffer;
  }
  out += "}";
  out += "\n}\n";
  return out;
}

void Report::finish(const Policy& policy) {
  if (finished_.exchange(true)) return;
  if (rank_.load() < 0) setRank(rankFromEnvironment());
  if (rank_.load() < 0) setRank(fallback_.load());
  const int rank = rank_.load() < 0 ? static_cast<int>(getpid()) : rank_.load();
  if (!policy.reportPath.empty()) {
    const std::string path = policy.reportPath + "." + std::to_string(rank) + ".json";
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      const std::string text = json(policy.codecText, specText(policy.gather));
      std::fwrite(text.data(), 1, text.size(), f);
      std::fclose(f);
    } else {
      SQUALL_WARN(Subsys::kApi,
                  "cannot write the interposer report %s; check that its "
                  "directory exists and is writable",
                  path.c_str());
    }
  }
  const uint64_t full = bytesFull_.load();
  SQUALL_INFO(
      Subsys::kApi,
      "preload rank %d: %" PRIu64 " calls compressed (%s), %" PRIu64 " passed through; %" PRIu64
      " bytes sent of %" PRIu64 " at full precision (%.1fx)",
      rank, callsCompressed_.load(), policy.codecText.c_str(), callsPassed_.load(),
      bytesSent_.load(), full,
      bytesSent_.load() ? static_cast<double>(full) / static_cast<double>(bytesSent_.load()) : 1.0);
}

}  // namespace squall::preload
