// TCP transport: a full mesh of non-blocking sockets and one progress thread.
//
// Setup: every rank listens on an ephemeral port of the interface it reaches
// the bootstrap root from; the addresses are exchanged with allGather. Rank i
// connects to every rank j > i and introduces itself with a Hello (magic, job
// secret, from, to); rank j accepts connections until every lower rank is
// present, dropping (and logging) any connection whose Hello is wrong.
//
// Wire format: each message is a 40-byte header {magic, step, sequence,
// payload bytes, descriptor} followed by the payload. A connection carries
// frames back to back in posting order.
//
// Progress: all sockets are registered edge-triggered with one epoll set.
// The progress thread, on any event, writes queued sends until the socket is
// full and reads until it is empty. A posting thread also tries to write its
// send at once, so a small message leaves without a thread switch.
//
// Matching: a frame's header is matched against the receives posted for its
// peer by (sequence, step), oldest first. A match with the same descriptor
// and size is read straight into the user's buffer. A mismatch fails that
// receive with both sides described and the payload is discarded, so the
// stream stays in step. A frame nobody has posted for yet is buffered
// ("unexpected") and handed over when its receive is posted.
//
// Concurrency: one mutex guards all state, including the reads into user
// buffers. Destroying a pending request takes the same mutex and detaches the
// request (a receive in flight is switched to discarding; a send already
// partly on the wire has its remainder copied so the frame can be finished),
// so the backend never touches a cancelled request's buffer afterwards.
//
// Failures: a closed or reset connection, or a malformed header (bad magic,
// absurd length), marks the peer failed: its pending requests fail with
// kRemoteError naming it, and so does every later request with it (messages
// that had fully arrived before stay receivable).
#include "src/transport/tcp/tcp_transport.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "src/bootstrap/socket.h"
#include "src/common/params.h"

namespace squall::transport {
namespace {

using bootstrap::Io;
using bootstrap::SocketAddress;
using bootstrap::WireAddress;

constexpr uint32_t kFrameMagic = 0x46545153;  // "SQTF"
constexpr uint32_t kHelloMagic = 0x48545153;  // "SQTH"
constexpr uint32_t kHelloVersion = 1;
constexpr uint64_t kMaxFrameBytes = 1ull << 40;
constexpr size_t kHeaderBytes = 40;
constexpr size_t kSecretBytes = 16;

struct Hello {
  uint32_t magic;
  uint32_t version;
  uint8_t secret[kSecretBytes];
  int32_t from;
  int32_t to;
  int32_t nranks;
  int32_t reserved;
};

// Header layout (host byte order; every supported host is little-endian):
//   0 magic u32 | 4 step u32 | 8 sequence u64 | 16 payload bytes u64 |
//   24 kind u8, dtype u8, op u8, codec u8 | 28 block u32 | 32 count u64
void encodeHeader(const Tag& tag, uint64_t bytes, uint8_t* out) {
  const Descriptor& d = tag.descriptor;
  uint8_t small[4] = {static_cast<uint8_t>(d.kind), static_cast<uint8_t>(d.dtype),
                      static_cast<uint8_t>(d.op), d.codec};
  std::memcpy(out + 0, &kFrameMagic, 4);
  std::memcpy(out + 4, &tag.step, 4);
  std::memcpy(out + 8, &tag.sequence, 8);
  std::memcpy(out + 16, &bytes, 8);
  std::memcpy(out + 24, small, 4);
  std::memcpy(out + 28, &d.block, 4);
  std::memcpy(out + 32, &d.count, 8);
}

void decodeHeader(const uint8_t* in, uint32_t* magic, Tag* tag, uint64_t* bytes) {
  Descriptor& d = tag->descriptor;
  std::memcpy(magic, in + 0, 4);
  std::memcpy(&tag->step, in + 4, 4);
  std::memcpy(&tag->sequence, in + 8, 8);
  std::memcpy(bytes, in + 16, 8);
  d.kind = static_cast<CollKind>(in[24]);
  d.dtype = static_cast<DataType>(in[25]);
  d.op = static_cast<ReduceOp>(in[26]);
  d.codec = in[27];
  std::memcpy(&d.block, in + 28, 4);
  std::memcpy(&d.count, in + 32, 8);
}

struct Key {
  uint64_t sequence;
  uint32_t step;
  auto operator<=>(const Key&) const = default;
};

Key keyOf(const Tag& tag) { return {tag.sequence, tag.step}; }

struct Core;

class TcpRequest final : public Request {
 public:
  TcpRequest(std::shared_ptr<Core> core, bool isSend, int peer, const Tag& tag, char* data,
             size_t bytes)
      : Request(peer, bytes), core_(std::move(core)), isSend_(isSend), tag_(tag), data_(data) {}
  ~TcpRequest() override;

  std::shared_ptr<Core> core_;
  bool isSend_;
  Tag tag_;
  char* data_;
  struct Unexpected* waitingOn_ = nullptr;  // a recv waiting for a buffered frame to finish
};

// A frame that arrived (or is arriving) before its receive was posted.
struct Unexpected {
  Tag tag;
  std::vector<char> data;
  bool complete = false;
  TcpRequest* waiter = nullptr;
};

struct SendOp {
  TcpRequest* request;  // nullptr once cancelled mid-frame
  uint8_t header[kHeaderBytes];
  const char* data;
  size_t bytes;
  size_t sent = 0;          // over header + payload
  std::vector<char> owned;  // the remainder of a cancelled, partly sent frame
};

enum class Sink { kNone, kUser, kBuffer, kDiscard };

struct Peer {
  int fd = -1;
  bool failed = false;
  Status failure = Status::kOk;
  std::string why;  // the sentence describing the failure
  std::deque<SendOp> sends;
  std::multimap<Key, TcpRequest*> posted;
  std::multimap<Key, std::unique_ptr<Unexpected>> unexpected;
  // Incoming frame state.
  uint8_t header[kHeaderBytes];
  size_t headerGot = 0;
  Sink sink = Sink::kNone;
  uint64_t payloadLeft = 0;
  size_t payloadDone = 0;
  TcpRequest* target = nullptr;  // Sink::kUser
  Unexpected* buffer = nullptr;  // Sink::kBuffer
};

struct Core {
  int rank = 0;
  int size = 0;
  std::mutex mutex;
  std::condition_variable activity;
  uint64_t generation = 0;  // bumped whenever a request completes
  bool closed = false;
  std::vector<Peer> peers;
  std::vector<char> scratch = std::vector<char>(1 << 16);

  // All of these run with `mutex` held.
  void finish(TcpRequest* request, Status status) {
    request->complete(status);
    ++generation;
  }
  void failPeer(int p, Status status, const std::string& why, bool quietIfIdle);
  void flushSends(int p);
  void readFrames(int p);
  void onHeader(int p);
  bool matchPosted(int p, TcpRequest* request, const Tag& tag, uint64_t bytes);
  void deliverUnexpected(Unexpected* u, TcpRequest* request);
  void cancel(TcpRequest* request);
  void postSend(TcpRequest* request);
  void postRecv(TcpRequest* request);
  void sendToSelf(TcpRequest* request);
};

TcpRequest::~TcpRequest() {
  if (done()) return;
  std::lock_guard<std::mutex> lock(core_->mutex);
  if (!done()) core_->cancel(this);
}

// Fails `request` (a receive) because the frame's descriptor or size differs.
// Returns false when they agree.
bool Core::matchPosted(int p, TcpRequest* request, const Tag& tag, uint64_t bytes) {
  if (tag.descriptor == request->tag_.descriptor && bytes == request->bytes()) return true;
  SQUALL_FAIL(Status::kInvalidUsage, Subsys::kTransport,
              "rank %d sent %llu bytes for %s but this rank (%d) posted %zu bytes for %s: the "
              "ranks called different collectives or counts",
              p, static_cast<unsigned long long>(bytes), describe(tag).c_str(), rank,
              request->bytes(), describe(request->tag_).c_str());
  finish(request, Status::kInvalidUsage);
  return false;
}

void Core::failPeer(int p, Status status, const std::string& why, bool quietIfIdle) {
  Peer& peer = peers[static_cast<size_t>(p)];
  if (peer.failed) return;
  peer.failed = true;
  peer.failure = status;
  peer.why = why;
  if (peer.fd >= 0) {
    close(peer.fd);  // also leaves the epoll set
    peer.fd = -1;
  }
  size_t pending = peer.posted.size() + peer.sends.size() + (peer.target != nullptr ? 1 : 0);
  for (auto& [key, u] : peer.unexpected)
    if (u->waiter != nullptr) ++pending;
  if (pending == 0 && quietIfIdle) {
    SQUALL_INFO(Subsys::kTransport, "%s", why.c_str());
  } else {
    SQUALL_FAIL(status, Subsys::kTransport, "%s; failing rank %d's %zu pending request(s) with it",
                why.c_str(), rank, pending);
  }
  for (auto& [key, request] : peer.posted) finish(request, status);
  peer.posted.clear();
  for (SendOp& op : peer.sends)
    if (op.request != nullptr) finish(op.request, status);
  peer.sends.clear();
  if (peer.target != nullptr) finish(peer.target, status);
  peer.target = nullptr;
  // Frames that had fully arrived stay receivable; partial ones are gone.
  for (auto it = peer.unexpected.begin(); it != peer.unexpected.end();) {
    if (it->second->complete) {
      ++it;
      continue;
    }
    if (it->second->waiter != nullptr) finish(it->second->waiter, status);
    it = peer.unexpected.erase(it);
  }
  peer.buffer = nullptr;
  peer.sink = Sink::kNone;
}

void Core::flushSends(int p) {
  Peer& peer = peers[static_cast<size_t>(p)];
  while (!peer.failed && !peer.sends.empty()) {
    SendOp& op = peer.sends.front();
    iovec iov[2];
    int count = 0;
    if (op.sent < kHeaderBytes) iov[count++] = {op.header + op.sent, kHeaderBytes - op.sent};
    size_t payloadSent = op.sent > kHeaderBytes ? op.sent - kHeaderBytes : 0;
    if (op.bytes > payloadSent)
      iov[count++] = {const_cast<char*>(op.data) + payloadSent, op.bytes - payloadSent};
    ssize_t n = 0;
    if (count > 0) {
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(count);
      n = sendmsg(peer.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;  // EPOLLOUT will call again
        int err = errno;
        char why[256];
        std::snprintf(why, sizeof(why), "rank %d closed its connection (it may have crashed): %s",
                      p, std::strerror(err));
        failPeer(p, Status::kRemoteError, why, false);
        return;
      }
    }
    op.sent += static_cast<size_t>(n);
    if (op.sent == kHeaderBytes + op.bytes) {
      if (op.request != nullptr) finish(op.request, Status::kOk);
      peer.sends.pop_front();
    }
  }
}

void Core::deliverUnexpected(Unexpected* u, TcpRequest* request) {
  if (!u->data.empty()) std::memcpy(request->data_, u->data.data(), u->data.size());
  request->waitingOn_ = nullptr;
  finish(request, Status::kOk);
}

// A complete header has arrived from peer p: decide where its payload goes.
void Core::onHeader(int p) {
  Peer& peer = peers[static_cast<size_t>(p)];
  uint32_t magic = 0;
  Tag tag;
  uint64_t bytes = 0;
  decodeHeader(peer.header, &magic, &tag, &bytes);
  peer.headerGot = 0;
  if (magic != kFrameMagic || bytes > kMaxFrameBytes) {
    char why[256];
    std::snprintf(why, sizeof(why),
                  "rank %d sent a malformed frame header (magic 0x%08x, %llu bytes); its "
                  "connection is corrupt and is closed",
                  p, magic, static_cast<unsigned long long>(bytes));
    failPeer(p, Status::kRemoteError, why, false);
    return;
  }
  peer.payloadLeft = bytes;
  peer.payloadDone = 0;
  auto it = peer.posted.find(keyOf(tag));
  if (it != peer.posted.end()) {
    TcpRequest* request = it->second;
    peer.posted.erase(it);
    if (matchPosted(p, request, tag, bytes)) {
      peer.sink = Sink::kUser;
      peer.target = request;
    } else {
      peer.sink = Sink::kDiscard;
    }
  } else {
    auto u = std::make_unique<Unexpected>();
    u->tag = tag;
    try {
      u->data.resize(bytes);
    } catch (const std::bad_alloc&) {
      char why[256];
      std::snprintf(why, sizeof(why),
                    "rank %d sent a %llu-byte message before its receive was posted and it "
                    "cannot be buffered (out of memory)",
                    p, static_cast<unsigned long long>(bytes));
      failPeer(p, Status::kRemoteError, why, false);
      return;
    }
    peer.buffer = u.get();
    peer.sink = Sink::kBuffer;
    peer.unexpected.emplace(keyOf(tag), std::move(u));
  }
}

void Core::readFrames(int p) {
  Peer& peer = peers[static_cast<size_t>(p)];
  while (!peer.failed) {
    // A zero-byte payload completes as soon as its header is in.
    if (peer.sink != Sink::kNone && peer.payloadLeft == 0) {
      if (peer.sink == Sink::kUser) {
        finish(peer.target, Status::kOk);
        peer.target = nullptr;
      } else if (peer.sink == Sink::kBuffer) {
        Unexpected* u = peer.buffer;
        u->complete = true;
        peer.buffer = nullptr;
        if (u->waiter != nullptr) {
          TcpRequest* waiter = u->waiter;
          deliverUnexpected(u, waiter);
          for (auto it = peer.unexpected.begin(); it != peer.unexpected.end(); ++it)
            if (it->second.get() == u) {
              peer.unexpected.erase(it);
              break;
            }
        }
      }
      peer.sink = Sink::kNone;
    }
    char* dst;
    size_t want;
    if (peer.sink == Sink::kNone) {
      dst = reinterpret_cast<char*>(peer.header) + peer.headerGot;
      want = kHeaderBytes - peer.headerGot;
    } else if (peer.sink == Sink::kUser) {
      dst = peer.target->data_ + peer.payloadDone;
      want = peer.payloadLeft;
    } else if (peer.sink == Sink::kBuffer) {
      dst = peer.buffer->data.data() + peer.payloadDone;
      want = peer.payloadLeft;
    } else {
      dst = scratch.data();
      want = std::min<uint64_t>(peer.payloadLeft, scratch.size());
    }
    ssize_t n = recv(peer.fd, dst, want, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) {
      char why[256];
      if (n == 0)
        std::snprintf(why, sizeof(why), "rank %d closed its connection (it may have crashed)", p);
      else
        std::snprintf(why, sizeof(why), "rank %d closed its connection (it may have crashed): %s",
                      p, std::strerror(errno));
      bool midFrame = peer.sink != Sink::kNone || peer.headerGot != 0;
      failPeer(p, Status::kRemoteError, why, !midFrame);
      return;
    }
    if (peer.sink == Sink::kNone) {
      peer.headerGot += static_cast<size_t>(n);
      if (peer.headerGot == kHeaderBytes) onHeader(p);
    } else {
      peer.payloadDone += static_cast<size_t>(n);
      peer.payloadLeft -= static_cast<size_t>(n);
    }
  }
}

void Core::cancel(TcpRequest* request) {
  if (closed) return;
  Peer& peer = peers[static_cast<size_t>(request->peer())];
  if (request->isSend_) {
    for (auto it = peer.sends.begin(); it != peer.sends.end(); ++it) {
      if (it->request != request) continue;
      if (it->sent == 0) {
        SQUALL_TRACE(Subsys::kTransport, "cancelled send %s to rank %d before it started",
                     describe(request->tag_).c_str(), request->peer());
        peer.sends.erase(it);
      } else {
        SQUALL_TRACE(Subsys::kTransport,
                     "cancelled send %s to rank %d mid-frame; finishing it from a copy",
                     describe(request->tag_).c_str(), request->peer());
        // Part of the frame is on the wire; finish it from a private copy so
        // the stream stays in step.
        size_t payloadSent = it->sent > kHeaderBytes ? it->sent - kHeaderBytes : 0;
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
  for (auto it = peer.posted.begin(); it != peer.posted.end(); ++it) {
    if (it->second == request) {
      peer.posted.erase(it);
      return;
    }
  }
  if (peer.target == request) {
    SQUALL_TRACE(Subsys::kTransport, "cancelled receive %s from rank %d mid-frame; discarding",
                 describe(request->tag_).c_str(), request->peer());
    peer.target = nullptr;
    peer.sink = Sink::kDiscard;
    return;
  }
  if (Unexpected* u = request->waitingOn_) {
    // The frame is still arriving; it belonged to this receive, so drop it.
    SQUALL_TRACE(Subsys::kTransport, "cancelled receive %s from rank %d while buffering",
                 describe(request->tag_).c_str(), request->peer());
    if (peer.buffer == u) {
      peer.buffer = nullptr;
      peer.sink = Sink::kDiscard;
    }
    for (auto it = peer.unexpected.begin(); it != peer.unexpected.end(); ++it)
      if (it->second.get() == u) {
        peer.unexpected.erase(it);
        break;
      }
  }
}

void Core::sendToSelf(TcpRequest* request) {
  Peer& self = peers[static_cast<size_t>(rank)];
  auto it = self.posted.find(keyOf(request->tag_));
  if (it != self.posted.end()) {
    TcpRequest* recv = it->second;
    self.posted.erase(it);
    if (matchPosted(rank, recv, request->tag_, request->bytes())) {
      if (request->bytes() > 0) std::memcpy(recv->data_, request->data_, request->bytes());
      finish(recv, Status::kOk);
    }
  } else {
    auto u = std::make_unique<Unexpected>();
    u->tag = request->tag_;
    u->data.assign(request->data_, request->data_ + request->bytes());
    u->complete = true;
    self.unexpected.emplace(keyOf(request->tag_), std::move(u));
  }
  finish(request, Status::kOk);
}

void Core::postSend(TcpRequest* request) {
  int p = request->peer();
  Peer& peer = peers[static_cast<size_t>(p)];
  if (p == rank) return sendToSelf(request);
  if (peer.failed) {
    SQUALL_FAIL(peer.failure, Subsys::kTransport, "cannot send %s to rank %d: %s",
                describe(request->tag_).c_str(), p, peer.why.c_str());
    return finish(request, peer.failure);
  }
  SendOp op{};
  op.request = request;
  encodeHeader(request->tag_, request->bytes(), op.header);
  op.data = request->data_;
  op.bytes = request->bytes();
  peer.sends.push_back(std::move(op));
  if (peer.sends.size() == 1) flushSends(p);
}

void Core::postRecv(TcpRequest* request) {
  int p = request->peer();
  Peer& peer = peers[static_cast<size_t>(p)];
  Key key = keyOf(request->tag_);
  for (auto it = peer.unexpected.lower_bound(key); it != peer.unexpected.end() && it->first == key;
       ++it) {
    Unexpected* u = it->second.get();
    if (u->waiter != nullptr) continue;
    if (!matchPosted(p, request, u->tag, u->data.size())) {
      // The mismatched frame is consumed with the failed receive.
      if (peer.buffer == u) {
        peer.buffer = nullptr;
        peer.sink = Sink::kDiscard;
      }
      peer.unexpected.erase(it);
      return;
    }
    if (u->complete) {
      deliverUnexpected(u, request);
      peer.unexpected.erase(it);
    } else {
      u->waiter = request;
      request->waitingOn_ = u;
    }
    return;
  }
  if (peer.failed) {
    SQUALL_FAIL(peer.failure, Subsys::kTransport, "cannot receive %s from rank %d: %s",
                describe(request->tag_).c_str(), p, peer.why.c_str());
    return finish(request, peer.failure);
  }
  peer.posted.emplace(key, request);
}

class TcpTransport final : public Transport {
 public:
  TcpTransport(std::shared_ptr<Core> core, int epoll, int wake)
      : core_(std::move(core)), epoll_(epoll), wake_(wake) {
    thread_ = std::thread([this] { progressLoop(); });
  }

  ~TcpTransport() override {
    uint64_t one = 1;
    ssize_t ignored = write(wake_, &one, sizeof(one));
    (void)ignored;
    thread_.join();
    std::lock_guard<std::mutex> lock(core_->mutex);
    size_t pending = 0;
    for (Peer& peer : core_->peers) {
      for (auto& [key, r] : peer.posted) core_->finish(r, Status::kInvalidUsage), ++pending;
      for (SendOp& op : peer.sends)
        if (op.request != nullptr) core_->finish(op.request, Status::kInvalidUsage), ++pending;
      if (peer.target != nullptr) core_->finish(peer.target, Status::kInvalidUsage), ++pending;
      for (auto& [key, u] : peer.unexpected)
        if (u->waiter != nullptr) core_->finish(u->waiter, Status::kInvalidUsage), ++pending;
      if (peer.fd >= 0) close(peer.fd);
      peer = Peer();
    }
    if (pending > 0)
      SQUALL_WARN(Subsys::kTransport,
                  "the tcp transport of rank %d was destroyed with %zu requests pending; they "
                  "were failed",
                  core_->rank, pending);
    core_->closed = true;
    close(epoll_);
    close(wake_);
  }

  int rank() const override { return core_->rank; }
  int size() const override { return core_->size; }
  const char* name() const override { return "tcp"; }

  Status send(int peer, const Tag& tag, const void* data, size_t bytes,
              RequestPtr* request) override {
    SQUALL_TRY(check(peer, data, bytes, request, "send"));
    auto r = std::make_unique<TcpRequest>(core_, true, peer, tag,
                                          static_cast<char*>(const_cast<void*>(data)), bytes);
    TcpRequest* raw = r.get();
    *request = std::move(r);
    std::lock_guard<std::mutex> lock(core_->mutex);
    uint64_t before = core_->generation;
    core_->postSend(raw);
    // Flushing may have completed other threads' sends too.
    if (core_->generation != before) core_->activity.notify_all();
    return Status::kOk;
  }

  Status recv(int peer, const Tag& tag, void* data, size_t bytes, RequestPtr* request) override {
    SQUALL_TRY(check(peer, data, bytes, request, "recv"));
    auto r = std::make_unique<TcpRequest>(core_, false, peer, tag, static_cast<char*>(data), bytes);
    TcpRequest* raw = r.get();
    *request = std::move(r);
    std::lock_guard<std::mutex> lock(core_->mutex);
    uint64_t before = core_->generation;
    core_->postRecv(raw);
    if (core_->generation != before) core_->activity.notify_all();
    return Status::kOk;
  }

  Status progress() override { return Status::kOk; }

  Status waitForActivity(Deadline until) override {
    std::unique_lock<std::mutex> lock(core_->mutex);
    if (core_->generation == seen_) {
      // The cap bounds the cost of a wakeup missed by a second thread that
      // shares this transport (seen_ is per transport, not per thread).
      Deadline cap = std::min(until, Clock::now() + std::chrono::milliseconds(100));
      core_->activity.wait_until(lock, cap, [&] { return core_->generation != seen_; });
    }
    seen_ = core_->generation;
    return Status::kOk;
  }

 private:
  Status check(int peer, const void* data, size_t bytes, RequestPtr* request, const char* op) {
    SQUALL_REQUIRE(request != nullptr, Status::kInvalidArgument, Subsys::kTransport,
                   "tcp %s was given a null request pointer", op);
    SQUALL_REQUIRE(peer >= 0 && peer < core_->size, Status::kInvalidArgument, Subsys::kTransport,
                   "tcp %s to rank %d, but the ranks are 0..%d", op, peer, core_->size - 1);
    SQUALL_REQUIRE(data != nullptr || bytes == 0, Status::kInvalidArgument, Subsys::kTransport,
                   "tcp %s of %zu bytes was given a null buffer", op, bytes);
    return Status::kOk;
  }

  void progressLoop() {
    epoll_event events[64];
    for (;;) {
      int n = epoll_wait(epoll_, events, 64, -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        SQUALL_WARN(Subsys::kTransport, "epoll_wait failed: %s; the tcp progress thread stops",
                    std::strerror(errno));
        return;
      }
      std::lock_guard<std::mutex> lock(core_->mutex);
      uint64_t before = core_->generation;
      for (int i = 0; i < n; ++i) {
        int p = static_cast<int>(events[i].data.u32);
        if (p == core_->size) return;  // the wake eventfd: shutting down
        if (core_->peers[static_cast<size_t>(p)].failed) continue;
        core_->flushSends(p);
        core_->readFrames(p);
      }
      if (core_->generation != before) core_->activity.notify_all();
    }
  }

  std::shared_ptr<Core> core_;
  int epoll_;
  int wake_;
  std::thread thread_;
  uint64_t seen_ = ~0ull;
};

// The mesh: connect to higher ranks, accept from lower ones. Fills fds.
Status connectMesh(bootstrap::Bootstrap& boot, std::vector<int>* fds) {
  int rank = boot.rank();
  int size = boot.size();
  auto timeout = boot.timeout();
  Deadline until = Clock::now() + timeout;
  uint8_t secret[kSecretBytes];
  boot.jobSecret(secret);

  SocketAddress mine = boot.localAddress();
  mine.setPort(0);
  SocketAddress bound;
  std::string error;
  int listener = bootstrap::openListener(mine, &bound, &error);
  SQUALL_REQUIRE(listener >= 0, Status::kSystemError, Subsys::kTransport,
                 "rank %d cannot open the tcp transport's listener: %s; choose another "
                 "interface with SQUALL_SOCKET_IFNAME",
                 rank, error.c_str());
  std::vector<WireAddress> cards(static_cast<size_t>(size));
  WireAddress card = bootstrap::toWire(bound);
  Status status = boot.allGather(&card, sizeof(card), cards.data());
  if (status != Status::kOk) {
    close(listener);
    return status;
  }
  int bufferBytes = static_cast<int>(paramInt(Param::kSocketBufferBytes));
  fds->assign(static_cast<size_t>(size), -1);
  auto cleanup = [&] {
    close(listener);
    for (int& fd : *fds)
      if (fd >= 0) close(fd), fd = -1;
  };
  for (int peer = rank + 1; peer < size; ++peer) {
    SocketAddress address;
    bootstrap::fromWire(cards[static_cast<size_t>(peer)], &address);
    int fd = bootstrap::connectWithRetry(address, until, &error);
    if (fd < 0) {
      cleanup();
      return SQUALL_FAIL(Status::kTimeout, Subsys::kTransport,
                         "rank %d could not connect to rank %d's tcp transport: %s", rank, peer,
                         error.c_str());
    }
    bootstrap::tuneStream(fd, bufferBytes);
    Hello hello{kHelloMagic, kHelloVersion, {}, rank, peer, size, 0};
    std::memcpy(hello.secret, secret, kSecretBytes);
    int err = 0;
    Io io = bootstrap::sendAll(fd, &hello, sizeof(hello), until, &err);
    (*fds)[static_cast<size_t>(peer)] = fd;
    if (io != Io::kOk) {
      cleanup();
      return SQUALL_FAIL(Status::kRemoteError, Subsys::kTransport,
                         "rank %d could not introduce itself to rank %d: %s", rank, peer,
                         bootstrap::ioText(io, err).c_str());
    }
  }
  int missing = rank;
  while (missing > 0) {
    pollfd p{listener, POLLIN, 0};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (left.count() <= 0) break;
    if (poll(&p, 1, static_cast<int>(std::min<long long>(left.count() + 1, 1000))) <= 0) continue;
    SocketAddress remote;
    int fd = bootstrap::acceptOne(listener, &remote);
    if (fd < 0) continue;
    Hello hello{};
    int err = 0;
    // A stray client gets at most a second of our attention.
    Io io = bootstrap::recvAll(fd, &hello, sizeof(hello),
                               std::min(until, Clock::now() + std::chrono::seconds(1)), &err);
    const char* reason = nullptr;
    if (io != Io::kOk)
      reason = "it did not complete the handshake";
    else if (hello.magic != kHelloMagic || hello.version != kHelloVersion)
      reason = "it is not a Squall tcp transport peer (bad magic or version)";
    else if (std::memcmp(hello.secret, secret, kSecretBytes) != 0)
      reason = "it presented the wrong job secret";
    else if (hello.to != rank || hello.nranks != size || hello.from < 0 || hello.from >= rank)
      reason = "it claims a rank, target or world size that does not fit this job";
    else if ((*fds)[static_cast<size_t>(hello.from)] >= 0)
      reason = "its rank has already connected";
    if (reason != nullptr) {
      SQUALL_WARN(Subsys::kTransport, "rank %d refused a tcp connection from %s: %s", rank,
                  remote.toString().c_str(), reason);
      close(fd);
      continue;
    }
    bootstrap::tuneStream(fd, bufferBytes);
    (*fds)[static_cast<size_t>(hello.from)] = fd;
    --missing;
  }
  if (missing > 0) {
    std::string names;
    for (int peer = 0; peer < rank; ++peer) {
      if ((*fds)[static_cast<size_t>(peer)] >= 0) continue;
      if (!names.empty()) names.append(", ");
      names.append(std::to_string(peer));
    }
    cleanup();
    return SQUALL_FAIL(Status::kTimeout, Subsys::kTransport,
                       "rank(s) %s did not connect to rank %d's tcp transport within %g s (raise "
                       "SQUALL_TIMEOUT_S if they are only slow)",
                       names.c_str(), rank, static_cast<double>(timeout.count()) / 1000.0);
  }
  close(listener);
  return Status::kOk;
}

}  // namespace

Status createTcpTransport(bootstrap::Bootstrap& boot, std::unique_ptr<Transport>* out) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kTransport,
                 "createTcpTransport was given a null output pointer");
  std::vector<int> fds;
  SQUALL_TRY(connectMesh(boot, &fds));
  auto closeFds = [&] {
    for (int fd : fds)
      if (fd >= 0) close(fd);
  };
  int epoll = epoll_create1(EPOLL_CLOEXEC);
  int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll < 0 || wake < 0) {
    int err = errno;
    closeFds();
    if (epoll >= 0) close(epoll);
    if (wake >= 0) close(wake);
    return SQUALL_FAIL(Status::kSystemError, Subsys::kTransport,
                       "cannot create the tcp progress thread's epoll set: %s", std::strerror(err));
  }
  auto core = std::make_shared<Core>();
  core->rank = boot.rank();
  core->size = boot.size();
  core->peers = std::vector<Peer>(static_cast<size_t>(core->size));
  for (int p = 0; p < core->size; ++p) {
    int fd = fds[static_cast<size_t>(p)];
    if (fd < 0) continue;
    core->peers[static_cast<size_t>(p)].fd = fd;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.u32 = static_cast<uint32_t>(p);
    epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &ev);
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u32 = static_cast<uint32_t>(core->size);
  epoll_ctl(epoll, EPOLL_CTL_ADD, wake, &ev);
  // Every rank has its connections before anyone sends: a rank that failed
  // setup makes this fail instead of leaving the others to time out later.
  auto transport = std::make_unique<TcpTransport>(std::move(core), epoll, wake);
  SQUALL_TRY(boot.barrier());
  *out = std::move(transport);
  return Status::kOk;
}

}  // namespace squall::transport
