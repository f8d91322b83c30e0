// What an algorithm sees of its operation: the transport, the operation's
// sequence number and descriptor (every message is tagged with both), the
// deadline for every wait, and the communicator's options.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "src/common/status.h"
#include "src/transport/transport.h"

namespace squall::coll {

enum class AllReduceAlgo : uint8_t { kAuto, kRing, kDirect, kHalvingDoubling };
// kAuto: the alpha-beta time model (compressed_allgather.cc); kAutoBytes:
// the algorithm that sends fewer bytes (for callers whose traffic dominates,
// such as an optimizer; chooseCompressedAlgoByBytes). Only a state asks for
// kAutoBytes (CompressedState::setAlgorithm); SQUALL_COMPRESSED_ALGO is one
// of the other three.
enum class CompressedAlgo : uint8_t { kAuto, kTwoPhase, kAllGather, kAutoBytes };

struct Options {
  std::chrono::milliseconds timeout{300000};              // SQUALL_TIMEOUT_S
  AllReduceAlgo allReduceAlgo = AllReduceAlgo::kAuto;     // SQUALL_ALLREDUCE_ALGO
  size_t allReduceSmallBytes = 32768;                     // SQUALL_ALLREDUCE_SMALL_BYTES
  size_t allReduceRingBytes = 262144;                     // SQUALL_ALLREDUCE_RING_BYTES
  CompressedAlgo compressedAlgo = CompressedAlgo::kAuto;  // SQUALL_COMPRESSED_ALGO
  size_t segmentBytes = 1 << 20;                          // SQUALL_SEGMENT_BYTES; 0: one
  size_t ringMaxSegments = 16;                            // SQUALL_RING_MAX_SEGMENTS (0: no cap)
  double netMbps = 10000.0;                               // SQUALL_NET_MBPS
  double netLatencyUs = 50.0;                             // SQUALL_NET_LATENCY_US

  // alpha / beta of the network model: the bytes one message latency is worth.
  double latencyBytes() const { return netLatencyUs * 1e-6 * netMbps * 1e6 / 8.0; }

  // Reads the SQUALL_* variables; a value that does not parse keeps the
  // default and is reported once.
  static Options fromEnvironment();
};

// Abort notices. When an operation fails on one rank, that rank sends a
// short notice (step kAbortStep, a neutral descriptor, kAbortBytes of error
// text) to every peer. Every rank posts receives for these notices when an
// operation starts and OpContext::waitAll watches them, so ranks blocked on
// the failed one stop at once with an error naming it instead of waiting for
// the deadline (a ring only detects a mismatch between neighbours).
constexpr uint32_t kAbortStep = 0xffffffffu;
constexpr size_t kAbortBytes = 512;

struct AbortWatch {
  std::vector<std::array<char, kAbortBytes>> reasons;  // outlives the requests below
  std::vector<transport::RequestPtr> requests;         // one per peer, null for self
  bool received = false;  // the operation failed because a peer gave up
};

// Bytes this rank posted to the transport over a communicator's lifetime;
// operations may run on the communicator's worker thread while the
// application reads them.
struct ByteCounters {
  std::atomic<uint64_t> sent{0};
  std::atomic<uint64_t> received{0};
};

struct OpContext {
  transport::Transport* transport;
  uint64_t sequence;
  transport::Descriptor descriptor;
  transport::Deadline deadline;
  const Options* options;
  AbortWatch* abort = nullptr;
  // The previous operation's watch, still posted (see Communicator).
  AbortWatch* previousAbort = nullptr;
  // Scratch owned by the communicator, reused by its operations (they run
  // one at a time): grown as needed, never shrunk or cleared.
  std::vector<uint8_t>* scratch = nullptr;
  ByteCounters* bytes = nullptr;  // null: not counted
  // Whether a peer's abort notice was logged at WARN on this communicator
  // yet: the first is, later ones (usually the same cause again, say a dead
  // peer failing every operation) go to INFO; the caller gets each in full.
  bool* abortLogged = nullptr;
  // The communicator's own transport when `transport` is a view of a
  // subgroup (GroupTransport): waits and error messages use it, so they name
  // global ranks. Null: `transport` is the communicator's.
  transport::Transport* whole = nullptr;

  int rank() const { return transport->rank(); }
  int size() const { return transport->size(); }
  transport::Tag tag(uint32_t step) const { return transport::Tag{sequence, step, descriptor}; }
  Status send(int peer, uint32_t step, const void* data, size_t bytes,
              transport::RequestPtr* request) const {
    SQUALL_TRY(transport->send(peer, tag(step), data, bytes, request));
    if (this->bytes != nullptr) this->bytes->sent.fetch_add(bytes, std::memory_order_relaxed);
    return Status::kOk;
  }
  Status recv(int peer, uint32_t step, void* data, size_t bytes,
              transport::RequestPtr* request) const {
    SQUALL_TRY(transport->recv(peer, tag(step), data, bytes, request));
    if (this->bytes != nullptr) this->bytes->received.fetch_add(bytes, std::memory_order_relaxed);
    return Status::kOk;
  }
  // Waits for every request until the deadline, like Transport::waitAll, and
  // fails early when a peer sends an abort notice.
  Status waitAll(std::span<const transport::RequestPtr> requests) const;
  // Posts a receive from `from` and a send to `to` on the same step and
  // waits for both.
  Status sendRecv(int to, const void* sendData, size_t sendBytes, int from, void* recvData,
                  size_t recvBytes, uint32_t step) const {
    transport::RequestPtr requests[2];
    SQUALL_TRY(recv(from, step, recvData, recvBytes, &requests[0]));
    SQUALL_TRY(send(to, step, sendData, sendBytes, &requests[1]));
    return waitAll(requests);
  }
};

// Posts the abort-notice receives of an operation (every peer).
Status watchForAborts(const OpContext& ctx, AbortWatch* watch);
// Tells every peer that this rank gave up on the operation, with `reason`;
// waits briefly for the notices to leave and never fails.
void sendAbortNotices(const OpContext& ctx, const std::string& reason);

}  // namespace squall::coll
