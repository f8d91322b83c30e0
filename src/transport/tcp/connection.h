// One connected stream socket to one peer, as a stream of tagged messages:
// framing, non-blocking I/O and matching. The TCP transport runs one per peer
// under its progress thread; anything else that owns a connected socket (the
// NCCL net plugin) can drive one on its own.
//
// Framing: each message is the 40-byte header of message_header.h (the whole
// Tag and the payload size) followed by the payload; frames follow each other
// in posting order. A header with another magic or an announced size above
// kMaxMessageBytes means the stream is corrupt.
//
// Matching: an arriving frame goes to the oldest posted receive with the same
// (sequence, step). If its descriptor or size disagree, that receive fails
// with kInvalidUsage describing both sides and the payload is discarded, so
// the stream stays in step. A frame nobody has posted for yet is buffered and
// handed over when its receive is posted. Users that number their messages
// 0, 1, 2, ... in the sequence field therefore get posting-order matching.
//
// Limits: what a peer can make this rank hold is bounded (UnexpectedLimits):
// an unexpected frame's buffer grows as its bytes arrive, never to what its
// header announces, and a peer whose unexpected frames exceed the per-message
// size, the total bytes or the count fails its connection with an error that
// names it and the limit (docs/protocol.md). Frames that match a posted
// receive land in the receive's own buffer and count against nothing.
//
// Failure: end of stream, a reset or a corrupt header fails the connection:
// every pending request completes with kRemoteError naming the peer, and so
// does every later one (frames that had fully arrived stay receivable). The
// failure is said once: at WARN when it failed a request this rank was
// waiting for (a watch does not count) or cut a frame, else at INFO, and at
// WARN later when a request is posted on the failed connection.
//
// Goodbye: an owner that closes on purpose says so first (sayGoodbye), with
// a header-only frame of its own magic. The peer then knows the end of the
// stream that follows is an orderly close, not a crash, and says so.
//
// Threads: a Connection is not thread-safe. Its owner serialises every call,
// including cancel() from a request's destructor, typically with one mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "src/transport/message_header.h"
#include "src/transport/transport.h"

namespace squall::transport::tcp {

class Connection;
struct Unexpected;

// Bounds on the frames a peer may send before their receive is posted
// (SQUALL_UNEXPECTED_MESSAGE_MAX_BYTES, SQUALL_UNEXPECTED_MAX_BYTES,
// SQUALL_UNEXPECTED_MAX_MESSAGES), per connection.
struct UnexpectedLimits {
  uint64_t messageBytes = uint64_t{1} << 31;
  uint64_t totalBytes = uint64_t{1} << 32;
  uint64_t messages = 65536;

  static UnexpectedLimits fromEnvironment();
};

// A send or receive posted on a Connection. Owners derive from it to keep
// what their own cancellation needs; the buffer stays valid until the request
// is done or cancelled, after which the connection never touches it.
class ConnectionRequest : public Request {
 public:
  enum class Kind {
    kSend,
    kRecv,      // the message must be exactly bytes() long
    kRecvUpTo,  // any size up to bytes() (NCCL's receives); see received()
    kWatch,     // like kRecv, for a message that may never come (Transport::watch)
  };
  ConnectionRequest(Kind kind, int peer, const Tag& tag, void* data, size_t bytes)
      : Request(peer, bytes), kind_(kind), tag_(tag), data_(static_cast<char*>(data)) {}

  bool isSend() const { return kind_ == Kind::kSend; }
  const Tag& tag() const { return tag_; }
  // Payload bytes a completed receive got (bytes() unless kRecvUpTo).
  size_t received() const { return received_; }

 private:
  friend class Connection;
  const Kind kind_;
  const Tag tag_;
  char* const data_;
  size_t received_ = 0;
  Unexpected* waitingOn_ = nullptr;  // a receive waiting for a buffered frame to finish
};

class Connection {
 public:
  // Takes `fd`, a connected non-blocking stream socket, and closes it when
  // done. fd -1 makes the loop of a rank to itself: sends are copied straight
  // to matching receives. `self` and `peer` only name the ranks in errors.
  Connection(int fd, int self, int peer,
             UnexpectedLimits limits = UnexpectedLimits::fromEnvironment());
  ~Connection();  // closes the socket; call abandon() first if requests may be pending
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Flow control for owners that post receives in the order messages come
  // (the NCCL net plugin): with `hold`, a frame's header is read only while
  // a receive is posted, so a sender nobody receives from is held back by
  // TCP itself instead of being buffered here. Off by default.
  void holdUntilPosted(bool hold) { hold_ = hold; }

  int fd() const { return fd_; }  // -1 once failed
  int peer() const { return peer_; }
  bool failed() const { return failed_; }

  // Never block: a send is written at once as far as the socket takes it
  // when nothing is queued before it; progress() writes the rest.
  void postSend(ConnectionRequest* request);
  void postRecv(ConnectionRequest* request);
  // Withdraws a pending request. A receive being filled switches to
  // discarding; a send partly on the wire is finished from a private copy.
  void cancel(ConnectionRequest* request);

  // Writes queued sends and reads arriving frames until the socket would
  // block either way (so it suits edge-triggered epoll, or plain polling).
  void progress();
  bool wantsWrite() const { return !sends_.empty(); }

  // For an owner closing on purpose, before abandon(): writes the goodbye
  // frame, waiting for room in the socket until `until`. Only between frames
  // (no send queued) and on a connection that has not failed; elsewhere the
  // peer sees the end of the stream as it is. False when nothing was sent.
  bool sayGoodbye(Deadline until);
  // Fails every pending request with `status` (for an owner going away) and
  // returns how many there were. Failure is silent: the owner reports it.
  size_t abandon(Status status);
  // After abandon(): hands the socket to the caller (-1 if none is left),
  // e.g. for closeGracefully().
  int releaseFd();

  // Requests this connection has completed so far; an owner compares it
  // across calls to know when to wake its waiters.
  uint64_t completions() const { return completions_; }

  // Frames buffered before their receive was posted, and the bytes their
  // buffers hold now (which grow as the frames arrive).
  size_t unexpectedMessages() const { return unexpected_.size(); }
  uint64_t unexpectedBytesHeld() const;

 private:
  struct SendOp {
    ConnectionRequest* request;  // nullptr once cancelled mid-frame
    uint8_t header[kMessageHeaderBytes];
    const char* data;
    size_t bytes;
    size_t sent = 0;          // over header + payload
    std::vector<char> owned;  // the remainder of a cancelled, partly sent frame
  };
  struct Key {
    uint64_t sequence;
    uint32_t step;
    // clang-tidy 14 mistakes the defaulted comparison's 0 for a null pointer.
    auto operator<=>(const Key&) const = default;  // NOLINT(modernize-use-nullptr)
  };
  enum class Sink { kNone, kUser, kBuffer, kDiscard };

  static Key keyOf(const Tag& tag) { return {tag.sequence, tag.step}; }
  void finish(ConnectionRequest* request, Status status);
  bool accepts(ConnectionRequest* request, const Tag& tag, uint64_t bytes);
  void fail(Status status, const std::string& why, bool quietIfIdle);
  void failIo(const char* what, int err, bool quietIfIdle);
  void failLater(const char* verb, const char* preposition, const ConnectionRequest* request);
  size_t awaited() const;
  void flushSends();
  void readFrames();
  void onHeader();
  void endPayload();
  void deliver(Unexpected* u, ConnectionRequest* request);
  void eraseUnexpected(Unexpected* u);
  using UnexpectedMap = std::multimap<Key, std::unique_ptr<Unexpected>>;
  UnexpectedMap::iterator dropUnexpected(UnexpectedMap::iterator it);
  enum class Admission { kBuffer, kHold, kFail };
  Admission admitUnexpected(const MessageHeader& h);
  void route(const MessageHeader& h);
  void resumeHeld();
  void growBuffer();
  void sendToSelf(ConnectionRequest* request);

  int fd_;
  int shutFd_ = -1;  // the descriptor after a failure shut it (closed on destruction)
  const bool loopback_;
  const int self_;
  const int peer_;
  bool failed_ = false;
  bool warned_ = false;  // the failure was logged at WARN (once per peer)
  bool hold_ = false;
  Status failure_ = Status::kOk;
  std::string why_;  // the sentence describing the failure
  uint64_t completions_ = 0;
  std::deque<SendOp> sends_;
  std::multimap<Key, ConnectionRequest*> posted_;
  UnexpectedMap unexpected_;
  const UnexpectedLimits limits_;
  uint64_t unexpectedBytes_ = 0;  // announced sizes of the frames in unexpected_
  // A frame too large to buffer, read up to its header and held in the
  // socket until its receive is posted (admitUnexpected).
  bool holding_ = false;
  MessageHeader held_{};
  // The frame being read.
  uint8_t header_[kMessageHeaderBytes];
  size_t headerGot_ = 0;
  Sink sink_ = Sink::kNone;
  uint64_t payloadLeft_ = 0;
  size_t payloadDone_ = 0;
  ConnectionRequest* target_ = nullptr;  // Sink::kUser
  Unexpected* buffer_ = nullptr;         // Sink::kBuffer
  std::vector<char> scratch_;            // Sink::kDiscard
};

// Closes connected sockets without losing what is still queued in them:
// closing a socket whose peer's bytes are unread resets the connection, and
// the reset throws away our own bytes not yet transmitted. So each socket
// shuts down its sending side (the peer gets our bytes, then end of stream),
// reads and drops what arrives until the peer closes too or `until`, and only
// then closes.
void closeGracefully(const std::vector<int>& fds, Deadline until);

}  // namespace squall::transport::tcp
