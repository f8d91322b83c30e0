// The net transport: point-to-point connections between NCCL proxies over
// TCP, one stream per connection, progressed by the caller (see net.h).
//
// Connection setup. listen() binds an ephemeral port on the device's address
// and writes a handle: magic, version, kind, a random 64-bit nonce naming
// this listener, and the address. connect() opens a non-blocking socket to
// that address, sends a hello carrying the nonce and waits for the
// listener's acknowledgement; accept() takes connections until one presents
// its nonce, acknowledges it and drops the others. So a handle of another
// job, or a stale one whose port now belongs to someone else, fails: refused,
// closed without an acknowledgement, or silent until the connect deadline
// (SQUALL_TIMEOUT_S). connect's progress lives in the context, keyed by the
// handle buffer NCCL passes again on every retry.
//
// Data. Each message is a header {magic, tag, size} and `size` bytes. The
// receiver reads a header only when a receive is posted, so TCP's own flow
// control holds the sender back until then; the payload goes straight into
// the posted buffer. Each call moves at most kMaxBytesPerCall bytes
// (a few system calls at most), so a large message completes over several
// test() calls instead of inside one.
#include "plugin/nccl/net.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <unordered_set>

#include "plugin/nccl/abi/net_abi.h"
#include "plugin/nccl/devices.h"
#include "src/bootstrap/bootstrap.h"
#include "src/bootstrap/socket.h"
#include "src/common/params.h"
#if defined(SQUALL_HAVE_UCX)
#include "src/transport/ucx/ucx_api.h"
#endif

namespace squall::nccl_plugin {
namespace {

using bootstrap::SocketAddress;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kHandleMagic = 0x53514e48;  // "SQNH"
constexpr uint16_t kHandleVersion = 1;
constexpr uint32_t kHelloMagic = 0x53514e4c;
constexpr uint32_t kAckMagic = 0x53514e41;
constexpr uint32_t kMessageMagic = 0x53514e4d;
constexpr uint32_t kKindNet = 1;
// Requests one comm may hold: NCCL's limit times the largest grouped receive.
constexpr size_t kMaxOutstanding = static_cast<size_t>(nccl_abi::kMaxRequests) * kMaxRecvs;

struct Handle {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;
  uint64_t nonce;
  bootstrap::WireAddress address;
  uint32_t connection;  // 0 on the TCP plane
};
static_assert(sizeof(Handle) <= nccl_abi::kHandleMaxBytes);
static_assert(offsetof(Handle, address) == 16);

struct Hello {
  uint32_t magic;
  uint32_t kind;
  uint64_t nonce;
};
struct Ack {
  uint32_t magic;
  uint32_t kind;
};
struct MessageHeader {
  uint32_t magic;
  int32_t tag;
  uint64_t size;
};
static_assert(sizeof(MessageHeader) == 16);

}  // namespace

int64_t timeoutMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(bootstrap::defaultTimeout()).count();
}

uint64_t randomNonce() {
  static std::mutex mutex;
  static std::random_device device;
  std::lock_guard<std::mutex> lock(mutex);
  uint64_t value = (static_cast<uint64_t>(device()) << 32) ^ device();
  return value == 0 ? 1 : value;
}

namespace {

// Keepalives within SQUALL_TIMEOUT_S, so a peer host that vanishes without
// closing its sockets fails an idle connection like a killed process does.
// No TCP_USER_TIMEOUT: a receiver reads only what NCCL has posted receives
// for, so a sender may sit against a zero window for as long as its peer is
// busy elsewhere (a pipeline stage, a checkpoint), and Linux since 5.11 ends
// such a connection once the zero window outlasts the user timeout, although
// the peer answers every probe. A host that vanishes mid-transfer is found by
// TCP's retransmission limit (tcp_retries2) instead.
void armPeerFailureDetection(int fd) {
  int64_t ms = timeoutMs();
  int seconds = static_cast<int>(std::max<int64_t>(ms / 1000, 1));
  int one = 1;
  int idle = std::max(1, seconds / 3);
  int interval = std::max(1, seconds / 9);
  int count = 3;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

void tuneData(int fd) {
  bootstrap::tuneStream(fd, static_cast<int>(paramInt(Param::kSocketBufferBytes)));
  armPeerFailureDetection(fd);
}

// Non-blocking partial I/O: bytes moved, 0 when it would block, -1 on EOF or
// error (errno 0 for EOF).
ssize_t sendSome(int fd, const iovec* iov, int iovcnt) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(iov);
  msg.msg_iovlen = static_cast<size_t>(iovcnt);
  for (;;) {
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return -1;
  }
}
ssize_t recvSome(int fd, void* data, size_t bytes) {
  if (bytes == 0) return 0;
  for (;;) {
    ssize_t n = recv(fd, data, bytes, MSG_DONTWAIT);
    if (n > 0) return n;
    if (n == 0) {
      errno = 0;
      return -1;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return -1;
  }
}
std::string ioError() { return errno == 0 ? "closed by the peer" : strerror(errno); }

}  // namespace

Status decodeHandle(const void* handle, uint32_t kind, HandleFields* out) {
  Handle h;
  std::memcpy(&h, handle, sizeof(h));
  SQUALL_REQUIRE(h.magic == kHandleMagic && h.version == kHandleVersion && h.kind == kind,
                 Status::kInvalidArgument, Subsys::kTransport,
                 "NET/Squall: the connection handle was not made by this plugin's listen() "
                 "(magic %08x version %u kind %u); NCCL must pass the peer's handle unchanged",
                 h.magic, h.version, h.kind);
  SQUALL_REQUIRE(bootstrap::fromWire(h.address, &out->address) && out->address.port() != 0,
                 Status::kInvalidArgument, Subsys::kTransport,
                 "NET/Squall: the connection handle names no valid address");
  out->nonce = h.nonce;
  out->connection = h.connection;
  return Status::kOk;
}

void writeHandle(uint32_t kind, uint64_t nonce, const SocketAddress& bound, uint32_t connection,
                 void* handle) {
  Handle h{};
  h.magic = kHandleMagic;
  h.version = kHandleVersion;
  h.kind = static_cast<uint16_t>(kind);
  h.nonce = nonce;
  h.address = bootstrap::toWire(bound);
  h.connection = connection;
  std::memset(handle, 0, nccl_abi::kHandleMaxBytes);
  std::memcpy(handle, &h, sizeof(h));
}

namespace {

// ---- memory registration -------------------------------------------------

struct MemoryRegion {
  void* data;
  size_t size;
  int type;
};

// ---- data comms ------------------------------------------------------------

struct Comm;

struct Request : NetObject {
  Comm* comm;
  bool send;
  bool done = false;
  int n = 1;
  // send: data[0], sizes[0]; receive: n buffers with capacities and tags.
  void* data[kMaxRecvs];
  size_t capacity[kMaxRecvs];
  int tags[kMaxRecvs];
  size_t received[kMaxRecvs];
  bool filled[kMaxRecvs];
  int nFilled = 0;
  // send progress
  MessageHeader header{};
  size_t sent = 0;  // bytes of header + payload written
};

struct Comm : NetObject {
  explicit Comm(int socket, bool isSend) : fd(socket), send(isSend) {}
  ~Comm() {
    if (fd >= 0) close(fd);
  }
  std::mutex mutex;
  int fd;
  bool send;
  std::deque<Request*> queue;         // posted, not yet complete, in posting order
  std::unordered_set<Request*> live;  // posted and not yet reported done by test()
  Status failed = Status::kOk;
  std::string failure;
  // receive progress: the header being read, then the slot being filled
  MessageHeader header{};
  size_t headerGot = 0;
  int slot = -1;
  size_t payloadGot = 0;
};

Status failComm(Comm* c, Status status, const std::string& why) {
  if (c->failed == Status::kOk) {
    c->failed = status;
    c->failure = why;
    SQUALL_WARN(Subsys::kTransport, "NET/Squall: %s connection failed: %s",
                c->send ? "send" : "receive", why.c_str());
  }
  return c->failed;
}

// What one call may do on one connection: bytes (headers included) and
// system calls, so that neither large messages nor many small ones make a
// call long.
struct Budget {
  size_t bytes = kMaxBytesPerCall;
  int syscalls = 16;
  bool spent() const { return bytes == 0 || syscalls == 0; }
};

void progressSend(Comm* c, Budget budget) {
  while (c->failed == Status::kOk && !c->queue.empty() && !budget.spent()) {
    Request* r = c->queue.front();
    const size_t total = sizeof(MessageHeader) + r->capacity[0];
    // This write: bytes [sent, end) of header and payload.
    const size_t end = std::min(total, r->sent + budget.bytes);
    iovec iov[2];
    int cnt = 0;
    if (r->sent < sizeof(MessageHeader))
      iov[cnt++] = {reinterpret_cast<char*>(&r->header) + r->sent,
                    std::min(end, sizeof(MessageHeader)) - r->sent};
    if (end > sizeof(MessageHeader)) {
      size_t from = std::max(r->sent, sizeof(MessageHeader));
      iov[cnt++] = {static_cast<char*>(r->data[0]) + (from - sizeof(MessageHeader)), end - from};
    }
    ssize_t n = sendSome(c->fd, iov, cnt);
    --budget.syscalls;
    if (n < 0) {
      failComm(c, Status::kRemoteError, "sending to the peer: " + ioError());
      return;
    }
    if (n == 0) return;
    const auto moved = static_cast<size_t>(n);
    budget.bytes -= moved;
    r->sent += moved;
    if (r->sent == total) {
      r->done = true;
      c->queue.pop_front();
    } else if (r->sent < end) {
      return;  // the socket buffer is full
    }
  }
}

// Picks the buffer of the grouped receive `r` that a message with `tag`
// fills: a single buffer takes any message, a group matches by tag.
int pickSlot(const Request* r, int tag) {
  if (r->n == 1) return r->filled[0] ? -1 : 0;
  for (int i = 0; i < r->n; ++i)
    if (!r->filled[i] && r->tags[i] == tag) return i;
  return -1;
}

void finishSlot(Comm* c, Request* r) {
  r->filled[c->slot] = true;
  r->received[c->slot] = c->header.size;
  c->slot = -1;
  c->headerGot = 0;
  c->payloadGot = 0;
  if (++r->nFilled == r->n) {
    r->done = true;
    c->queue.pop_front();
  }
}

void progressRecv(Comm* c, Budget budget) {
  while (c->failed == Status::kOk && !c->queue.empty() && !budget.spent()) {
    Request* r = c->queue.front();
    if (c->slot < 0) {
      ssize_t n = recvSome(c->fd, reinterpret_cast<char*>(&c->header) + c->headerGot,
                           std::min(budget.bytes, sizeof(MessageHeader) - c->headerGot));
      --budget.syscalls;
      if (n < 0) {
        failComm(c, Status::kRemoteError, "receiving from the peer: " + ioError());
        return;
      }
      if (n == 0) return;
      budget.bytes -= static_cast<size_t>(n);
      c->headerGot += static_cast<size_t>(n);
      if (c->headerGot < sizeof(MessageHeader)) continue;  // short read or spent budget
      if (c->header.magic != kMessageMagic) {
        failComm(c, Status::kCorruptData,
                 "the peer sent a message without the Squall header (stream out of step)");
        return;
      }
      int slot = pickSlot(r, c->header.tag);
      if (slot < 0) {
        failComm(c, Status::kInvalidUsage,
                 "the peer sent a message with tag " + std::to_string(c->header.tag) +
                     " that matches no free buffer of the posted grouped receive");
        return;
      }
      if (c->header.size > r->capacity[slot]) {
        failComm(c, Status::kInvalidUsage,
                 "the peer sent " + std::to_string(c->header.size) + " bytes into a receive of " +
                     std::to_string(r->capacity[slot]) +
                     " bytes; NCCL posts receives at least as large as the sends");
        return;
      }
      c->slot = slot;
      c->payloadGot = 0;
      if (c->header.size == 0) {
        finishSlot(c, r);
        continue;
      }
    }
    if (budget.spent()) return;
    size_t want = std::min(budget.bytes, c->header.size - c->payloadGot);
    ssize_t n = recvSome(c->fd, static_cast<char*>(r->data[c->slot]) + c->payloadGot, want);
    --budget.syscalls;
    if (n < 0) {
      failComm(c, Status::kRemoteError, "receiving from the peer: " + ioError());
      return;
    }
    if (n == 0) return;
    budget.bytes -= static_cast<size_t>(n);
    c->payloadGot += static_cast<size_t>(n);
    if (c->payloadGot == c->header.size)
      finishSlot(c, r);
    else if (static_cast<size_t>(n) < want)
      return;  // the socket is empty for now
  }
}

// One call's share of progress.
void progress(Comm* c) {
  if (c->send)
    progressSend(c, Budget{});
  else
    progressRecv(c, Budget{});
}

// ---- listen / connect / accept ----------------------------------------------

struct ListenComm : NetObject {
  int fd = -1;
  uint64_t nonce = 0;
  uint32_t kind = kKindNet;
  struct Pending {
    int fd;
    Hello hello;
    size_t got;
    Clock::time_point expires;  // SQUALL_BOOTSTRAP_HANDSHAKE_MS after accept
  };
  std::mutex mutex;
  std::vector<Pending> pending;
  bool accepted = false;
  ~ListenComm() {
    if (fd >= 0) close(fd);
    for (const Pending& p : pending) close(p.fd);
  }
};

struct PendingConnect {
  int fd = -1;
  uint64_t nonce = 0;
  SocketAddress address;
  Clock::time_point deadline;
  enum Stage { kConnecting, kHello, kAck } stage = kConnecting;
  Hello hello{};
  size_t moved = 0;
  Ack ack{};
  ~PendingConnect() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

struct NetContext {
  std::mutex mutex;
  std::map<const void*, std::unique_ptr<PendingConnect>> connects;
};

NetContext* sharedContext() {
  static NetContext context;
  return &context;
}

Status netPlane(uint32_t* plane) {
  static std::mutex mutex;
  static bool resolved = false;
  static Status status = Status::kOk;
  static uint32_t chosen = kPlaneTcp;
  std::lock_guard<std::mutex> lock(mutex);
  if (!resolved) {
    resolved = true;
    std::string wanted = paramString(Param::kNetTransport);
    bool tcp = strcasecmp(wanted.c_str(), "tcp") == 0;
    bool ucx = strcasecmp(wanted.c_str(), "ucx") == 0;
    if (!tcp && !ucx && strcasecmp(wanted.c_str(), "auto") != 0)
      SQUALL_WARN(Subsys::kEnv, "SQUALL_NET_TRANSPORT=\"%s\" is not auto, ucx or tcp; using auto",
                  wanted.c_str());
#if defined(SQUALL_HAVE_UCX)
    std::string missing;
    Status started = Status::kOk;
    if (tcp) {
      chosen = kPlaneTcp;
    } else if (transport::findUcx(&missing) == nullptr) {
      if (ucx)
        status = transport::requireUcx("NET/Squall: SQUALL_NET_TRANSPORT=ucx, but ",
                                       "or set SQUALL_NET_TRANSPORT=tcp or auto");
      else
        SQUALL_INFO(Subsys::kTransport, "NET/Squall: UCX was not found, so the net uses TCP: %s",
                    missing.c_str());
    } else if ((started = ucxAvailable()) == Status::kOk) {
      chosen = kPlaneUcx;
    } else if (ucx) {
      status = started;
    } else {
      SQUALL_INFO(Subsys::kTransport, "NET/Squall: UCX did not start; the net uses TCP");
    }
#else
    if (ucx)
      status = SQUALL_FAIL(Status::kUnsupported, Subsys::kTransport,
                           "NET/Squall: SQUALL_NET_TRANSPORT=ucx, but the plugin was built "
                           "without UCX (install libucx-dev and rebuild), or use tcp or auto");
#endif
  }
  *plane = chosen;
  return status;
}

const char* planeName(uint32_t plane) { return plane == kPlaneUcx ? "UCX" : "TCP"; }

namespace {
std::atomic<int> liveContexts{0};  // v11 contexts not yet finalized
}  // namespace

Status netInit(NetContext** ctx) {
  uint32_t plane = kPlaneTcp;
  SQUALL_TRY(netPlane(&plane));
  *ctx = new NetContext;
  ++liveContexts;
  return Status::kOk;
}

Status netFinalize(NetContext* ctx) {
  if (ctx == nullptr || ctx == sharedContext()) return Status::kOk;
  delete ctx;  // also abandons unfinished connects
#if defined(SQUALL_HAVE_UCX)
  // With no communicator left, a UCX connect NCCL never finished cannot be
  // wanted any more; dropping it lets the UCX worker go.
  if (--liveContexts == 0) ucxAbandonConnects();
#else
  --liveContexts;
#endif
  return Status::kOk;
}

Status netDevices(int* count) {
  *count = static_cast<int>(devices().size());
  return Status::kOk;
}

Status netDevice(int dev, const DeviceInfo** info) {
  const auto& list = devices();
  SQUALL_REQUIRE(dev >= 0 && static_cast<size_t>(dev) < list.size(), Status::kInvalidArgument,
                 Subsys::kTransport, "NET/Squall: device %d does not exist (%zu devices)", dev,
                 list.size());
  *info = &list[static_cast<size_t>(dev)].info;
  return Status::kOk;
}

Status openRendezvous(int dev, uint32_t kind, void* handle, Rendezvous* out) {
  const auto& list = devices();
  SQUALL_REQUIRE(dev >= 0 && static_cast<size_t>(dev) < list.size(), Status::kInvalidArgument,
                 Subsys::kTransport, "NET/Squall: listen on device %d, but there are %zu devices",
                 dev, list.size());
  SocketAddress bound;
  std::string error;
  int fd = bootstrap::openListener(list[static_cast<size_t>(dev)].address, &bound, &error);
  SQUALL_REQUIRE(fd >= 0, Status::kSystemError, Subsys::kTransport,
                 "NET/Squall: cannot listen on %s (%s): %s",
                 list[static_cast<size_t>(dev)].info.name.c_str(),
                 list[static_cast<size_t>(dev)].info.address.c_str(), error.c_str());
  out->fd = fd;
  out->nonce = randomNonce();
  writeHandle(kind, out->nonce, bound, 0, handle);
  return Status::kOk;
}

Status netListen(NetContext* /*ctx*/, int dev, void* handle, void** listenComm) {
  SQUALL_REQUIRE(handle != nullptr && listenComm != nullptr, Status::kInvalidArgument,
                 Subsys::kTransport, "NET/Squall: listen() was given a null handle or comm");
  uint32_t plane = kPlaneTcp;
  SQUALL_TRY(netPlane(&plane));
#if defined(SQUALL_HAVE_UCX)
  if (plane == kPlaneUcx) {
    const auto& list = devices();
    SQUALL_REQUIRE(dev >= 0 && static_cast<size_t>(dev) < list.size(), Status::kInvalidArgument,
                   Subsys::kTransport, "NET/Squall: listen on device %d, but there are %zu devices",
                   dev, list.size());
    Status listened = ucxListen(list[static_cast<size_t>(dev)].address, handle, listenComm);
    if (listened == Status::kOk ||
        strcasecmp(paramString(Param::kNetTransport).c_str(), "ucx") == 0)
      return listened;
    // auto: a UCX that starts but cannot listen on this address (no
    // sockaddr transport) leaves this connection to TCP.
    SQUALL_INFO(Subsys::kTransport, "NET/Squall: UCX cannot listen here; this connection uses TCP");
  }
#endif
  Rendezvous r;
  SQUALL_TRY(openRendezvous(dev, kKindNet, handle, &r));
  auto* l = new ListenComm;
  l->fd = r.fd;
  l->nonce = r.nonce;
  *listenComm = l;
  return Status::kOk;
}

namespace {

// One step of a non-blocking connect; *done when the acknowledgement came.
Status stepConnect(PendingConnect* p, bool* done) {
  *done = false;
  std::string where = p->address.toString();
  if (p->stage == PendingConnect::kConnecting) {
    pollfd pfd{p->fd, POLLOUT, 0};
    if (poll(&pfd, 1, 0) <= 0) return Status::kOk;
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &err, &len);
    SQUALL_REQUIRE(err == 0, Status::kRemoteError, Subsys::kTransport,
                   "NET/Squall: cannot connect to %s: %s; the handle is stale (its listener "
                   "closed) or from another job",
                   where.c_str(), strerror(err));
    tuneData(p->fd);
    p->stage = PendingConnect::kHello;
  }
  if (p->stage == PendingConnect::kHello) {
    iovec iov{reinterpret_cast<char*>(&p->hello) + p->moved, sizeof(Hello) - p->moved};
    ssize_t n = sendSome(p->fd, &iov, 1);
    SQUALL_REQUIRE(n >= 0, Status::kRemoteError, Subsys::kTransport,
                   "NET/Squall: connecting to %s: %s", where.c_str(), ioError().c_str());
    p->moved += static_cast<size_t>(n);
    if (p->moved < sizeof(Hello)) return Status::kOk;
    p->moved = 0;
    p->stage = PendingConnect::kAck;
  }
  ssize_t n = recvSome(p->fd, reinterpret_cast<char*>(&p->ack) + p->moved, sizeof(Ack) - p->moved);
  SQUALL_REQUIRE(n >= 0, Status::kRemoteError, Subsys::kTransport,
                 "NET/Squall: %s did not accept the connection (%s): the handle is stale or "
                 "from another job (no listener with its identity there)",
                 where.c_str(), ioError().c_str());
  p->moved += static_cast<size_t>(n);
  if (p->moved < sizeof(Ack)) return Status::kOk;
  SQUALL_REQUIRE(p->ack.magic == kAckMagic && p->ack.kind == p->hello.kind, Status::kRemoteError,
                 Subsys::kTransport,
                 "NET/Squall: %s answered with something other than a Squall "
                 "acknowledgement",
                 where.c_str());
  *done = true;
  return Status::kOk;
}

}  // namespace

Status netConnect(NetContext* ctx, int /*dev*/, void* handle, void** sendComm) {
  SQUALL_REQUIRE(ctx != nullptr && handle != nullptr && sendComm != nullptr,
                 Status::kInvalidArgument, Subsys::kTransport,
                 "NET/Squall: connect() was given a null context, handle or comm");
  *sendComm = nullptr;
  Handle peek;
  std::memcpy(&peek, handle, sizeof(peek));
  if (peek.magic == kHandleMagic && peek.kind == kKindNetUcx) {
#if defined(SQUALL_HAVE_UCX)
    return ucxConnect(handle, sendComm);
#else
    return SQUALL_FAIL(Status::kInvalidUsage, Subsys::kTransport,
                       "NET/Squall: the peer listens on the UCX data plane, but this plugin was "
                       "built without UCX; build it with UCX or set SQUALL_NET_TRANSPORT=tcp on "
                       "every node");
#endif
  }
  HandleFields fields;
  SQUALL_TRY(decodeHandle(handle, kKindNet, &fields));
  const SocketAddress& address = fields.address;
  const uint64_t nonce = fields.nonce;
  std::unique_lock<std::mutex> lock(ctx->mutex);
  auto& slot = ctx->connects[handle];
  if (slot == nullptr || slot->nonce != nonce) {
    auto p = std::make_unique<PendingConnect>();
    p->nonce = nonce;
    p->address = address;
    p->deadline = Clock::now() + std::chrono::milliseconds(timeoutMs());
    p->hello = Hello{kHelloMagic, kKindNet, nonce};
    p->fd = socket(address.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (p->fd < 0) {
      ctx->connects.erase(handle);
      return SQUALL_FAIL(Status::kSystemError, Subsys::kTransport,
                         "NET/Squall: socket() failed: %s", strerror(errno));
    }
    int rc = ::connect(p->fd, reinterpret_cast<const sockaddr*>(&address.storage), address.length);
    if (rc != 0 && errno != EINPROGRESS) {
      int err = errno;
      ctx->connects.erase(handle);
      return SQUALL_FAIL(Status::kRemoteError, Subsys::kTransport,
                         "NET/Squall: cannot connect to %s: %s; the handle is stale or from "
                         "another job",
                         address.toString().c_str(), strerror(err));
    }
    slot = std::move(p);
  }
  PendingConnect* p = slot.get();
  bool done = false;
  Status status = stepConnect(p, &done);
  if (status == Status::kOk && !done && Clock::now() > p->deadline) {
    status = SQUALL_FAIL(Status::kRemoteError, Subsys::kTransport,
                         "NET/Squall: no answer from %s within SQUALL_TIMEOUT_S (%lld ms); the "
                         "handle is stale, from another job, or the peer is stuck",
                         p->address.toString().c_str(), static_cast<long long>(timeoutMs()));
  }
  if (status != Status::kOk) {
    ctx->connects.erase(handle);
    return status;
  }
  if (!done) return Status::kOk;
  auto* c = new Comm(p->fd, true);
  p->fd = -1;
  ctx->connects.erase(handle);
  *sendComm = c;
  return Status::kOk;
}

Status netAccept(void* listenComm, void** recvComm) {
  SQUALL_REQUIRE(listenComm != nullptr && recvComm != nullptr, Status::kInvalidArgument,
                 Subsys::kTransport, "NET/Squall: accept() was given a null comm");
#if defined(SQUALL_HAVE_UCX)
  if (planeOf(listenComm) == kPlaneUcx) return ucxAccept(listenComm, recvComm);
#endif
  auto* l = static_cast<ListenComm*>(listenComm);
  std::lock_guard<std::mutex> lock(l->mutex);
  *recvComm = nullptr;
  SQUALL_REQUIRE(!l->accepted, Status::kInvalidUsage, Subsys::kTransport,
                 "NET/Squall: accept() called again on a listen comm that already accepted its "
                 "connection; listen again for another one");
  // Connections that have not said who they are yet are bounded like the
  // bootstrap's (SQUALL_BOOTSTRAP_PENDING_MAX, SQUALL_BOOTSTRAP_HANDSHAKE_MS):
  // the oldest goes when the list is full, and each has a deadline, so
  // strays cost neither descriptors nor time without end.
  const auto maxPending =
      static_cast<size_t>(std::max<int64_t>(1, paramInt(Param::kBootstrapPendingMax)));
  const auto handshake =
      std::chrono::milliseconds(std::max<int64_t>(1, paramInt(Param::kBootstrapHandshakeMs)));
  for (;;) {
    SocketAddress remote;
    int fd = bootstrap::acceptOne(l->fd, &remote);
    if (fd < 0) break;
    if (l->pending.size() >= maxPending) {
      close(l->pending.front().fd);
      l->pending.erase(l->pending.begin());
    }
    l->pending.push_back({fd, Hello{}, 0, Clock::now() + handshake});
  }
  const auto now = Clock::now();
  for (size_t i = l->pending.size(); i-- > 0;) {
    auto& p = l->pending[i];
    ssize_t n = recvSome(p.fd, reinterpret_cast<char*>(&p.hello) + p.got, sizeof(Hello) - p.got);
    bool drop = n < 0 || (p.got + static_cast<size_t>(std::max<ssize_t>(n, 0)) < sizeof(Hello) &&
                          now >= p.expires);
    if (n > 0) p.got += static_cast<size_t>(n);
    if (!drop && p.got == sizeof(Hello)) {
      if (p.hello.magic == kHelloMagic && p.hello.kind == l->kind && p.hello.nonce == l->nonce) {
        Ack ack{kAckMagic, l->kind};
        iovec iov{&ack, sizeof(ack)};
        // A fresh socket's buffer always takes 8 bytes.
        if (sendSome(p.fd, &iov, 1) == static_cast<ssize_t>(sizeof(ack))) {
          tuneData(p.fd);
          auto* c = new Comm(p.fd, false);
          l->pending.erase(l->pending.begin() + static_cast<long>(i));
          l->accepted = true;
          *recvComm = c;
          return Status::kOk;
        }
      }
      SQUALL_INFO(Subsys::kTransport,
                  "NET/Squall: dropped a connection that did not present this listener's "
                  "identity (a stray or a stale handle)");
      drop = true;
    }
    if (drop) {
      close(p.fd);
      l->pending.erase(l->pending.begin() + static_cast<long>(i));
    }
  }
  return Status::kOk;
}

Status netRegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  SQUALL_REQUIRE(comm != nullptr && mhandle != nullptr, Status::kInvalidArgument,
                 Subsys::kTransport, "NET/Squall: regMr() was given a null comm or handle");
  SQUALL_REQUIRE(type == nccl_abi::kPtrHost, Status::kInvalidArgument, Subsys::kTransport,
                 "NET/Squall: regMr() of memory type %d; this plugin moves host memory only "
                 "(it reports ptrSupport=HOST, so NCCL stages GPU buffers in host memory)",
                 type);
  *mhandle = new MemoryRegion{data, size, type};
  return Status::kOk;
}

Status netDeregMr(void* /*comm*/, void* mhandle) {
  delete static_cast<MemoryRegion*>(mhandle);
  return Status::kOk;
}

Status netIsend(void* sendComm, void* data, size_t size, int tag, void** request) {
  SQUALL_REQUIRE(sendComm != nullptr && request != nullptr && (data != nullptr || size == 0),
                 Status::kInvalidArgument, Subsys::kTransport,
                 "NET/Squall: isend() was given a null comm, request or buffer");
#if defined(SQUALL_HAVE_UCX)
  if (planeOf(sendComm) == kPlaneUcx) return ucxIsend(sendComm, data, size, tag, request);
#endif
  auto* c = static_cast<Comm*>(sendComm);
  std::lock_guard<std::mutex> lock(c->mutex);
  *request = nullptr;
  if (c->failed != Status::kOk) return c->failed;
  if (c->live.size() >= kMaxOutstanding) return Status::kOk;
  auto* r = new Request{};
  r->comm = c;
  r->send = true;
  r->data[0] = data;
  r->capacity[0] = size;
  r->header = MessageHeader{kMessageMagic, tag, size};
  c->queue.push_back(r);
  c->live.insert(r);
  progressSend(c, Budget{});
  *request = r;
  return Status::kOk;
}

Status netIrecv(void* recvComm, int n, void** data, const size_t* sizes, const int* tags,
                void** request) {
  SQUALL_REQUIRE(recvComm != nullptr && request != nullptr && data != nullptr && sizes != nullptr,
                 Status::kInvalidArgument, Subsys::kTransport,
                 "NET/Squall: irecv() was given a null comm, request, buffer list or size list");
  SQUALL_REQUIRE(n >= 1 && n <= kMaxRecvs, Status::kInvalidArgument, Subsys::kTransport,
                 "NET/Squall: irecv() of %d buffers; this plugin groups 1 to %d (maxRecvs)", n,
                 kMaxRecvs);
  SQUALL_REQUIRE(n == 1 || tags != nullptr, Status::kInvalidArgument, Subsys::kTransport,
                 "NET/Squall: a grouped irecv() needs the tags that match its buffers");
#if defined(SQUALL_HAVE_UCX)
  if (planeOf(recvComm) == kPlaneUcx) return ucxIrecv(recvComm, n, data, sizes, tags, request);
#endif
  auto* c = static_cast<Comm*>(recvComm);
  std::lock_guard<std::mutex> lock(c->mutex);
  *request = nullptr;
  if (c->failed != Status::kOk) return c->failed;
  if (c->live.size() >= kMaxOutstanding) return Status::kOk;
  auto* r = new Request{};
  r->comm = c;
  r->send = false;
  r->n = n;
  for (int i = 0; i < n; ++i) {
    r->data[i] = data[i];
    r->capacity[i] = sizes[i];
    r->tags[i] = tags != nullptr ? tags[i] : 0;
    r->received[i] = 0;
    r->filled[i] = false;
  }
  c->queue.push_back(r);
  c->live.insert(r);
  progressRecv(c, Budget{});
  *request = r;
  return Status::kOk;
}

Status netTest(void* request, int* done, size_t* sizes, int* count) {
  SQUALL_REQUIRE(request != nullptr && done != nullptr, Status::kInvalidArgument,
                 Subsys::kTransport, "NET/Squall: test() was given a null request or flag");
#if defined(SQUALL_HAVE_UCX)
  if (planeOf(request) == kPlaneUcx) return ucxTest(request, done, sizes, count);
#endif
  auto* r = static_cast<Request*>(request);
  Comm* c = r->comm;
  std::lock_guard<std::mutex> lock(c->mutex);
  *done = 0;
  if (!r->done) progress(c);
  if (!r->done) {
    if (c->failed != Status::kOk)
      return SQUALL_FAIL(c->failed, Subsys::kTransport, "NET/Squall: request failed: %s",
                         c->failure.c_str());
    return Status::kOk;
  }
  *done = 1;
  if (count != nullptr) *count = r->send ? 1 : r->n;
  if (sizes != nullptr) {
    if (r->send)
      sizes[0] = r->capacity[0];
    else
      for (int i = 0; i < r->n; ++i) sizes[i] = r->received[i];
  }
  c->live.erase(r);
  delete r;
  return Status::kOk;
}

namespace {
Status closeComm(void* comm) {
  if (comm == nullptr) return Status::kOk;
#if defined(SQUALL_HAVE_UCX)
  if (planeOf(comm) == kPlaneUcx) return ucxClose(comm);
#endif
  auto* c = static_cast<Comm*>(comm);
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    // Requests NCCL never tested to completion die with the comm.
    for (Request* r : c->live) delete r;
    c->live.clear();
    c->queue.clear();
  }
  delete c;
  return Status::kOk;
}
}  // namespace

Status netCloseSend(void* sendComm) { return closeComm(sendComm); }
Status netCloseRecv(void* recvComm) { return closeComm(recvComm); }

Status netCloseListen(void* listenComm) {
  if (listenComm == nullptr) return Status::kOk;
#if defined(SQUALL_HAVE_UCX)
  if (planeOf(listenComm) == kPlaneUcx) return ucxCloseListen(listenComm);
#endif
  delete static_cast<ListenComm*>(listenComm);
  return Status::kOk;
}

// ---- the CollNet rendezvous ---------------------------------------------------

Status sendToHandle(const void* handle, uint32_t kind, const void* data, size_t bytes,
                    int64_t timeoutMs) {
  HandleFields fields;
  SQUALL_TRY(decodeHandle(handle, kind, &fields));
  const SocketAddress& address = fields.address;
  const uint64_t nonce = fields.nonce;
  auto deadline = Clock::now() + std::chrono::milliseconds(timeoutMs);
  std::string error;
  int fd = bootstrap::connectWithRetry(address, deadline, &error);
  SQUALL_REQUIRE(fd >= 0, Status::kRemoteError, Subsys::kTransport,
                 "CollNet/Squall: cannot reach the rank listening at %s: %s",
                 address.toString().c_str(), error.c_str());
  Hello hello{kHelloMagic, kind, nonce};
  int err = 0;
  bootstrap::Io io = bootstrap::sendAll(fd, &hello, sizeof(hello), deadline, &err);
  if (io == bootstrap::Io::kOk) io = bootstrap::sendAll(fd, data, bytes, deadline, &err);
  Ack ack{};
  if (io == bootstrap::Io::kOk) io = bootstrap::recvAll(fd, &ack, sizeof(ack), deadline, &err);
  close(fd);
  SQUALL_REQUIRE(
      io == bootstrap::Io::kOk && ack.magic == kAckMagic, Status::kRemoteError, Subsys::kTransport,
      "CollNet/Squall: delivering the group id to %s: %s", address.toString().c_str(),
      io == bootstrap::Io::kOk ? "bad acknowledgement" : bootstrap::ioText(io, err).c_str());
  return Status::kOk;
}

Status receiveOnRendezvous(const Rendezvous& listener, void* data, size_t bytes,
                           int64_t timeoutMs) {
  // The bootstrap's acceptor: connections that do not present this group's
  // nonce are turned away by its pending cap and handshake deadline, in
  // parallel, so strays cannot hold the real sender off.
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeoutMs);
  bool received = false;
  bootstrap::HelloAcceptor acceptor;
  acceptor.helloBytes = sizeof(Hello);
  acceptor.admit = [&](const void* raw, int fd, const SocketAddress&) -> std::string {
    Hello hello{};
    std::memcpy(&hello, raw, sizeof(hello));
    if (hello.magic != kHelloMagic || hello.nonce != listener.nonce)
      return "it did not present this CollNet group's identity (a stray or a stale handle)";
    int err = 0;
    bootstrap::Io io = bootstrap::recvAll(fd, data, bytes, deadline, &err);
    if (io == bootstrap::Io::kOk) {
      Ack ack{kAckMagic, hello.kind};
      io = bootstrap::sendAll(fd, &ack, sizeof(ack), deadline, &err);
    }
    if (io != bootstrap::Io::kOk) return "receiving the group id: " + bootstrap::ioText(io, err);
    close(fd);
    received = true;
    return "";
  };
  acceptor.refused = [](const SocketAddress& remote, const std::string& reason) {
    SQUALL_INFO(Subsys::kTransport, "CollNet/Squall: dropped a connection from %s: %s",
                remote.toString().c_str(), reason.c_str());
  };
  acceptor.complete = [&] { return received; };
  bootstrap::AcceptStats stats;
  if (bootstrap::acceptHellos(listener.fd, acceptor, deadline, &stats)) return Status::kOk;
  return SQUALL_FAIL(Status::kRemoteError, Subsys::kTransport,
                     "CollNet/Squall: rank 0 of the CollNet group did not send the group id "
                     "within SQUALL_TIMEOUT_S%s",
                     stats.describe().c_str());
}

}  // namespace squall::nccl_plugin
