// The state a caller keeps across calls of the compressed allreduce (or
// reduce-scatter, below) of one buffer: its size, codec and group size, the
// error-feedback residuals (the worker residual over the padded buffer and
// the server residual over this rank's chunk, both double-buffered so a
// non-finite call is not committed), scratch buffers, and what the last call
// sent.
//
// Layout: U = the codec block (1 for the element-wise codecs); the buffer is
// padded to N_pad = a multiple of n * U and rank r serves chunk r, elements
// [r * C, (r + 1) * C) with C = N_pad / n. Padding is never encoded or sent:
// a chunk's encoding covers only its elements below N.
//
// Hierarchical layout (createHierarchical; hierarchical_allreduce.cc): H
// hosts of L ranks. The buffer is cut into L slices whose boundaries are
// multiples of H * U; local rank j owns slice j, and the state holds the flat
// layout above of slice j among the H ranks of local index j (cross()): the
// worker residual over slice j padded for H ranks, and the server residual
// over this rank's chunk of that slice.
//
// Reduce-scatter layout (createReduceScatter; compressed_reducescatter.cc):
// the input is n pieces of R = recvcount elements, rank r serves piece r,
// elements [r * R, (r + 1) * R), and each piece is encoded on its own (its
// codec blocks begin at its first element), so R need not be a multiple of
// the block. chunk() is R, count() and paddedCount() are n * R, and the
// worker residual covers the n * R elements; there is no server residual
// (the piece's sum is the call's output).
//
// Without error feedback (Feedback::kNone) a state keeps no residual at all:
// every call encodes its input and the servers' sums as they are, so its
// bytes are those a state with feedback sends right after reset(), and there
// is nothing to zero between calls. For callers whose successive calls carry
// unrelated data, where an owed error would land on the wrong elements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "src/codec/codec.h"
#include "src/common/status.h"

namespace squall::coll {

enum class CompressedAlgo : uint8_t;

enum class Feedback : uint8_t {
  kKept,  // error feedback: each call's encoding error is owed to the next
  kNone,  // every call on its own; no residuals
};

struct CompressedStats {
  // "twophase", "allgather", "hierarchical" or "none" (n = 1, N = 0)
  const char* algorithm = "none";
  // The hierarchical algorithm's exchange among hosts ("twophase" or
  // "allgather", or "none" for an empty slice); "" otherwise.
  const char* crossAlgorithm = "";
  // Payload bytes this rank sent to other hosts (the hierarchical exchange);
  // the flat algorithms leave it 0 (every byte may cross hosts there).
  uint64_t crossBytesSent = 0;
  size_t segments = 0;     // pipeline segments per chunk (or per buffer)
  uint64_t bytesSent = 0;  // payload bytes this rank posted, headers included
  uint64_t bytesReceived = 0;
  uint64_t messagesSent = 0;
};

// SQUALL_RESIDUAL_PRECISION: the store of the residuals of the compressors
// made on host communicators (fp32 unless it says bf16; anything else is
// warned about and taken as fp32).
codec::ResidualStore residualStoreParam();

class CompressedState {
 public:
  // `store`: how the residuals keep their elements (codec::Residual).
  static Status create(int nranks, size_t count, const codec::Spec& spec,
                       std::unique_ptr<CompressedState>* out, size_t phase = 0,
                       Feedback feedback = Feedback::kKept,
                       codec::ResidualStore store = codec::ResidualStore::kF32);
  // The hierarchical layout for local index localIndex of `local` ranks per
  // host on `hosts` hosts (nranks() = hosts * local).
  static Status createHierarchical(int hosts, int local, int localIndex, size_t count,
                                   const codec::Spec& spec, std::unique_ptr<CompressedState>* out,
                                   Feedback feedback = Feedback::kKept,
                                   codec::ResidualStore store = codec::ResidualStore::kF32);

  // The reduce-scatter layout for `nranks` ranks of `recvcount` elements
  // each (above).
  static Status createReduceScatter(int nranks, size_t recvcount, const codec::Spec& spec,
                                    std::unique_ptr<CompressedState>* out,
                                    Feedback feedback = Feedback::kKept,
                                    codec::ResidualStore store = codec::ResidualStore::kF32);

  bool hierarchical() const { return cross_ != nullptr; }
  bool reduceScatter() const { return reduceScatter_; }
  int hosts() const { return cross_ != nullptr ? cross_->nranks() : 0; }
  int localRanks() const { return local_; }
  int localIndex() const { return localIndex_; }
  // Slice l of a hierarchical state: [sliceBegin(l), sliceBegin(l) + sliceCount(l)).
  size_t sliceBegin(int l) const { return slices_[static_cast<size_t>(l)]; }
  size_t sliceCount(int l) const {
    return slices_[static_cast<size_t>(l) + 1] - slices_[static_cast<size_t>(l)];
  }
  // The flat state of this rank's slice among the hosts (hierarchical only).
  CompressedState& cross() { return *cross_; }
  // Elements of the worker residual that a checkpoint holds: N, or the
  // slice's count when hierarchical (the padding is never encoded).
  size_t workerCount() const { return cross_ != nullptr ? cross_->count() : count_; }

  int nranks() const { return nranks_; }
  size_t count() const { return count_; }
  size_t paddedCount() const { return chunk_ * static_cast<size_t>(nranks_); }
  // The virtual position of element 0 (above); 0 for the hierarchical layout.
  size_t phase() const { return phase_; }
  // This rank's server chunk (of its slice when hierarchical).
  size_t chunk() const { return cross_ != nullptr ? cross_->chunk() : chunk_; }
  size_t unit() const { return unit_; }
  const codec::Spec& spec() const { return spec_; }
  // The code the two-phase allreduce's servers re-encode their reduced chunk
  // with before the all-gather: spec() unless setGatherSpec chose another
  // (a wider one, such as int8 behind int4, keeps the second encoding's
  // error small for a little more than the all-gather's bytes). Every rank of
  // the call must hold the same one.
  const codec::Spec& gatherSpec() const { return gatherSpec_; }
  Status setGatherSpec(const codec::Spec& spec);
  Feedback feedback() const {
    if (cross_ != nullptr) return cross_->feedback();
    return worker_ != nullptr ? Feedback::kKept : Feedback::kNone;
  }
  // How the residuals keep their elements (fp32 without feedback).
  codec::ResidualStore residualStore() const {
    if (cross_ != nullptr) return cross_->residualStore();
    return worker_ != nullptr ? worker_->store() : codec::ResidualStore::kF32;
  }
  // The residuals' memory, both halves of both (0 without feedback).
  size_t residualBytes() const {
    if (cross_ != nullptr) return cross_->residualBytes();
    return (worker_ != nullptr ? worker_->bytes() : 0) +
           (server_ != nullptr ? server_->bytes() : 0);
  }
  // The residuals; only for a state that keeps error feedback (server():
  // not for the reduce-scatter layout).
  codec::Residual& worker() { return cross_ != nullptr ? cross_->worker() : *worker_; }
  codec::Residual& server() { return cross_ != nullptr ? cross_->server() : *server_; }
  // What the algorithms hand an encode at position `at` of the worker residual
  // (virtual positions) or of the server residual (positions in the chunk):
  // the half it reads and the half it writes, none without feedback. Flat
  // layout (the hierarchical algorithm asks cross()).
  codec::ResidualSpan workerAt(size_t at) { return spanOf(worker_.get(), at); }
  codec::ResidualSpan serverAt(size_t at) { return spanOf(server_.get(), at); }
  // The end of a call: the worker residual, and the server's when the call
  // used it, become current when `finite` (codec::Residual::commit); nothing
  // without feedback.
  void commit(bool finite, bool serverUsed);
  const CompressedStats& lastStats() const { return stats_; }
  // Zeroes both residuals (nothing to do without feedback).
  void reset();

  // How the calls on this state choose their algorithm when
  // SQUALL_COMPRESSED_ALGO is auto: kAuto (default: the time model),
  // kAutoBytes, or a fixed one; a fixed one here wins over the variable.
  void setAlgorithm(CompressedAlgo algo) {
    algo_ = algo;
    if (cross_ != nullptr) cross_->setAlgorithm(algo);
  }
  CompressedAlgo algorithm() const { return algo_; }

  // Called by the algorithms at the end of a successful call.
  void recordStats(const CompressedStats& stats) { stats_ = stats; }

  // Scratch reused across calls (owned here so steady-state calls do not
  // allocate).
  struct Scratch {
    std::vector<uint8_t> sendBuffer, recvBuffer, serverBuffer, gatherBuffer;
    std::vector<float> accumulator, decoded;
    std::vector<float> slice;       // hierarchical: the host's fp32 sum of this rank's slice
    std::vector<uint8_t> verdicts;  // reduce-scatter: every rank's "all finite" byte
  };
  Scratch& scratch() { return scratch_; }

 private:
  static codec::ResidualSpan spanOf(codec::Residual* r, size_t at) {
    return r == nullptr ? codec::ResidualSpan{} : r->span(at);
  }

  Scratch scratch_;
  CompressedStats stats_;
  CompressedState() = default;
  int nranks_ = 1;
  size_t count_ = 0;
  size_t chunk_ = 0;
  size_t unit_ = 1;
  size_t phase_ = 0;
  bool reduceScatter_ = false;
  codec::Spec spec_, gatherSpec_;
  CompressedAlgo algo_{};                             // kAuto
  std::unique_ptr<codec::Residual> worker_, server_;  // null without feedback
  // Hierarchical only.
  std::unique_ptr<CompressedState> cross_;
  int local_ = 1;
  int localIndex_ = 0;
  std::vector<size_t> slices_;  // L + 1 slice boundaries
};

}  // namespace squall::coll
