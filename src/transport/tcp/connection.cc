// See connection.h. The incoming side is a small state machine: collect a
// header, then route its payload to a sink (the matched receive's buffer, a
// buffer for an unexpected frame, or nowhere), then the next header.
#include "src/transport/tcp/connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "src/bootstrap/socket.h"
#include "src/common/params.h"

namespace squall::transport::tcp {

// A frame that arrived (or is arriving) before its receive was posted.
struct Unexpected {
  Tag tag;
  uint64_t bytes = 0;      // the payload size its header announced
  std::vector<char> data;  // what has arrived so far (grown as it does)
  bool complete = false;
  ConnectionRequest* waiter = nullptr;
};

namespace {
constexpr size_t kScratchBytes = size_t{1} << 16;
// An unexpected frame's buffer starts at this and doubles as bytes arrive.
constexpr size_t kFirstGrowth = size_t{1} << 16;
// The goodbye frame: a header of this magic, all else zero (docs/protocol.md).
constexpr uint32_t kGoodbyeMagic = 0x42545153;  // "SQTB"

uint64_t positiveParam(Param param, uint64_t fallback) {
  const int64_t value = paramInt(param);
  return value > 0 ? static_cast<uint64_t>(value) : fallback;
}
}  // namespace

UnexpectedLimits UnexpectedLimits::fromEnvironment() {
  UnexpectedLimits limits;
  limits.messageBytes = positiveParam(Param::kUnexpectedMessageMaxBytes, limits.messageBytes);
  limits.totalBytes = positiveParam(Param::kUnexpectedMaxBytes, limits.totalBytes);
  limits.messages = positiveParam(Param::kUnexpectedMaxMessages, limits.messages);
  return limits;
}

Connection::Connection(int fd, int self, int peer, UnexpectedLimits limits)
    : fd_(fd), loopback_(fd < 0), self_(self), peer_(peer), limits_(limits) {}

uint64_t Connection::unexpectedBytesHeld() const {
  uint64_t held = 0;
  for (const auto& [key, u] : unexpected_) held += u->data.capacity();
  return held;
}

Connection::UnexpectedMap::iterator Connection::dropUnexpected(UnexpectedMap::iterator it) {
  unexpectedBytes_ -= it->second->bytes;
  return unexpected_.erase(it);
}

Connection::~Connection() {
  if (fd_ >= 0) close(fd_);
  if (shutFd_ >= 0) close(shutFd_);
}

void Connection::finish(ConnectionRequest* request, Status status) {
  request->complete(status);
  ++completions_;
}

// False (and `request` failed) when the frame's descriptor or size does not
// fit the receive.
bool Connection::accepts(ConnectionRequest* request, const Tag& tag, uint64_t bytes) {
  bool sizeFits = request->kind_ == ConnectionRequest::Kind::kRecvUpTo ? bytes <= request->bytes()
                                                                       : bytes == request->bytes();
  if (tag.descriptor == request->tag_.descriptor && sizeFits) return true;
  finish(request, failMismatch(self_, peer_, tag, bytes, request->tag_, request->bytes()));
  return false;
}

// The requests someone waits on: every send and receive but the watches,
// and a receive whose frame is arriving.
size_t Connection::awaited() const {
  auto awaits = [](const ConnectionRequest* r) {
    return r != nullptr && r->kind_ != ConnectionRequest::Kind::kWatch;
  };
  size_t n = target_ != nullptr ? 1 : 0;
  for (const SendOp& op : sends_) n += op.request != nullptr ? 1 : 0;
  for (const auto& [key, r] : posted_) n += awaits(r) ? 1 : 0;
  for (const auto& [key, u] : unexpected_) n += awaits(u->waiter) ? 1 : 0;
  return n;
}

void Connection::fail(Status status, const std::string& why, bool quietIfIdle) {
  if (failed_) return;
  failed_ = true;
  failure_ = status;
  why_ = why;
  if (fd_ >= 0) {
    // Shut, not closed: a progress thread may still name the descriptor in
    // epoll_ctl, and a closed number can be reused. It is closed with the
    // connection, after the thread has stopped.
    shutdown(fd_, SHUT_RDWR);
    shutFd_ = fd_;
    fd_ = -1;
  }
  const size_t pending = awaited();
  if (pending == 0 && quietIfIdle) {
    SQUALL_INFO(Subsys::kTransport, "%s", why.c_str());
  } else {
    SQUALL_FAIL(status, Subsys::kTransport, "%s; failing rank %d's %zu pending request(s) with it",
                why.c_str(), self_, pending);
    warned_ = true;
  }
  for (auto& [key, request] : posted_) finish(request, status);
  posted_.clear();
  for (SendOp& op : sends_)
    if (op.request != nullptr) finish(op.request, status);
  sends_.clear();
  if (target_ != nullptr) finish(target_, status);
  target_ = nullptr;
  // Frames that had fully arrived stay receivable; partial ones are gone.
  for (auto it = unexpected_.begin(); it != unexpected_.end();) {
    if (it->second->complete) {
      ++it;
      continue;
    }
    if (it->second->waiter != nullptr) finish(it->second->waiter, status);
    it = dropUnexpected(it);
  }
  buffer_ = nullptr;
  sink_ = Sink::kNone;
}

// A request posted after the connection failed: it carries the failure in
// its description, but the log says it once per peer; a dead peer must not
// fill the log with one line per request of every later operation.
void Connection::failLater(const char* verb, const char* preposition,
                           const ConnectionRequest* request) {
  char text[512];
  std::snprintf(text, sizeof(text), "%s %s %s rank %d: %s", verb, describe(request->tag_).c_str(),
                preposition, peer_, why_.c_str());
  if (warned_) {
    setLastError(text);
    SQUALL_TRACE(Subsys::kTransport, "%s", text);
  } else {
    // The peer left while idle (said at INFO): this is the first time it
    // matters, so it is said here, once.
    SQUALL_FAIL(failure_, Subsys::kTransport, "%s", text);
    warned_ = true;
  }
}

void Connection::failIo(const char* what, int err, bool quietIfIdle) {
  char why[256];
  if (err == 0)
    std::snprintf(why, sizeof(why), "rank %d %s", peer_, what);
  else
    std::snprintf(why, sizeof(why), "rank %d %s: %s", peer_, what, std::strerror(err));
  fail(Status::kRemoteError, why, quietIfIdle);
}

bool Connection::sayGoodbye(Deadline until) {
  if (loopback_ || failed_ || fd_ < 0 || !sends_.empty()) return false;
  uint8_t frame[kMessageHeaderBytes] = {};
  std::memcpy(frame, &kGoodbyeMagic, sizeof(kGoodbyeMagic));
  int err = 0;
  return bootstrap::sendAll(fd_, frame, sizeof(frame), until, &err) == bootstrap::Io::kOk;
}

size_t Connection::abandon(Status status) {
  size_t pending = 0;
  for (auto& [key, r] : posted_) finish(r, status), ++pending;
  posted_.clear();
  for (SendOp& op : sends_)
    if (op.request != nullptr) finish(op.request, status), ++pending;
  sends_.clear();
  if (target_ != nullptr) finish(target_, status), ++pending;
  target_ = nullptr;
  for (auto& [key, u] : unexpected_)
    if (u->waiter != nullptr) finish(u->waiter, status), ++pending;
  unexpected_.clear();
  unexpectedBytes_ = 0;
  buffer_ = nullptr;
  sink_ = Sink::kNone;
  failed_ = true;
  failure_ = status;
  why_ = "the connection was shut down";
  return pending;
}

int Connection::releaseFd() {
  int fd = fd_;
  fd_ = -1;
  failed_ = true;
  return fd;
}

void closeGracefully(const std::vector<int>& fds, Deadline until) {
  std::vector<pollfd> open;
  for (int fd : fds) {
    if (fd < 0) continue;
    if (shutdown(fd, SHUT_WR) == 0) {
      open.push_back({fd, POLLIN, 0});
    } else {
      close(fd);  // not connected any more: nothing to hand over
    }
  }
  std::vector<char> sink(kScratchBytes);
  while (!open.empty()) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0 || poll(open.data(), open.size(), static_cast<int>(left)) < 0) break;
    for (size_t i = open.size(); i-- > 0;) {
      if (open[i].revents == 0) continue;
      ssize_t n;
      do {
        n = recv(open[i].fd, sink.data(), sink.size(), MSG_DONTWAIT);
      } while (n > 0 || (n < 0 && errno == EINTR));
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      close(open[i].fd);  // the peer closed its side (or the connection broke)
      open.erase(open.begin() + static_cast<long>(i));
    }
  }
  for (const pollfd& p : open) close(p.fd);
}

void Connection::flushSends() {
  while (!failed_ && !sends_.empty()) {
    SendOp& op = sends_.front();
    iovec iov[2];
    int count = 0;
    if (op.sent < kMessageHeaderBytes)
      iov[count++] = {op.header + op.sent, kMessageHeaderBytes - op.sent};
    size_t payloadSent = op.sent > kMessageHeaderBytes ? op.sent - kMessageHeaderBytes : 0;
    if (op.bytes > payloadSent)
      iov[count++] = {const_cast<char*>(op.data) + payloadSent, op.bytes - payloadSent};
    ssize_t n = 0;
    if (count > 0) {
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(count);
      n = sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;  // writable again: progress()
        failIo("closed its connection (it may have crashed)", errno, false);
        return;
      }
    }
    op.sent += static_cast<size_t>(n);
    if (op.sent == kMessageHeaderBytes + op.bytes) {
      if (op.request != nullptr) finish(op.request, Status::kOk);
      sends_.pop_front();
    }
  }
}

void Connection::deliver(Unexpected* u, ConnectionRequest* request) {
  if (!u->data.empty()) std::memcpy(request->data_, u->data.data(), u->data.size());
  request->received_ = u->data.size();
  request->waitingOn_ = nullptr;
  finish(request, Status::kOk);
}

void Connection::eraseUnexpected(Unexpected* u) {
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it)
    if (it->second.get() == u) {
      dropUnexpected(it);
      return;
    }
}

// A complete header has arrived: decide where its payload goes.
void Connection::onHeader() {
  const MessageHeader h = decodeMessageHeader(header_);
  headerGot_ = 0;
  if (h.magic == kGoodbyeMagic && h.payloadBytes == 0) {
    // The peer destroyed its transport on purpose; it sends nothing more.
    // That is an error here only if this rank still waits for it.
    char why[320];
    if (awaited() == 0)
      std::snprintf(why, sizeof(why),
                    "rank %d closed its connection (it destroyed its communicator)", peer_);
    else
      std::snprintf(why, sizeof(why),
                    "rank %d destroyed its communicator while rank %d still had messages to "
                    "exchange with it (every rank must run the same collectives, and wait for "
                    "them, before destroying its communicator)",
                    peer_, self_);
    fail(Status::kRemoteError, why, true);
    return;
  }
  if (!h.valid()) {
    char why[256];
    std::snprintf(why, sizeof(why),
                  "rank %d sent a malformed frame header (magic 0x%08x, %llu bytes); its "
                  "connection is corrupt and is closed",
                  peer_, h.magic, static_cast<unsigned long long>(h.payloadBytes));
    fail(Status::kRemoteError, why, false);
    return;
  }
  route(h);
}

// Where the payload of header `h` goes: the receive posted for it, a buffer
// for one not yet posted, or nowhere yet (held, see admitUnexpected).
void Connection::route(const MessageHeader& h) {
  const bool wasHolding = holding_;
  holding_ = false;
  payloadLeft_ = h.payloadBytes;
  payloadDone_ = 0;
  auto it = posted_.find(keyOf(h.tag));
  if (it != posted_.end()) {
    ConnectionRequest* request = it->second;
    posted_.erase(it);
    if (accepts(request, h.tag, h.payloadBytes)) {
      sink_ = Sink::kUser;
      target_ = request;
      target_->received_ = h.payloadBytes;
    } else {
      sink_ = Sink::kDiscard;
    }
    return;
  }
  switch (admitUnexpected(h)) {
    case Admission::kFail: return;
    case Admission::kHold:
      if (!wasHolding)
        SQUALL_INFO(Subsys::kTransport,
                    "rank %d sent a %llu-byte message for %s before its receive was posted; it "
                    "is held in the socket (rank %d reads nothing more from rank %d) until that "
                    "receive comes, because buffering it would exceed %s",
                    peer_, static_cast<unsigned long long>(h.payloadBytes), describe(h.tag).c_str(),
                    self_, peer_,
                    h.payloadBytes > limits_.messageBytes ? "SQUALL_UNEXPECTED_MESSAGE_MAX_BYTES"
                                                          : "SQUALL_UNEXPECTED_MAX_BYTES");
      holding_ = true;
      held_ = h;
      payloadLeft_ = 0;
      return;
    case Admission::kBuffer: break;
  }
  auto u = std::make_unique<Unexpected>();
  u->tag = h.tag;
  u->bytes = h.payloadBytes;
  unexpectedBytes_ += h.payloadBytes;
  buffer_ = u.get();
  sink_ = Sink::kBuffer;
  unexpected_.emplace(keyOf(h.tag), std::move(u));
}

// Whether the frame `h`, which nobody has posted a receive for, may be
// buffered. One that would take this peer past the bytes it may make this
// rank buffer is held instead: its header is kept, nothing more is read from
// the socket, and TCP holds the sender back until the receive is posted
// (collectives send whole buffers, so a legitimate message can be larger
// than any buffer worth keeping for it). Too many messages is a flood, not a
// large message, and fails the connection, naming the peer and the limit.
Connection::Admission Connection::admitUnexpected(const MessageHeader& h) {
  if (h.payloadBytes > limits_.messageBytes ||
      h.payloadBytes > limits_.totalBytes - std::min(unexpectedBytes_, limits_.totalBytes))
    return Admission::kHold;
  if (unexpected_.size() < limits_.messages) return Admission::kBuffer;
  char why[512];
  std::snprintf(why, sizeof(why),
                "rank %d sent a %llu-byte message for %s before its receive was posted, with "
                "%zu message(s) of %llu bytes from it already waiting; that exceeds "
                "SQUALL_UNEXPECTED_MAX_MESSAGES=%llu, so rank %d closes its connection to rank "
                "%d (raise the limit if the job really sends that many ahead of its receives)",
                peer_, static_cast<unsigned long long>(h.payloadBytes), describe(h.tag).c_str(),
                unexpected_.size(), static_cast<unsigned long long>(unexpectedBytes_),
                static_cast<unsigned long long>(limits_.messages), self_, peer_);
  fail(Status::kRemoteError, why, false);
  return Admission::kFail;
}

// A held frame goes on once a receive is posted for it, or once consumed
// frames made room to buffer it.
void Connection::resumeHeld() {
  if (!holding_ || failed_) return;
  const MessageHeader h = held_;
  route(h);
  if (!holding_ && !loopback_) readFrames();
}

// Makes room in the buffered frame for more of its bytes: the buffer doubles
// (from kFirstGrowth) up to the announced size, so memory follows what the
// peer actually sent.
void Connection::growBuffer() {
  std::vector<char>& data = buffer_->data;
  if (payloadDone_ < data.size()) return;
  const uint64_t next = std::max<uint64_t>(kFirstGrowth, 2 * static_cast<uint64_t>(data.size()));
  try {
    data.resize(static_cast<size_t>(std::min<uint64_t>(buffer_->bytes, next)));
  } catch (const std::bad_alloc&) {
    char why[256];
    std::snprintf(why, sizeof(why),
                  "rank %d sent a %llu-byte message before its receive was posted and this "
                  "rank ran out of memory buffering it",
                  peer_, static_cast<unsigned long long>(buffer_->bytes));
    fail(Status::kRemoteError, why, false);
  }
}

// The current frame's payload is all in.
void Connection::endPayload() {
  if (sink_ == Sink::kUser) {
    finish(target_, Status::kOk);
    target_ = nullptr;
  } else if (sink_ == Sink::kBuffer) {
    Unexpected* u = buffer_;
    u->complete = true;
    buffer_ = nullptr;
    if (u->waiter != nullptr) {
      deliver(u, u->waiter);
      eraseUnexpected(u);
    }
  }
  sink_ = Sink::kNone;
}

void Connection::readFrames() {
  while (!failed_) {
    // A zero-byte payload completes as soon as its header is in.
    if (sink_ != Sink::kNone && payloadLeft_ == 0) endPayload();
    char* dst;
    size_t want;
    if (sink_ == Sink::kNone) {
      if (holding_) return;                                     // until resumeHeld()
      if (hold_ && headerGot_ == 0 && posted_.empty()) return;  // TCP holds the sender back
      dst = reinterpret_cast<char*>(header_) + headerGot_;
      want = kMessageHeaderBytes - headerGot_;
    } else if (sink_ == Sink::kUser) {
      dst = target_->data_ + payloadDone_;
      want = payloadLeft_;
    } else if (sink_ == Sink::kBuffer) {
      growBuffer();
      if (failed_) return;
      dst = buffer_->data.data() + payloadDone_;
      want = buffer_->data.size() - payloadDone_;
    } else {
      if (scratch_.empty()) scratch_.resize(kScratchBytes);
      dst = scratch_.data();
      want = std::min<uint64_t>(payloadLeft_, scratch_.size());
    }
    ssize_t n = recv(fd_, dst, want, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      bool midFrame = sink_ != Sink::kNone || headerGot_ != 0;
      failIo("closed its connection (it may have crashed)", n == 0 ? 0 : errno, !midFrame);
      return;
    }
    if (sink_ == Sink::kNone) {
      headerGot_ += static_cast<size_t>(n);
      if (headerGot_ == kMessageHeaderBytes) onHeader();
    } else {
      payloadDone_ += static_cast<size_t>(n);
      payloadLeft_ -= static_cast<size_t>(n);
    }
  }
}

void Connection::progress() {
  if (loopback_ || failed_) return;
  flushSends();
  readFrames();
}

void Connection::cancel(ConnectionRequest* request) {
  if (request->isSend()) {
    for (auto it = sends_.begin(); it != sends_.end(); ++it) {
      if (it->request != request) continue;
      if (it->sent == 0) {
        SQUALL_TRACE(Subsys::kTransport, "cancelled send %s to rank %d before it started",
                     describe(request->tag_).c_str(), peer_);
        sends_.erase(it);
      } else {
        SQUALL_TRACE(Subsys::kTransport,
                     "cancelled send %s to rank %d mid-frame; finishing it from a copy",
                     describe(request->tag_).c_str(), peer_);
        // Part of the frame is on the wire; finish it from a private copy so
        // the stream stays in step.
        size_t payloadSent = it->sent > kMessageHeaderBytes ? it->sent - kMessageHeaderBytes : 0;
        it->owned.assign(it->data + payloadSent, it->data + it->bytes);
        it->data = it->owned.data();
        it->bytes -= payloadSent;
        it->sent -= payloadSent;  // header progress is kept, the payload restarts at owned
        it->request = nullptr;
      }
      return;
    }
    return;
  }
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if (it->second == request) {
      posted_.erase(it);
      return;
    }
  }
  if (target_ == request) {
    SQUALL_TRACE(Subsys::kTransport, "cancelled receive %s from rank %d mid-frame; discarding",
                 describe(request->tag_).c_str(), peer_);
    target_ = nullptr;
    sink_ = Sink::kDiscard;
    return;
  }
  if (Unexpected* u = request->waitingOn_) {
    // The frame is still arriving; it belonged to this receive, so drop it.
    SQUALL_TRACE(Subsys::kTransport, "cancelled receive %s from rank %d while buffering",
                 describe(request->tag_).c_str(), peer_);
    if (buffer_ == u) {
      buffer_ = nullptr;
      sink_ = Sink::kDiscard;
    }
    eraseUnexpected(u);
  }
}

void Connection::sendToSelf(ConnectionRequest* request) {
  auto it = posted_.find(keyOf(request->tag_));
  if (it != posted_.end()) {
    ConnectionRequest* recv = it->second;
    posted_.erase(it);
    if (accepts(recv, request->tag_, request->bytes())) {
      if (request->bytes() > 0) std::memcpy(recv->data_, request->data_, request->bytes());
      recv->received_ = request->bytes();
      finish(recv, Status::kOk);
    }
  } else {
    auto u = std::make_unique<Unexpected>();
    u->tag = request->tag_;
    u->bytes = request->bytes();
    u->data.assign(request->data_, request->data_ + request->bytes());
    u->complete = true;
    unexpectedBytes_ += u->bytes;
    unexpected_.emplace(keyOf(request->tag_), std::move(u));
  }
  finish(request, Status::kOk);
}

void Connection::postSend(ConnectionRequest* request) {
  if (loopback_) return sendToSelf(request);
  if (failed_) {
    failLater("cannot send", "to", request);
    return finish(request, failure_);
  }
  SendOp op{};
  op.request = request;
  encodeMessageHeader(request->tag_, request->bytes(), op.header);
  op.data = request->data_;
  op.bytes = request->bytes();
  sends_.push_back(std::move(op));
  if (sends_.size() == 1) flushSends();
}

void Connection::postRecv(ConnectionRequest* request) {
  Key key = keyOf(request->tag_);
  for (auto it = unexpected_.lower_bound(key); it != unexpected_.end() && it->first == key; ++it) {
    Unexpected* u = it->second.get();
    if (u->waiter != nullptr) continue;
    if (!accepts(request, u->tag, u->bytes)) {
      // The mismatched frame is consumed with the failed receive.
      if (buffer_ == u) {
        buffer_ = nullptr;
        sink_ = Sink::kDiscard;
      }
      dropUnexpected(it);
      return;
    }
    if (u->complete) {
      deliver(u, request);
      dropUnexpected(it);
      resumeHeld();  // the bytes it held may make room for a held frame
    } else {
      u->waiter = request;
      request->waitingOn_ = u;
    }
    return;
  }
  if (failed_) {
    // A watch waits for nothing the peer owes: the next request that does
    // says why the connection is gone.
    if (request->kind_ == ConnectionRequest::Kind::kWatch)
      SQUALL_TRACE(Subsys::kTransport, "watch %s from rank %d ends at once: %s",
                   describe(request->tag_).c_str(), peer_, why_.c_str());
    else
      failLater("cannot receive", "from", request);
    return finish(request, failure_);
  }
  posted_.emplace(key, request);
  if (holding_ && keyOf(held_.tag) == key) {
    resumeHeld();
  } else if (hold_ && !loopback_) {
    readFrames();  // a held-back frame may be waiting for this receive
  }
}

}  // namespace squall::transport::tcp
