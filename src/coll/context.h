// What an algorithm sees of its operation: the transport, the operation's
// sequence number and descriptor (every message is tagged with both), the
// deadline for every wait, and the communicator's options.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

#include "src/common/status.h"
#include "src/transport/transport.h"

namespace squall::coll {

enum class AllReduceAlgo : uint8_t { kAuto, kRing, kDirect };
enum class CompressedAlgo : uint8_t { kAuto, kTwoPhase, kAllGather };

struct Options {
  std::chrono::milliseconds timeout{300000};              // SQUALL_TIMEOUT_S
  AllReduceAlgo allReduceAlgo = AllReduceAlgo::kAuto;     // SQUALL_ALLREDUCE_ALGO
  size_t allReduceSmallBytes = 32768;                     // SQUALL_ALLREDUCE_SMALL_BYTES
  CompressedAlgo compressedAlgo = CompressedAlgo::kAuto;  // SQUALL_COMPRESSED_ALGO
  size_t segmentBytes = 1 << 20;                          // SQUALL_SEGMENT_BYTES; 0: one

  // Reads the SQUALL_* variables; a value that does not parse keeps the
  // default and is reported once.
  static Options fromEnvironment();
};

struct OpContext {
  transport::Transport* transport;
  uint64_t sequence;
  transport::Descriptor descriptor;
  transport::Deadline deadline;
  const Options* options;

  int rank() const { return transport->rank(); }
  int size() const { return transport->size(); }
  transport::Tag tag(uint32_t step) const { return transport::Tag{sequence, step, descriptor}; }
  Status send(int peer, uint32_t step, const void* data, size_t bytes,
              transport::RequestPtr* request) const {
    return transport->send(peer, tag(step), data, bytes, request);
  }
  Status recv(int peer, uint32_t step, void* data, size_t bytes,
              transport::RequestPtr* request) const {
    return transport->recv(peer, tag(step), data, bytes, request);
  }
  Status waitAll(std::span<const transport::RequestPtr> requests) const {
    return transport->waitAll(requests, deadline);
  }
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

}  // namespace squall::coll
