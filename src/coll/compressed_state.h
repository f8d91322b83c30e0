// The state a caller keeps across calls of the compressed allreduce of one
// buffer: its size, codec and group size, the error-feedback residuals (the
// worker residual over the padded buffer and the server residual over this
// rank's chunk, both double-buffered so a non-finite call is not committed),
// scratch buffers, and what the last call sent.
//
// Layout: U = the codec block (1 for the element-wise codecs); the buffer is
// padded to N_pad = a multiple of n * U and rank r serves chunk r, elements
// [r * C, (r + 1) * C) with C = N_pad / n. Padding is never encoded or sent:
// a chunk's encoding covers only its elements below N.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "src/codec/codec.h"
#include "src/common/status.h"

namespace squall::coll {

enum class CompressedAlgo : uint8_t;

struct CompressedStats {
  const char* algorithm = "none";  // "twophase", "allgather" or "none" (n = 1, N = 0)
  size_t segments = 0;             // pipeline segments per chunk (or per buffer)
  uint64_t bytesSent = 0;          // payload bytes this rank posted, headers included
  uint64_t bytesReceived = 0;
  uint64_t messagesSent = 0;
};

class CompressedState {
 public:
  static Status create(int nranks, size_t count, const codec::Spec& spec,
                       std::unique_ptr<CompressedState>* out);

  int nranks() const { return nranks_; }
  size_t count() const { return count_; }
  size_t paddedCount() const { return chunk_ * static_cast<size_t>(nranks_); }
  size_t chunk() const { return chunk_; }
  size_t unit() const { return unit_; }
  const codec::Spec& spec() const { return spec_; }
  codec::Residual& worker() { return *worker_; }
  codec::Residual& server() { return *server_; }
  const CompressedStats& lastStats() const { return stats_; }
  // Zeroes both residuals.
  void reset();

  // How the calls on this state choose their algorithm when
  // SQUALL_COMPRESSED_ALGO is auto: kAuto (default: the time model),
  // kAutoBytes, or a fixed one; a fixed one here wins over the variable.
  void setAlgorithm(CompressedAlgo algo) { algo_ = algo; }
  CompressedAlgo algorithm() const { return algo_; }

  // Called by the algorithms at the end of a successful call.
  void recordStats(const CompressedStats& stats) { stats_ = stats; }

  // Scratch reused across calls (owned here so steady-state calls do not
  // allocate).
  struct Scratch {
    std::vector<uint8_t> sendBuffer, recvBuffer, serverBuffer, gatherBuffer;
    std::vector<float> accumulator, decoded;
  };
  Scratch& scratch() { return scratch_; }

 private:
  Scratch scratch_;
  CompressedStats stats_;
  CompressedState() = default;
  int nranks_ = 1;
  size_t count_ = 0;
  size_t chunk_ = 0;
  size_t unit_ = 1;
  codec::Spec spec_;
  CompressedAlgo algo_{};  // kAuto
  std::unique_ptr<codec::Residual> worker_, server_;
};

}  // namespace squall::coll
