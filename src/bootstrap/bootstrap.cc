// Star-shaped rendezvous through rank 0.
//
// createUniqueId() opens the root's listener right away (so the port in the
// id is already reserved) and parks it in a process-global registry; the
// rank-0 Bootstrap of the same process adopts it. A rank 0 in another process
// (or one started from MASTER_ADDR/MASTER_PORT) binds the port named in the
// id instead.
//
// Rank 0 accepts connections and reads each one's fixed-size Hello without
// blocking on any single connection, so a stray or malicious client cannot
// hold up the real ranks. A Hello failing a check (magic, version, secret,
// world size, rank range, duplicate) is logged and dropped. Once every rank
// is present the root answers each with an Ack; if the timeout passes first
// it answers with a failure Ack and names the missing ranks.
//
// allGather and barrier are star exchanges over those connections: each rank
// sends one framed contribution to the root, which replies with the
// concatenation. Frames carry a magic, the operation kind and the length, all
// checked before any payload is read. If anything fails, the root closes
// every connection so the other ranks fail promptly instead of timing out.
#include "src/bootstrap/bootstrap.h"

#include <netdb.h>
#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "src/bootstrap/launch_env.h"
#include "src/common/params.h"

namespace squall::bootstrap {
namespace {

constexpr uint32_t kIdMagic = 0x49425153;  // "SQBI"
constexpr uint16_t kIdVersion = 1;
constexpr uint32_t kHelloMagic = 0x48425153;  // "SQBH"
constexpr uint32_t kProtocolVersion = 1;
constexpr uint32_t kAckMagic = 0x41425153;       // "SQBA"
constexpr uint32_t kFrameMagic = 0x46425153;     // "SQBF"
constexpr uint64_t kMaxFrameBytes = 1ull << 31;  // bootstrap messages are small
constexpr size_t kSecretBytes = 16;

// The first bytes of a UniqueId; the rest is zero.
struct IdLayout {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
  WireAddress root;
  uint8_t secret[kSecretBytes];
};
static_assert(sizeof(IdLayout) <= kUniqueIdBytes);

struct Hello {
  uint32_t magic;
  uint32_t version;
  uint8_t secret[kSecretBytes];
  int32_t rank;
  int32_t nranks;
  WireAddress address;  // where this rank can be reached (for later use)
};

struct Ack {
  uint32_t magic;
  uint32_t ok;  // 1: every rank joined; 0: the root gave up
};

enum class Kind : uint32_t { kAllGather = 1, kBarrier = 2 };

struct FrameHeader {
  uint32_t magic;
  uint32_t kind;
  uint64_t bytes;
};

const char* kindName(uint32_t kind) {
  switch (static_cast<Kind>(kind)) {
    case Kind::kAllGather: return "allGather";
    case Kind::kBarrier: return "barrier";
  }
  return "an unknown operation";
}

double seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

// Listeners created by createUniqueId, waiting for this process's rank 0.
std::mutex gRegistryMutex;
std::map<std::string, int>& registry() {
  static std::map<std::string, int> listeners;
  return listeners;
}

std::string registryKey(const IdLayout& id) {
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

int takeRegisteredListener(const IdLayout& id) {
  std::lock_guard<std::mutex> lock(gRegistryMutex);
  auto it = registry().find(registryKey(id));
  if (it == registry().end()) return -1;
  int fd = it->second;
  registry().erase(it);
  return fd;
}

Status decodeId(const UniqueId& id, IdLayout* layout, SocketAddress* root) {
  std::memcpy(layout, id.bytes, sizeof(*layout));
  SQUALL_REQUIRE(layout->magic == kIdMagic, Status::kInvalidArgument, Subsys::kBootstrap,
                 "the unique id is not a Squall unique id (bad magic); pass every rank the bytes "
                 "that squallGetUniqueId produced on one rank, unchanged");
  SQUALL_REQUIRE(layout->version == kIdVersion, Status::kInvalidArgument, Subsys::kBootstrap,
                 "the unique id has version %u but this library understands version %u; use the "
                 "same Squall version on every rank",
                 layout->version, kIdVersion);
  SQUALL_REQUIRE(fromWire(layout->root, root), Status::kInvalidArgument, Subsys::kBootstrap,
                 "the unique id names an unknown address family (%u); it is corrupt",
                 layout->root.family);
  return Status::kOk;
}

std::string rankList(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text.append(", ");
    text.append(std::to_string(ranks[i]));
  }
  return text;
}

class SocketBootstrap final : public Bootstrap {
 public:
  SocketBootstrap(int rank, int nranks, std::chrono::milliseconds timeout, const IdLayout& id,
                  const SocketAddress& root)
      : rank_(rank),
        nranks_(nranks),
        timeout_(timeout),
        id_(id),
        root_(root),
        peers_(static_cast<size_t>(nranks), -1) {}

  ~SocketBootstrap() override { closeAll(); }

  int rank() const override { return rank_; }
  int size() const override { return nranks_; }
  SocketAddress localAddress() const override { return local_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  void jobSecret(uint8_t out[16]) const override { std::memcpy(out, id_.secret, kSecretBytes); }

  Status allGather(const void* mine, size_t bytes, void* all) override {
    return exchange(Kind::kAllGather, mine, bytes, all);
  }
  Status barrier() override { return exchange(Kind::kBarrier, nullptr, 0, nullptr); }

  Status joinAsRoot(int listener);
  Status joinAsMember();

 private:
  Deadline deadline() const { return std::chrono::steady_clock::now() + timeout_; }
  void closeAll() {
    for (int& fd : peers_) {
      if (fd >= 0) close(fd);
      fd = -1;
    }
  }
  // Returns a reason to refuse `hello`, or "" when it is acceptable.
  std::string checkHello(const Hello& hello) const;
  Status exchange(Kind kind, const void* mine, size_t bytes, void* all);
  Status exchangeRoot(Kind kind, const void* mine, size_t bytes, void* all);
  Status exchangeMember(Kind kind, const void* mine, size_t bytes, void* all);
  Status ioFailure(int peer, const char* what, Kind kind, Io io, int err);

  int rank_;
  int nranks_;
  std::chrono::milliseconds timeout_;
  IdLayout id_;
  SocketAddress root_;
  SocketAddress local_;
  std::vector<int> peers_;  // root: one connection per rank; others: peers_[0]
  bool broken_ = false;     // an operation failed; the connections are gone
};

std::string SocketBootstrap::checkHello(const Hello& hello) const {
  char text[256];
  if (hello.magic != kHelloMagic) return "it is not a Squall bootstrap client (bad magic)";
  if (hello.version != kProtocolVersion) {
    std::snprintf(text, sizeof(text), "it speaks bootstrap protocol version %u, not %u",
                  hello.version, kProtocolVersion);
    return text;
  }
  if (std::memcmp(hello.secret, id_.secret, kSecretBytes) != 0)
    return "it presented the wrong job secret (it belongs to another job or unique id)";
  if (hello.nranks != nranks_) {
    std::snprintf(text, sizeof(text), "it claims a world size of %d but this job has %d ranks",
                  hello.nranks, nranks_);
    return text;
  }
  if (hello.rank <= 0 || hello.rank >= nranks_) {
    std::snprintf(text, sizeof(text), "it claims rank %d, outside 1..%d", hello.rank, nranks_ - 1);
    return text;
  }
  if (peers_[static_cast<size_t>(hello.rank)] >= 0) {
    std::snprintf(text, sizeof(text), "it claims rank %d, which has already joined", hello.rank);
    return text;
  }
  return "";
}

Status SocketBootstrap::joinAsRoot(int listener) {
  local_ = root_;
  local_.setPort(0);
  int joined = 1;
  HelloAcceptor acceptor;
  acceptor.helloBytes = sizeof(Hello);
  acceptor.admit = [&](const void* bytes, int fd, const SocketAddress& remote) {
    Hello hello;
    std::memcpy(&hello, bytes, sizeof(hello));
    std::string reason = checkHello(hello);
    if (!reason.empty()) return reason;
    SocketAddress address;
    fromWire(hello.address, &address);
    SQUALL_INFO(Subsys::kBootstrap, "rank %d joined from %s (reachable at %s)", hello.rank,
                remote.toString().c_str(), address.toString().c_str());
    tuneStream(fd, 0);  // small request/reply frames: no Nagle delays
    peers_[static_cast<size_t>(hello.rank)] = fd;
    ++joined;
    return reason;
  };
  acceptor.refused = [](const SocketAddress& remote, const std::string& reason) {
    SQUALL_WARN(Subsys::kBootstrap,
                "rank 0 refused a bootstrap connection from %s: %s; the job keeps waiting "
                "for its real ranks",
                remote.toString().c_str(), reason.c_str());
  };
  acceptor.complete = [&] { return joined == nranks_; };
  AcceptStats stats;
  acceptHellos(listener, acceptor, deadline(), &stats);
  close(listener);

  Ack ack{kAckMagic, joined == nranks_ ? 1u : 0u};
  for (int r = 1; r < nranks_; ++r) {
    int fd = peers_[static_cast<size_t>(r)];
    int err = 0;
    if (fd >= 0) sendAll(fd, &ack, sizeof(ack), deadline(), &err);
  }
  if (joined < nranks_) {
    std::vector<int> missing;
    for (int r = 1; r < nranks_; ++r)
      if (peers_[static_cast<size_t>(r)] < 0) missing.push_back(r);
    closeAll();
    return SQUALL_FAIL(Status::kTimeout, Subsys::kBootstrap,
                       "%s %s of %d did not join within %g s: they may not have started, may "
                       "use a different unique id, or cannot reach rank 0 at %s (raise "
                       "SQUALL_TIMEOUT_S if they are only slow)%s",
                       missing.size() == 1 ? "rank" : "ranks", rankList(missing).c_str(), nranks_,
                       seconds(timeout_), root_.toString().c_str(), stats.describe().c_str());
  }
  return Status::kOk;
}

Status SocketBootstrap::joinAsMember() {
  Deadline until = deadline();
  std::string error;
  int fd = connectWithRetry(root_, until, &error);
  SQUALL_REQUIRE(fd >= 0, Status::kTimeout, Subsys::kBootstrap,
                 "rank %d could not reach the root (rank 0) within %g s: %s; check that rank 0 "
                 "is running and that this host can reach it (SQUALL_SOCKET_IFNAME)",
                 rank_, seconds(timeout_), error.c_str());
  peers_[0] = fd;
  tuneStream(fd, 0);
  local_ = SocketAddress();
  local_.length = sizeof(local_.storage);
  getsockname(fd, reinterpret_cast<sockaddr*>(&local_.storage), &local_.length);
  local_.setPort(0);

  Hello hello{};
  hello.magic = kHelloMagic;
  hello.version = kProtocolVersion;
  std::memcpy(hello.secret, id_.secret, kSecretBytes);
  hello.rank = rank_;
  hello.nranks = nranks_;
  hello.address = toWire(local_);
  int err = 0;
  Io io = sendAll(fd, &hello, sizeof(hello), until, &err);
  Ack ack{};
  if (io == Io::kOk) io = recvAll(fd, &ack, sizeof(ack), until, &err);
  if (io == Io::kTimeout) {
    closeAll();
    return SQUALL_FAIL(Status::kTimeout, Subsys::kBootstrap,
                       "rank %d reached the root at %s, but not every rank joined within %g s "
                       "(rank 0's log names the missing ones)",
                       rank_, root_.toString().c_str(), seconds(timeout_));
  }
  if (io != Io::kOk || ack.magic != kAckMagic) {
    closeAll();
    return SQUALL_FAIL(Status::kRemoteError, Subsys::kBootstrap,
                       "the root (rank 0) at %s refused rank %d's handshake or failed (%s): see "
                       "rank 0's log; the usual causes are a unique id from another job, a "
                       "different world size, or two processes claiming rank %d",
                       root_.toString().c_str(), rank_,
                       io != Io::kOk ? ioText(io, err).c_str() : "bad reply", rank_);
  }
  if (ack.ok != 1) {
    closeAll();
    return SQUALL_FAIL(Status::kTimeout, Subsys::kBootstrap,
                       "the root (rank 0) gave up: not every rank joined within its timeout "
                       "(rank 0's log names the missing ranks)");
  }
  return Status::kOk;
}

Status SocketBootstrap::ioFailure(int peer, const char* what, Kind kind, Io io, int err) {
  broken_ = true;
  closeAll();
  const char* op = kindName(static_cast<uint32_t>(kind));
  if (io == Io::kTimeout)
    return SQUALL_FAIL(Status::kTimeout, Subsys::kBootstrap,
                       "rank %d timed out after %g s %s rank %d during bootstrap %s: that rank "
                       "may have hung or not called %s",
                       rank_, seconds(timeout_), what, peer, op, op);
  if (io == Io::kClosed)
    return SQUALL_FAIL(Status::kRemoteError, Subsys::kBootstrap,
                       "rank %d closed its bootstrap connection during %s (it may have crashed%s)",
                       peer, op, peer == 0 ? ", or another rank failed: see rank 0's log" : "");
  return SQUALL_FAIL(Status::kRemoteError, Subsys::kBootstrap,
                     "bootstrap %s with rank %d failed: %s", op, peer, ioText(io, err).c_str());
}

Status SocketBootstrap::exchange(Kind kind, const void* mine, size_t bytes, void* all) {
  SQUALL_REQUIRE(!broken_, Status::kRemoteError, Subsys::kBootstrap,
                 "rank %d's bootstrap is unusable after an earlier failure (see above)", rank_);
  SQUALL_REQUIRE(bytes <= kMaxFrameBytes / static_cast<size_t>(nranks_), Status::kInvalidArgument,
                 Subsys::kBootstrap, "bootstrap %s of %zu bytes per rank is too large",
                 kindName(static_cast<uint32_t>(kind)), bytes);
  if (bytes > 0)
    std::memcpy(static_cast<char*>(all) + static_cast<size_t>(rank_) * bytes, mine, bytes);
  if (nranks_ == 1) return Status::kOk;
  return rank_ == 0 ? exchangeRoot(kind, mine, bytes, all) : exchangeMember(kind, mine, bytes, all);
}

Status SocketBootstrap::exchangeRoot(Kind kind, const void*, size_t bytes, void* all) {
  char* out = static_cast<char*>(all);
  Deadline until = deadline();
  for (int r = 1; r < nranks_; ++r) {
    int fd = peers_[static_cast<size_t>(r)];
    FrameHeader header{};
    int err = 0;
    Io io = recvAll(fd, &header, sizeof(header), until, &err);
    if (io != Io::kOk) return ioFailure(r, "waiting for", kind, io, err);
    if (header.magic != kFrameMagic) {
      broken_ = true;
      closeAll();
      return SQUALL_FAIL(Status::kCorruptData, Subsys::kBootstrap,
                         "rank %d sent a malformed bootstrap frame (bad magic 0x%08x); the "
                         "connection is corrupt",
                         r, header.magic);
    }
    if (header.kind != static_cast<uint32_t>(kind) || header.bytes != bytes) {
      broken_ = true;
      closeAll();
      return SQUALL_FAIL(Status::kInvalidUsage, Subsys::kBootstrap,
                         "rank %d called bootstrap %s with %llu bytes but rank 0 called %s with "
                         "%zu bytes: every rank must make the same bootstrap calls",
                         r, kindName(header.kind), static_cast<unsigned long long>(header.bytes),
                         kindName(static_cast<uint32_t>(kind)), bytes);
    }
    if (bytes > 0) {
      io = recvAll(fd, out + static_cast<size_t>(r) * bytes, bytes, until, &err);
      if (io != Io::kOk) return ioFailure(r, "waiting for", kind, io, err);
    }
  }
  FrameHeader reply{kFrameMagic, static_cast<uint32_t>(kind), bytes * static_cast<size_t>(nranks_)};
  for (int r = 1; r < nranks_; ++r) {
    int fd = peers_[static_cast<size_t>(r)];
    int err = 0;
    Io io = sendAll(fd, &reply, sizeof(reply), until, &err);
    if (io == Io::kOk && reply.bytes > 0) io = sendAll(fd, out, reply.bytes, until, &err);
    if (io != Io::kOk) return ioFailure(r, "sending to", kind, io, err);
  }
  return Status::kOk;
}

Status SocketBootstrap::exchangeMember(Kind kind, const void* mine, size_t bytes, void* all) {
  int fd = peers_[0];
  Deadline until = deadline();
  FrameHeader header{kFrameMagic, static_cast<uint32_t>(kind), bytes};
  int err = 0;
  Io io = sendAll(fd, &header, sizeof(header), until, &err);
  if (io == Io::kOk && bytes > 0) io = sendAll(fd, mine, bytes, until, &err);
  if (io != Io::kOk) return ioFailure(0, "sending to", kind, io, err);
  FrameHeader reply{};
  io = recvAll(fd, &reply, sizeof(reply), until, &err);
  if (io != Io::kOk) return ioFailure(0, "waiting for", kind, io, err);
  uint64_t expected = static_cast<uint64_t>(bytes) * static_cast<uint64_t>(nranks_);
  if (reply.magic != kFrameMagic || reply.kind != static_cast<uint32_t>(kind) ||
      reply.bytes != expected) {
    broken_ = true;
    closeAll();
    return SQUALL_FAIL(Status::kCorruptData, Subsys::kBootstrap,
                       "the root (rank 0) answered bootstrap %s with a malformed frame (magic "
                       "0x%08x, %s, %llu bytes instead of %llu); the connection is corrupt",
                       kindName(static_cast<uint32_t>(kind)), reply.magic, kindName(reply.kind),
                       static_cast<unsigned long long>(reply.bytes),
                       static_cast<unsigned long long>(expected));
  }
  if (expected > 0) {
    // Our own slot is already filled; the root's copy is identical.
    io = recvAll(fd, all, expected, until, &err);
    if (io != Io::kOk) return ioFailure(0, "waiting for", kind, io, err);
  }
  return Status::kOk;
}

// A 128-bit value from a string (SQUALL_JOB_SECRET): two FNV-1a passes with
// different offsets. Not cryptographic; it only has to differ between jobs.
void deriveSecret(const std::string& text, uint8_t out[kSecretBytes]) {
  uint64_t h[2] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};
  for (uint64_t& v : h) {
    for (unsigned char c : text) {
      v ^= c;
      v *= 0x100000001b3ull;
    }
  }
  std::memcpy(out, h, kSecretBytes);
}

}  // namespace

std::chrono::milliseconds defaultTimeout() {
  int64_t s = paramInt(Param::kTimeoutS);
  return std::chrono::seconds(std::max<int64_t>(s, 1));
}

Status createUniqueId(UniqueId* id) {
  SQUALL_REQUIRE(id != nullptr, Status::kInvalidArgument, Subsys::kBootstrap,
                 "createUniqueId was given a null id");
  SocketAddress address;
  std::string error;
  SQUALL_REQUIRE(chooseLocalAddress(&address, &error), Status::kSystemError, Subsys::kBootstrap,
                 "cannot pick the rendezvous address: %s", error.c_str());
  IdLayout layout{};
  layout.magic = kIdMagic;
  layout.version = kIdVersion;
  ssize_t got = getrandom(layout.secret, kSecretBytes, 0);
  SQUALL_REQUIRE(got == static_cast<ssize_t>(kSecretBytes), Status::kSystemError,
                 Subsys::kBootstrap, "getrandom() failed: %s", std::strerror(errno));
  SocketAddress bound;
  int fd = openListener(address, &bound, &error);
  SQUALL_REQUIRE(fd >= 0, Status::kSystemError, Subsys::kBootstrap,
                 "cannot open the rendezvous listener: %s; choose another interface with "
                 "SQUALL_SOCKET_IFNAME",
                 error.c_str());
  layout.root = toWire(bound);
  std::memset(id->bytes, 0, kUniqueIdBytes);
  std::memcpy(id->bytes, &layout, sizeof(layout));
  {
    std::lock_guard<std::mutex> lock(gRegistryMutex);
    registry()[registryKey(layout)] = fd;
  }
  SQUALL_INFO(Subsys::kBootstrap, "unique id created; rank 0 will listen on %s",
              bound.toString().c_str());
  return Status::kOk;
}

// Said once per process. Without a secret, the rendezvous and the transport
// accept any process that speaks the protocol: rank 0 says so at WARN, in
// one line with the fix, for the whole job; the other ranks at INFO.
void warnOfPublicSecret(const LaunchEnv& env) {
  static std::once_flag once;
  if (!env.secretSource.empty()) {
    std::call_once(once, [&] {
      SQUALL_INFO(Subsys::kBootstrap,
                  "job secret derived from %s: it keeps jobs apart, but whoever can read that id "
                  "can join; set SQUALL_JOB_SECRET to a random value where other users reach "
                  "this job's hosts",
                  env.secretSource.c_str());
    });
    return;
  }
  std::call_once(once, [&] {
    if (env.rank != 0) {
      SQUALL_INFO(Subsys::kBootstrap, "no job secret (rank 0 warns about it for the job)");
      return;
    }
    SQUALL_WARN(Subsys::kBootstrap,
                "NO JOB SECRET: any process that reaches %s port %d can join this job of %d "
                "ranks (SQUALL_JOB_SECRET is unset, %s gives no run id); export "
                "SQUALL_JOB_SECRET=$(openssl rand -hex 16) before launching (docs/usage.md, "
                "\"From the environment\")",
                env.host.c_str(), env.port, env.nranks, env.launcher);
  });
}

Status uniqueIdFromEnv(UniqueId* id, int* rank, int* nranks) {
  SQUALL_REQUIRE(id != nullptr && rank != nullptr && nranks != nullptr, Status::kInvalidArgument,
                 Subsys::kBootstrap, "uniqueIdFromEnv was given a null pointer");
  LaunchEnv env;
  SQUALL_TRY(readLaunchEnv(&env));
  const char* master = env.host.c_str();
  const long long port = env.port;
  warnOfPublicSecret(env);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(master, nullptr, &hints, &found);
  SQUALL_REQUIRE(rc == 0 && found != nullptr, Status::kInvalidArgument, Subsys::kBootstrap,
                 "%s=\"%s\" does not resolve: %s", env.hostSource.c_str(), master,
                 gai_strerror(rc));
  // Prefer IPv4, as most clusters route it.
  const addrinfo* pick = found;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next)
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  SocketAddress root;
  root.length = pick->ai_addrlen;
  std::memcpy(&root.storage, pick->ai_addr, pick->ai_addrlen);
  freeaddrinfo(found);
  root.setPort(static_cast<uint16_t>(port));

  IdLayout layout{};
  layout.magic = kIdMagic;
  layout.version = kIdVersion;
  layout.root = toWire(root);
  deriveSecret(env.secret, layout.secret);
  std::memset(id->bytes, 0, kUniqueIdBytes);
  std::memcpy(id->bytes, &layout, sizeof(layout));
  *rank = env.rank;
  *nranks = env.nranks;
  SQUALL_INFO(Subsys::kBootstrap, "rank %d of %d (%s), rendezvous at %s port %lld", env.rank,
              env.nranks, env.launcher, master, port);
  return Status::kOk;
}

Status Bootstrap::create(const UniqueId& id, int nranks, int rank,
                         std::chrono::milliseconds timeout, std::unique_ptr<Bootstrap>* out) {
  SQUALL_REQUIRE(out != nullptr, Status::kInvalidArgument, Subsys::kBootstrap,
                 "Bootstrap::create was given a null output pointer");
  SQUALL_REQUIRE(nranks >= 1 && rank >= 0 && rank < nranks, Status::kInvalidArgument,
                 Subsys::kBootstrap, "rank %d is not between 0 and nranks-1 (nranks %d)", rank,
                 nranks);
  IdLayout layout;
  SocketAddress root;
  SQUALL_TRY(decodeId(id, &layout, &root));
  auto boot = std::make_unique<SocketBootstrap>(rank, nranks, timeout, layout, root);
  if (rank == 0) {
    int listener = takeRegisteredListener(layout);
    if (listener < 0) {
      // The id was made in another process (or from the environment): bind
      // the port it names. If the named address is not local, listen on all
      // interfaces at that port instead.
      std::string error;
      SocketAddress bound;
      listener = openListener(root, &bound, &error);
      if (listener < 0 && errno == EADDRNOTAVAIL) {
        SocketAddress any = SocketAddress();
        any.storage.ss_family = static_cast<sa_family_t>(root.family());
        any.length = root.length;
        any.setPort(root.port());
        listener = openListener(any, &bound, &error);
      }
      SQUALL_REQUIRE(listener >= 0, Status::kSystemError, Subsys::kBootstrap,
                     "rank 0 cannot listen for the other ranks: %s; is another job using the "
                     "port (set SQUALL_PORT or SQUALL_PORT_OFFSET)?",
                     error.c_str());
    }
    SQUALL_TRY(boot->joinAsRoot(listener));
  } else {
    SQUALL_TRY(boot->joinAsMember());
  }
  *out = std::move(boot);
  return Status::kOk;
}

}  // namespace squall::bootstrap
