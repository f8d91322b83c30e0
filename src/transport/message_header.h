// The one header every backend that carries bytes itself (tcp, ucx, mpi)
// puts in front of every payload.
//
// It holds the whole Tag and the payload size. TCP needs it for framing and
// matching; UCX and MPI match on a few low bits of (sequence, step) that fit
// their native tag, and the header lets the receiver check that the message
// it matched is really the one it asked for, and print both sides when it is
// not. The layout is fixed (40 bytes, host byte order: every rank of a job is
// assumed to share it; docs/protocol.md):
//
//   0 magic u32 "SQTF" | 4 step u32 | 8 sequence u64 | 16 payload bytes u64 |
//   24 kind u8, dtype u8, op u8, codec u8 | 28 block u32 | 32 count u64
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <list>
#include <vector>

#include "src/common/status.h"
#include "src/transport/transport.h"

namespace squall::transport {

constexpr size_t kMessageHeaderBytes = 40;
constexpr uint32_t kMessageMagic = 0x46545153;  // "SQTF"
// Larger announced payloads mean a corrupt stream (NCCL's own limit too).
constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 40;

void encodeMessageHeader(const Tag& tag, uint64_t payloadBytes, uint8_t* out);

// Decodes any 40 bytes; the caller judges the magic (and the size).
struct MessageHeader {
  uint32_t magic = 0;
  Tag tag;
  uint64_t payloadBytes = 0;

  bool valid() const { return magic == kMessageMagic && payloadBytes <= kMaxMessageBytes; }
};
MessageHeader decodeMessageHeader(const uint8_t* in);

// The failure of a receive whose matched message has another descriptor or
// size, described the same way on every backend ("rank 1 sent 4000 bytes for
// #3 allreduce ... but this rank (0) posted 8000 bytes for #3 ..."). Returns
// kInvalidUsage.
Status failMismatch(int self, int peer, const Tag& sent, uint64_t sentBytes, const Tag& posted,
                    size_t postedBytes);

// Checks that a matched message is the one a receive expected: `header` holds
// the first `available` bytes of it and `messageBytes` is its full length
// (header included). Fails with kInvalidUsage (failMismatch) when the
// descriptor, the (sequence, step) or the size differ, and with kCorruptData
// when the header is unreadable or disagrees with the length.
Status checkMessageHeader(const char* backend, int self, int peer, const Tag& expected,
                          size_t expectedPayload, const uint8_t* header, size_t available,
                          size_t messageBytes);

// The request of a backend that sends [header, payload] as one message and
// matches receives itself (UCX, MPI): a receive waits in the backend's queue
// until a probe finds its message, whose length then decides where it lands
// (straight into [header, buffer], or whole into a bounce buffer when the
// size is wrong, so the mismatch is reported instead of truncated), and the
// header is checked when it completes. `Derived` is the backend's class.
template <typename Derived>
class HeaderedRequest : public Request {
 public:
  using List = std::list<Derived*>;

  HeaderedRequest(bool isSend, int peer, const Tag& tag, void* data, size_t bytes)
      : Request(peer, bytes), isSend_(isSend), tag_(tag), data_(data) {}

  bool isSend() const { return isSend_; }
  const Tag& tag() const { return tag_; }
  void* data() const { return data_; }
  uint8_t* header() { return header_; }

  // A receive matched to a message of `length` bytes (header included): true
  // when it lands in [header(), data()], else in bounce(length).
  bool fits(size_t length) const { return length == kMessageHeaderBytes + bytes(); }
  uint8_t* bounce(size_t length) {
    bounce_.resize(std::max<size_t>(length, 1));
    return bounce_.data();
  }
  // The status of a receive whose `length`-byte message has fully arrived.
  Status checkReceived(const char* backend, int self, size_t length) {
    const bool bounced = !bounce_.empty();
    Status status =
        checkMessageHeader(backend, self, peer(), tag_, bytes(), bounced ? bounce_.data() : header_,
                           bounced ? bounce_.size() : kMessageHeaderBytes, length);
    bounce_ = {};
    return status;
  }

  bool waiting_ = false;  // a receive not yet matched to a message
  typename List::iterator livePos_;
  typename List::iterator waitPos_;

 private:
  const bool isSend_;
  const Tag tag_;
  void* const data_;
  uint8_t header_[kMessageHeaderBytes];
  std::vector<uint8_t> bounce_;
};

// A backend's pending requests: every one (live) and the receives still
// waiting for their message, in post order.
template <typename R>
struct PendingRequests {
  typename R::List live;
  typename R::List waiting;

  void track(R* r) { r->livePos_ = live.insert(live.end(), r); }
  void queueReceive(R* r) {
    track(r);
    r->waiting_ = true;
    r->waitPos_ = waiting.insert(waiting.end(), r);
  }
  // A waiting receive found its message (it stays live).
  typename R::List::iterator matched(R* r) {
    r->waiting_ = false;
    return waiting.erase(r->waitPos_);
  }
  void untrack(R* r) {
    if (r->waiting_) matched(r);
    live.erase(r->livePos_);
  }
};

}  // namespace squall::transport
