// The transport interface: tagged byte messages between the ranks of a group.
//
// A collective posts receives and sends as Requests and waits for them; the
// backend moves the bytes. Every message carries a Tag: the operation's
// sequence number on its communicator, the message's step within that
// operation, and the operation's descriptor. A receive matches a message from
// its peer by (sequence, step); if the descriptor or the size differs, the
// receive fails with an error that prints both sides, so ranks that called
// different collectives get a clear error instead of garbage.
//
// Backends (local: ranks as threads in one process; tcp; ucx; mpi) implement
// the same few virtual functions and publish one factory each. The
// conformance suite in tests/unit/transport_test.cc runs against all of them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "src/common/status.h"
#include "src/common/types.h"

namespace squall::transport {

// What an operation is; every rank of a collective must agree on all of it.
struct Descriptor {
  CollKind kind = CollKind::kNone;
  DataType dtype = DataType::kF32;
  ReduceOp op = ReduceOp::kSum;
  uint8_t codec = 0;   // squallCodec_t of a compressed collective
  uint32_t block = 0;  // the codec block of a compressed collective; a broadcast's root
  uint64_t count = 0;  // elements

  bool operator==(const Descriptor&) const = default;
};

struct Tag {
  uint64_t sequence = 0;  // operation number on the communicator
  uint32_t step = 0;      // message index within the operation
  Descriptor descriptor;
};

// "#12 allreduce float32 sum, 1000 elements" (for error messages).
std::string describe(const Tag& tag);

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// How a thread that waits for a message spends the time before it sleeps:
// polling the network itself for `spin` first takes a message that lands
// within microseconds without the two thread wakeups of a hand-off (the
// progress thread's or the event descriptor's, then the waiter's). It pays
// only where the rank owns a core; where ranks share cores the polling takes
// the CPU from the peer being waited for (core/transports.cc decides).
struct WaitOptions {
  std::chrono::microseconds spin{0};
};

// One posted send or receive. The backend completes it exactly once. The
// buffer must stay valid until the request is done or destroyed; destroying
// a pending request cancels it, after which the backend never touches its
// buffer again.
class Request {
 public:
  Request(int peer, size_t bytes) : peer_(peer), bytes_(bytes) {}
  virtual ~Request() = default;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  bool done() const { return state_.load(std::memory_order_acquire) != kPending; }
  // Valid once done(): kOk, or the error that ended it (already described).
  Status status() const { return status_; }
  int peer() const { return peer_; }
  size_t bytes() const { return bytes_; }

  // The sentence that described the failure, wherever it was detected (often
  // a backend's progress thread); waitAll makes it the waiter's last error.
  const std::string& error() const { return error_; }

  // Called by the backend, once, after the failure (if any) was described
  // with SQUALL_FAIL on the calling thread.
  void complete(Status status) {
    status_ = status;
    if (status != Status::kOk) error_ = lastError();
    state_.store(kDone, std::memory_order_release);
  }

 private:
  static constexpr int kPending = 0;
  static constexpr int kDone = 1;
  std::atomic<int> state_{kPending};
  Status status_ = Status::kOk;
  std::string error_;
  int peer_;
  size_t bytes_;
};

using RequestPtr = std::unique_ptr<Request>;

// The status of a failed request, with its description made this thread's
// last error (the failure may have been detected on a progress thread).
Status failureOf(const Request& request);

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;

  // Posting never blocks on the peer. A send to oneself is allowed.
  virtual Status send(int peer, const Tag& tag, const void* data, size_t bytes,
                      RequestPtr* request) = 0;
  virtual Status recv(int peer, const Tag& tag, void* data, size_t bytes, RequestPtr* request) = 0;
  // A receive for a message the peer sends only if something goes wrong
  // (an abort notice): it may stay pending for as long as the peer lives.
  // The connection's end fails it like any receive, but a backend that says
  // at WARN how many requests a peer's departure failed does not count it,
  // so a peer that leaves while this rank waits only for such a message is
  // no error. The default is recv().
  virtual Status watch(int peer, const Tag& tag, void* data, size_t bytes, RequestPtr* request);

  // Advances outstanding requests without blocking for long. Backends with a
  // progress thread may do nothing here.
  virtual Status progress() = 0;

  // Blocks until a request may have advanced, or until `until`. The default
  // polls progress(); backends with a progress thread sleep on a condition
  // variable instead, so ranks that share a core do not steal it by spinning.
  virtual Status waitForActivity(Deadline until);

  // Waits for every request until `deadline`. Returns the first failure, or
  // kTimeout naming the peers whose requests are still pending.
  Status waitAll(std::span<const RequestPtr> requests, Deadline deadline);
};

}  // namespace squall::transport
