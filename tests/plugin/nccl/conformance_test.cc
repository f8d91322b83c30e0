// Conformance of libnccl-net-squall.so against the plugin ABI, driven the way
// NCCL's proxy drives it: dlopen the built library, look the tables up by
// name, and run listen / connect / accept / isend / irecv / test (and the
// CollNet calls) in separate processes over 127.0.0.1. Every net case runs
// against each exported version (v8 to v12) through one small adapter per
// version below, so the suite is written once.
//
// Processes: each rank is a forked child that loads the library itself
// (nothing plugin-related happens in the parent, which only relays handles
// over socketpairs and waits with a deadline), so a crash, a hang or a kill
// in one rank is observed from outside like NCCL would see a dead peer.
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <link.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "plugin/nccl/abi/net_abi.h"

#ifdef SQUALL_TEST_UCX
#include <ucp/api/ucp.h>
#endif

namespace wire = squall::nccl_abi;
using Clock = std::chrono::steady_clock;

namespace {

// ---- helpers for children ----------------------------------------------------

[[noreturn]] void die(const char* format, ...) {
  va_list args;
  va_start(args, format);
  fprintf(stderr, "[child %d] FAILED: ", getpid());
  vfprintf(stderr, format, args);
  fprintf(stderr, "\n");
  va_end(args);
  _exit(1);
}
#define CHECK(cond, ...)           \
  do {                             \
    if (!(cond)) die(__VA_ARGS__); \
  } while (0)
#define CHECK_OK(expr)                                                                \
  do {                                                                                \
    int rc_ = (expr);                                                                 \
    if (rc_ != wire::kSuccess) die("%s returned %d (line %d)", #expr, rc_, __LINE__); \
  } while (0)

void logger(wire::LogLevel level, unsigned long, const char* file, int line, const char* format,
            ...) {
  if (level > wire::kLogWarn && getenv("CONFORMANCE_VERBOSE") == nullptr) return;
  char text[2048];
  va_list args;
  va_start(args, format);
  vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  fprintf(stderr, "[child %d] nccl-log %d %s:%d %s\n", getpid(), level, file, line, text);
}
std::atomic<int> gLoggerCalls{0};
void countingLogger(wire::LogLevel, unsigned long, const char*, int, const char*, ...) {
  gLoggerCalls.fetch_add(1);
}

void* loadPlugin() {
  void* lib = dlopen(SQUALL_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
  CHECK(lib != nullptr, "dlopen(%s): %s", SQUALL_PLUGIN_PATH, dlerror());
  return lib;
}

void writeAll(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = write(fd, p, bytes);
    CHECK(n > 0, "pipe write: %s", strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}
void readAll(int fd, void* data, size_t bytes) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = read(fd, p, bytes);
    CHECK(n > 0, "pipe read: %s", n == 0 ? "closed" : strerror(errno));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

// ---- one interface over every net version ----------------------------------

struct Net {
  virtual ~Net() = default;
  virtual int version() const = 0;
  virtual int init() = 0;  // a fresh communicator context (v11, v12) or the process one
  virtual int finalize() = 0;
  virtual int devices(int* n) = 0;
  virtual int properties(int dev, wire::PropertiesV12* out) = 0;  // widened
  virtual int listen(int dev, void* handle, void** lc) = 0;
  virtual int connect(int dev, void* handle, void** sc) = 0;
  virtual int accept(void* lc, void** rc) = 0;
  virtual int regMr(void* comm, void* data, size_t size, int type, void** mh) = 0;
  virtual int deregMr(void* comm, void* mh) = 0;
  virtual int isend(void* sc, void* data, size_t size, int tag, void* mh, void** req) = 0;
  virtual int irecv(void* rc, int n, void** data, size_t* sizes, int* tags, void** mhs,
                    void** req) = 0;
  virtual int test(void* req, int* done, int* sizes) = 0;
  virtual int closeSend(void* c) = 0;
  virtual int closeRecv(void* c) = 0;
  virtual int closeListen(void* c) = 0;
};

// Copies what a version's properties have into the newest layout; the rest
// of *out stays as the caller filled it.
template <typename P>
void widen(const P& p, wire::PropertiesV12* out) {
  out->name = p.name;
  out->pciPath = p.pciPath;
  out->guid = p.guid;
  out->ptrSupport = p.ptrSupport;
  out->regIsGlobal = p.regIsGlobal;
  out->speed = p.speed;
  out->port = p.port;
  out->latency = p.latency;
  out->maxComms = p.maxComms;
  out->maxRecvs = p.maxRecvs;
  out->netDeviceType = p.netDeviceType;
  out->netDeviceVersion = p.netDeviceVersion;
  if constexpr (requires { p.vProps; }) {
    out->forceFlush = p.forceFlush;
    out->vProps.ndevs = p.vProps.ndevs;
    for (size_t i = 0; i < std::size(p.vProps.devs); ++i) out->vProps.devs[i] = p.vProps.devs[i];
    out->maxP2pBytes = p.maxP2pBytes;
    out->maxCollBytes = p.maxCollBytes;
  } else {  // v8 has no limits: any positive value passes
    out->maxP2pBytes = 1;
    out->maxCollBytes = 1;
  }
  if constexpr (requires { p.maxMultiRequestSize; })
    out->maxMultiRequestSize = p.maxMultiRequestSize;
}

// The properties struct a table's getProperties fills.
template <typename P>
P propertiesArgument(wire::Result (*)(int, P*));
template <typename T>
using PropertiesOf = decltype(propertiesArgument(std::declval<T&>().getProperties));

template <typename T, int V>
struct NetOf : Net {
  T* t;
  void* ctx = nullptr;
  explicit NetOf(T* table) : t(table) {}
  int version() const override { return V; }
  int init() override {
    if constexpr (V >= 11) {
      wire::CommConfig config{-1};
      return t->init(&ctx, 0x1234, &config, logger, nullptr);
    } else if constexpr (V == 10) {
      return t->init(logger, nullptr);
    } else {
      return t->init(logger);
    }
  }
  int finalize() override {
    if constexpr (V >= 11) return t->finalize(ctx);
    return wire::kSuccess;
  }
  int devices(int* n) override { return t->devices(n); }
  // A byte pattern first, so a member the plugin leaves unwritten shows.
  int properties(int dev, wire::PropertiesV12* out) override {
    std::memset(static_cast<void*>(out), 0x5a, sizeof(*out));
    if constexpr (V == 12) {
      return t->getProperties(dev, out);
    } else {
      PropertiesOf<T> p;
      std::memset(static_cast<void*>(&p), 0x5a, sizeof(p));
      int rc = t->getProperties(dev, &p);
      widen(p, out);
      return rc;
    }
  }
  int listen(int dev, void* handle, void** lc) override {
    if constexpr (V >= 11)
      return t->listen(ctx, dev, handle, lc);
    else
      return t->listen(dev, handle, lc);
  }
  int connect(int dev, void* handle, void** sc) override {
    wire::NetDeviceHandle* devComm = nullptr;
    if constexpr (V >= 11)
      return t->connect(ctx, dev, handle, sc, &devComm);
    else if constexpr (V == 10) {
      wire::CommConfig config{-1};
      return t->connect(dev, &config, handle, sc, &devComm);
    } else {
      return t->connect(dev, handle, sc, &devComm);
    }
  }
  int accept(void* lc, void** rc) override {
    wire::NetDeviceHandle* devComm = nullptr;
    return t->accept(lc, rc, &devComm);
  }
  int regMr(void* comm, void* data, size_t size, int type, void** mh) override {
    return t->regMr(comm, data, size, type, mh);
  }
  int deregMr(void* comm, void* mh) override { return t->deregMr(comm, mh); }
  int isend(void* sc, void* data, size_t size, int tag, void* mh, void** req) override {
    if constexpr (V == 8)
      return t->isend(sc, data, static_cast<int>(size), tag, mh, req);
    else if constexpr (V == 9)
      return t->isend(sc, data, size, tag, mh, req);
    else
      return t->isend(sc, data, size, tag, mh, nullptr, req);
  }
  int irecv(void* rc, int n, void** data, size_t* sizes, int* tags, void** mhs,
            void** req) override {
    if constexpr (V == 8) {
      int narrow[8];
      for (int i = 0; i < n && i < 8; ++i) narrow[i] = static_cast<int>(sizes[i]);
      return t->irecv(rc, n, data, narrow, tags, mhs, req);
    } else if constexpr (V == 9) {
      return t->irecv(rc, n, data, sizes, tags, mhs, req);
    } else {
      void* phandles[8] = {};
      return t->irecv(rc, n, data, sizes, tags, mhs, phandles, req);
    }
  }
  int test(void* req, int* done, int* sizes) override { return t->test(req, done, sizes); }
  int closeSend(void* c) override { return t->closeSend(c); }
  int closeRecv(void* c) override { return t->closeRecv(c); }
  int closeListen(void* c) override { return t->closeListen(c); }
};

std::unique_ptr<Net> openNet(void* lib, int version) {
  auto sym = [lib](const char* name) {
    void* p = dlsym(lib, name);
    CHECK(p != nullptr, "symbol %s not exported", name);
    return p;
  };
  switch (version) {
    case 8:
      return std::make_unique<NetOf<wire::NetV8, 8>>(
          static_cast<wire::NetV8*>(sym("ncclNetPlugin_v8")));
    case 9:
      return std::make_unique<NetOf<wire::NetV9, 9>>(
          static_cast<wire::NetV9*>(sym("ncclNetPlugin_v9")));
    case 10:
      return std::make_unique<NetOf<wire::NetV10, 10>>(
          static_cast<wire::NetV10*>(sym("ncclNetPlugin_v10")));
    case 11:
      return std::make_unique<NetOf<wire::NetV11, 11>>(
          static_cast<wire::NetV11*>(sym("ncclNetPlugin_v11")));
    case 12:
      return std::make_unique<NetOf<wire::NetV12, 12>>(
          static_cast<wire::NetV12*>(sym("ncclNetPlugin_v12")));
  }
  die("no adapter for net v%d", version);
}

// Waits for a request like the proxy does: test() in a loop, with a deadline.
int waitRequest(Net& net, void* req, int* sizes, double seconds = 30) {
  auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  int done = 0;
  while (!done) {
    int rc = net.test(req, &done, sizes);
    if (rc != wire::kSuccess) return rc;
    if (Clock::now() > deadline) die("request not done after %.0f s", seconds);
  }
  return wire::kSuccess;
}

// Connect and accept, both non-blocking, from the two ends of one process pair.
void* connectTo(Net& net, void* handle, double seconds = 30) {
  void* sc = nullptr;
  auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (sc == nullptr) {
    CHECK_OK(net.connect(0, handle, &sc));
    if (sc == nullptr) usleep(100);
    CHECK(Clock::now() < deadline, "connect did not finish");
  }
  return sc;
}
void* acceptFrom(Net& net, void* lc) {
  void* rc = nullptr;
  auto deadline = Clock::now() + std::chrono::seconds(30);
  while (rc == nullptr) {
    CHECK_OK(net.accept(lc, &rc));
    if (rc == nullptr) usleep(100);
    CHECK(Clock::now() < deadline, "accept did not finish");
  }
  return rc;
}

// The TCP port of a listen handle: the plugin's handle carries the listening
// address at byte 16, as {family, port (host order), scope, address}.
uint16_t handlePort(const char* handle) {
  uint16_t port = 0;
  std::memcpy(&port, handle + 16 + 2, sizeof(port));
  return port;
}

std::vector<int> openStrays(uint16_t port, int count) {
  std::vector<int> fds;
  for (int i = 0; i < count; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      fds.push_back(fd);
    } else if (fd >= 0) {
      close(fd);
    }
  }
  return fds;
}

int threadCount() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

uint8_t pattern(size_t message, size_t i) {
  return static_cast<uint8_t>(message * 131 + i * 7 + (i >> 8));
}

// ---- the parent: fork ranks, relay, wait ------------------------------------

struct Rank {
  pid_t pid;
  int fd;  // the parent's end of this rank's socketpair
};

// Runs body(rank, fd) in `n` children; returns their exit codes (-signal if
// killed). Children that outlive `seconds` are killed and reported as 124.
std::vector<int> runRanks(int n, const std::function<void(int, int)>& body,
                          const std::function<void(std::vector<Rank>&)>& relay = nullptr,
                          double seconds = 120) {
  std::vector<Rank> ranks;
  for (int r = 0; r < n; ++r) {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      close(sv[0]);
      for (const Rank& other : ranks) close(other.fd);
      body(r, sv[1]);
      fflush(nullptr);
      _exit(0);
    }
    close(sv[1]);
    ranks.push_back({pid, sv[0]});
  }
  if (relay) relay(ranks);
  std::vector<int> codes(static_cast<size_t>(n), -1);
  auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (codes[static_cast<size_t>(r)] != -1) continue;
      int status = 0;
      pid_t got = waitpid(ranks[static_cast<size_t>(r)].pid, &status, WNOHANG);
      if (got == ranks[static_cast<size_t>(r)].pid) {
        codes[static_cast<size_t>(r)] = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
        --left;
      }
    }
    if (left > 0 && Clock::now() > deadline) {
      for (int r = 0; r < n; ++r)
        if (codes[static_cast<size_t>(r)] == -1) {
          kill(ranks[static_cast<size_t>(r)].pid, SIGKILL);
          waitpid(ranks[static_cast<size_t>(r)].pid, nullptr, 0);
          codes[static_cast<size_t>(r)] = 124;
          --left;
        }
    }
    if (left > 0) usleep(2000);
  }
  for (const Rank& r : ranks) close(r.fd);
  return codes;
}

// Relays one handle from rank 0 (the receiver) to rank 1 (the sender).
void relayPair(std::vector<Rank>& ranks) {
  char handle[wire::kHandleMaxBytes];
  ssize_t got = 0;
  while (got < static_cast<ssize_t>(sizeof(handle))) {
    ssize_t n = read(ranks[0].fd, handle + got, sizeof(handle) - static_cast<size_t>(got));
    if (n <= 0) return;
    got += n;
  }
  ssize_t put = write(ranks[1].fd, handle, sizeof(handle));
  (void)put;
}

// Gathers one handle from every rank and sends all of them to every rank.
void relayAll(std::vector<Rank>& ranks) {
  std::vector<char> all(ranks.size() * wire::kHandleMaxBytes);
  for (size_t r = 0; r < ranks.size(); ++r) {
    size_t got = 0;
    while (got < wire::kHandleMaxBytes) {
      ssize_t n = read(ranks[r].fd, all.data() + r * wire::kHandleMaxBytes + got,
                       wire::kHandleMaxBytes - got);
      if (n <= 0) return;
      got += static_cast<size_t>(n);
    }
  }
  for (const Rank& r : ranks) {
    ssize_t put = write(r.fd, all.data(), all.size());
    (void)put;
  }
}

void expectAllZero(const std::vector<int>& codes) {
  for (size_t r = 0; r < codes.size(); ++r)
    EXPECT_EQ(codes[r], 0) << "rank " << r << (codes[r] == 124 ? " timed out" : " failed");
}

class NetVersion : public ::testing::TestWithParam<int> {};

// ---- tests ---------------------------------------------------------------------

// The members of the tables with a context (v11, v12) that NCCL calls
// without checking are set; the optional ones are NULL.
template <typename Net, typename Coll>
void checkContextTables(void* lib, int version) {
  char name[32];
  snprintf(name, sizeof(name), "ncclNetPlugin_v%d", version);
  auto* net = static_cast<Net*>(dlsym(lib, name));
  CHECK(net->init != nullptr && net->getProperties != nullptr && net->isend != nullptr &&
            net->test != nullptr && net->closeListen != nullptr,
        "%s: members missing", name);
  CHECK(net->finalize != nullptr, "%s: finalize must be set (NCCL calls it unconditionally)", name);
  CHECK(net->getDeviceMr == nullptr && net->irecvConsumed == nullptr &&
            net->makeVDevice == nullptr && net->setNetAttr == nullptr,
        "%s: the optional members must be NULL", name);
  snprintf(name, sizeof(name), "ncclCollNetPlugin_v%d", version);
  auto* coll = static_cast<Coll*>(dlsym(lib, name));
  CHECK(coll->init != nullptr && coll->getProperties != nullptr && coll->finalize != nullptr &&
            coll->iallreduce != nullptr && coll->iallgather != nullptr &&
            coll->ireducescatter != nullptr,
        "%s: members missing", name);
  CHECK(coll->makeVDevice == nullptr, "%s: makeVDevice must be NULL", name);
}

TEST(Exports, EveryVersionAndNothingElse) {
  auto codes = runRanks(1, [](int, int) {
    void* lib = loadPlugin();
    for (const char* prefix : {"ncclNetPlugin_v", "ncclCollNetPlugin_v"})
      for (int v = 8; v <= 12; ++v) {
        char n[32];
        snprintf(n, sizeof(n), "%s%d", prefix, v);
        void* p = dlsym(lib, n);
        CHECK(p != nullptr, "%s missing", n);
        CHECK(strcmp(*static_cast<const char* const*>(p), "squall") == 0, "%s is not named squall",
              n);
      }
    CHECK(dlsym(lib, "ncclNetPlugin_v7") == nullptr, "v7 should not be exported");
    CHECK(dlsym(lib, "ncclCollNetPlugin_v7") == nullptr, "CollNet v7 should not be exported");
    checkContextTables<wire::NetV11, wire::CollNetV11>(lib, 11);
    checkContextTables<wire::NetV12, wire::CollNetV12>(lib, 12);
    // Squall's own (internal) symbols stay hidden.
    CHECK(dlsym(lib, "_ZN6squall6statusNameENS_6StatusE") == nullptr, "internal symbol exported");
  });
  expectAllZero(codes);
}

// NCCL looks the tables up by name, newest first, the net and CollNet each
// on their own: 2.30 tries v12 down to v6, 2.28 v11 down to v6. Each must
// stop at the newest version it knows.
TEST(Exports, NcclLookupOrderFindsTheNewest) {
  auto codes = runRanks(1, [](int, int) {
    void* lib = loadPlugin();
    struct Nccl {
      const char* release;
      std::vector<int> order;
    };
    const Nccl releases[] = {{"2.30", {12, 11, 10, 9, 8, 7, 6}}, {"2.28", {11, 10, 9, 8, 7, 6}}};
    for (const Nccl& nccl : releases)
      for (const char* prefix : {"ncclNetPlugin_v", "ncclCollNetPlugin_v"}) {
        int found = 0;
        for (int v : nccl.order) {
          char name[32];
          snprintf(name, sizeof(name), "%s%d", prefix, v);
          if (dlsym(lib, name) != nullptr) {
            found = v;
            break;
          }
        }
        CHECK(found == nccl.order.front(), "NCCL %s would load %s%d, not %s%d", nccl.release,
              prefix, found, prefix, nccl.order.front());
      }
  });
  expectAllZero(codes);
}

// Loading the plugin loads no MPI library: NCCL jobs mostly run without one,
// and a plugin that needed libmpi would fail to load there.
TEST(Exports, LoadsNoMpi) {
  auto codes = runRanks(1, [](int, int) {
    loadPlugin();
    std::string found;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* out) {
          const char* name = info->dlpi_name != nullptr ? info->dlpi_name : "";
          const char* base = strrchr(name, '/');
          base = base != nullptr ? base + 1 : name;
          if (strncmp(base, "libmpi", 6) == 0 || strncmp(base, "libopen-", 8) == 0)
            *static_cast<std::string*>(out) += std::string(name) + " ";
          return 0;
        },
        &found);
    CHECK(found.empty(), "the plugin loaded %s", found.c_str());
  });
  expectAllZero(codes);
}

// Without an interface selection, a container bridge is not a device while
// a real interface is up (docker0 has 172.17.0.1 on every host: a peer
// would connect to its own). In a private network namespace with a bridge
// "docker0" and a veth "eth7"; skipped without root or namespaces.
TEST(NetDevices, BridgesAreLeftOutByDefault) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for a network namespace";
  if (system("command -v ip >/dev/null 2>&1") != 0) GTEST_SKIP() << "needs ip (iproute2)";
  auto codes = runRanks(1, [](int, int) {
    if (unshare(CLONE_NEWNET) != 0) {
      fprintf(stderr, "SKIP: unshare(CLONE_NEWNET): %s\n", strerror(errno));
      _exit(77);
    }
    const char* setup =
        "ip link add docker0 type bridge && ip addr add 172.17.0.1/16 dev docker0 && "
        "ip link set docker0 up && ip link add eth7 type veth peer name eth7p && "
        "ip addr add 10.99.0.1/24 dev eth7 && ip link set eth7 up && ip link set eth7p up && "
        "ip link set lo up";
    if (system(setup) != 0) {
      fprintf(stderr, "SKIP: bridge or veth interfaces unavailable\n");
      _exit(77);
    }
    unsetenv("SQUALL_SOCKET_IFNAME");
    unsetenv("NCCL_SOCKET_IFNAME");
    void* lib = loadPlugin();
    auto net = openNet(lib, 11);
    CHECK_OK(net->init());
    int n = 0;
    CHECK_OK(net->devices(&n));
    CHECK(n == 1, "%d devices, expected eth7 alone", n);
    wire::PropertiesV12 p;
    CHECK_OK(net->properties(0, &p));
    CHECK(p.name != nullptr && strcmp(p.name, "eth7") == 0, "device 0 is %s, not eth7", p.name);
  });
  if (codes.size() == 1 && codes[0] == 77) GTEST_SKIP() << "no network namespace, bridge or veth";
  expectAllZero(codes);
}

// The properties as NCCL itself lays them out, read from raw bytes at the
// offsets of NCCL's headers (x86-64) rather than through net_abi.h, so a
// mistake in that header cannot hide the same mistake in the library. v12:
// 128 bytes, maxP2pBytes at 104, rail and plane at 124 and 126; v11 (what
// 2.28 passes, on its stack) 112 bytes. Nothing past the end is written.
template <typename T>
T at(const unsigned char* raw, size_t offset) {
  T value;
  std::memcpy(&value, raw + offset, sizeof(value));
  return value;
}

TEST(Properties, LayoutAsNcclReadsIt) {
  auto codes = runRanks(1, [](int, int) {
    void* lib = loadPlugin();
    auto* n12 = static_cast<wire::NetV12*>(dlsym(lib, "ncclNetPlugin_v12"));
    auto* c12 = static_cast<wire::CollNetV12*>(dlsym(lib, "ncclCollNetPlugin_v12"));
    auto* n11 = static_cast<wire::NetV11*>(dlsym(lib, "ncclNetPlugin_v11"));
    void* netCtx = nullptr;
    void* collCtx = nullptr;
    wire::CommConfig config{-1};
    CHECK_OK(n12->init(&netCtx, 1, &config, logger, nullptr));
    CHECK_OK(c12->init(&collCtx, 1, logger));
    constexpr unsigned char kFill = 0xa5;
    struct Case {
      const char* what;
      size_t size;  // of NCCL's struct
      std::function<int(void*)> get;
    };
    const Case cases[] = {
        {"net v12", 128,
         [&](void* p) { return n12->getProperties(0, static_cast<wire::PropertiesV12*>(p)); }},
        {"CollNet v12", 128,
         [&](void* p) { return c12->getProperties(0, static_cast<wire::PropertiesV12*>(p)); }},
        {"net v11", 112,
         [&](void* p) { return n11->getProperties(0, static_cast<wire::PropertiesV11*>(p)); }},
    };
    for (const Case& c : cases) {
      alignas(8) unsigned char raw[192];
      std::memset(raw, kFill, sizeof(raw));
      CHECK_OK(c.get(raw));
      const char* name = at<const char*>(raw, 0);
      CHECK(name != nullptr && strcmp(name, "lo") == 0, "%s: name at 0", c.what);
      CHECK(at<int>(raw, 24) == wire::kPtrHost, "%s: ptrSupport at 24", c.what);
      CHECK(at<int>(raw, 36) > 0, "%s: speed at 36", c.what);
      CHECK(at<int>(raw, 56) == wire::kDeviceHost, "%s: netDeviceType at 56", c.what);
      // vProps at 64: ndevs, then 8 devices (v12) or 4 (v11), the unused ones cleared.
      const int slots = c.size == 128 ? 8 : 4;
      CHECK(at<int>(raw, 64) == 1, "%s: vProps.ndevs at 64 is %d", c.what, at<int>(raw, 64));
      for (int i = 0; i < slots; ++i)
        CHECK(at<int>(raw, 68 + 4 * static_cast<size_t>(i)) == 0, "%s: vProps.devs[%d] at %d",
              c.what, i, 68 + 4 * i);
      const size_t limits = c.size == 128 ? 104 : 88;
      CHECK(at<size_t>(raw, limits) == wire::kMaxNetBytes, "%s: maxP2pBytes at %zu", c.what,
            limits);
      CHECK(at<size_t>(raw, limits + 8) == wire::kMaxNetBytes, "%s: maxCollBytes at %zu", c.what,
            limits + 8);
      CHECK(at<int>(raw, limits + 16) == 1, "%s: maxMultiRequestSize at %zu", c.what, limits + 16);
      if (c.size == 128) {
        CHECK(at<int16_t>(raw, 124) == -1, "%s: railId at 124 is %d, not -1", c.what,
              at<int16_t>(raw, 124));
        CHECK(at<int16_t>(raw, 126) == -1, "%s: planeId at 126 is %d, not -1", c.what,
              at<int16_t>(raw, 126));
      }
      for (size_t b = c.size; b < sizeof(raw); ++b)
        CHECK(raw[b] == kFill, "%s: byte %zu written, past the %zu of NCCL's struct", c.what, b,
              c.size);
    }
    CHECK_OK(c12->finalize(collCtx));
    CHECK_OK(n12->finalize(netCtx));
  });
  expectAllZero(codes);
}

TEST_P(NetVersion, PropertiesAndBadArguments) {
  int version = GetParam();
  auto codes = runRanks(1, [version](int, int) {
    void* lib = loadPlugin();
    auto net = openNet(lib, version);
    CHECK_OK(net->init());
    int n = 0;
    CHECK_OK(net->devices(&n));
    CHECK(n >= 1, "no device with SQUALL_SOCKET_IFNAME=lo");
    wire::PropertiesV12 p;
    CHECK_OK(net->properties(0, &p));
    CHECK(p.name != nullptr && strcmp(p.name, "lo") == 0, "device 0 is %s, not lo", p.name);
    CHECK(p.ptrSupport == wire::kPtrHost, "ptrSupport %d", p.ptrSupport);
    CHECK(p.speed > 0, "speed %d", p.speed);
    CHECK(p.maxRecvs >= 2, "maxRecvs %d", p.maxRecvs);
    CHECK(p.netDeviceType == wire::kDeviceHost, "netDeviceType %d", p.netDeviceType);
    CHECK(p.maxP2pBytes > 0 && p.maxP2pBytes <= wire::kMaxNetBytes, "maxP2pBytes");
    CHECK(p.maxCollBytes > 0 && p.maxCollBytes <= wire::kMaxNetBytes, "maxCollBytes");
    if (version >= 9) CHECK(p.vProps.ndevs == 1 && p.vProps.devs[0] == 0, "vProps");
    if (version >= 11) CHECK(p.maxMultiRequestSize == 1, "maxMultiRequestSize");
    if (version >= 12) {
      for (int i = 1; i < wire::kMaxDevsPerNicV12; ++i)
        CHECK(p.vProps.devs[i] == 0, "vProps.devs[%d] = %d, not cleared", i, p.vProps.devs[i]);
      CHECK(p.railId == wire::kNetIdUndef && p.planeId == wire::kNetIdUndef,
            "railId %d planeId %d: unknown must be NCCL_NET_ID_UNDEF", p.railId, p.planeId);
    }
    CHECK(net->properties(n, &p) == wire::kInvalidArgument, "a missing device must be refused");
    // A connection to ourselves for the argument checks.
    char handle[wire::kHandleMaxBytes];
    void* lc = nullptr;
    CHECK_OK(net->listen(0, handle, &lc));
    CHECK(net->listen(n + 3, handle, &lc) == wire::kInvalidArgument, "listen on a bad device");
    void* sc = nullptr;
    void* rc = nullptr;
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (sc == nullptr || rc == nullptr) {
      if (sc == nullptr) CHECK_OK(net->connect(0, handle, &sc));
      if (rc == nullptr) CHECK_OK(net->accept(lc, &rc));
      CHECK(Clock::now() < deadline, "loopback connect");
    }
    void* again = nullptr;
    CHECK(net->accept(lc, &again) == wire::kInvalidUsage, "a listen comm accepts once");
    CHECK_OK(net->closeListen(lc));
    char buffer[64];
    void* mh = nullptr;
    CHECK(net->regMr(rc, buffer, sizeof(buffer), wire::kPtrCuda, &mh) == wire::kInvalidArgument,
          "CUDA memory must be refused");
    CHECK_OK(net->regMr(rc, buffer, sizeof(buffer), wire::kPtrHost, &mh));
    void* req = nullptr;
    void* data[9];
    size_t sizes[9];
    int tags[9];
    for (int i = 0; i < 9; ++i) data[i] = buffer, sizes[i] = 1, tags[i] = i;
    CHECK(net->irecv(rc, 0, data, sizes, tags, nullptr, &req) == wire::kInvalidArgument, "n = 0");
    CHECK(net->irecv(rc, 9, data, sizes, tags, nullptr, &req) == wire::kInvalidArgument,
          "n > maxRecvs");
    CHECK(net->isend(nullptr, buffer, 1, 0, nullptr, &req) == wire::kInvalidArgument, "null comm");
    CHECK_OK(net->deregMr(rc, mh));
    CHECK_OK(net->closeSend(sc));
    CHECK_OK(net->closeRecv(rc));
    CHECK_OK(net->finalize());
  });
  expectAllZero(codes);
}

// 0 B to 4 MiB, receives larger than the sends, up to 8 in flight.
TEST_P(NetVersion, SizesAndOrder) {
  int version = GetParam();
  const std::vector<size_t> sizes = {0, 1, 7, 8, 4096, 65537, 1 << 20, 4 << 20, 0, 3};
  auto body = [version, sizes](int rank, int fd) {
    void* lib = loadPlugin();
    auto net = openNet(lib, version);
    CHECK_OK(net->init());
    constexpr size_t kSlack = 100;  // every receive posts more than is sent
    constexpr int kInFlight = 8;
    size_t biggest = 4 << 20;
    std::vector<std::vector<uint8_t>> buffers(kInFlight, std::vector<uint8_t>(biggest + kSlack));
    const int rounds = 3;
    size_t total = sizes.size() * rounds;
    if (rank == 0) {
      char handle[wire::kHandleMaxBytes];
      void* lc = nullptr;
      CHECK_OK(net->listen(0, handle, &lc));
      writeAll(fd, handle, sizeof(handle));
      void* rc = acceptFrom(*net, lc);
      CHECK_OK(net->closeListen(lc));
      std::vector<void*> mh(kInFlight);
      for (int i = 0; i < kInFlight; ++i)
        CHECK_OK(net->regMr(rc, buffers[i].data(), buffers[i].size(), wire::kPtrHost, &mh[i]));
      std::vector<void*> reqs(kInFlight, nullptr);
      size_t posted = 0, completed = 0;
      while (completed < total) {
        while (posted < total && posted - completed < kInFlight) {
          int slot = static_cast<int>(posted % kInFlight);
          void* data = buffers[slot].data();
          size_t cap = sizes[posted % sizes.size()] + kSlack;
          int tag = 1;
          memset(data, 0xee, cap);
          void* req = nullptr;
          CHECK_OK(net->irecv(rc, 1, &data, &cap, &tag, &mh[slot], &req));
          if (req == nullptr) break;
          reqs[slot] = req;
          ++posted;
        }
        int slot = static_cast<int>(completed % kInFlight);
        int got = -1;
        CHECK_OK(waitRequest(*net, reqs[slot], &got));
        size_t expect = sizes[completed % sizes.size()];
        CHECK(got == static_cast<int>(expect), "message %zu: %d bytes, expected %zu", completed,
              got, expect);
        for (size_t i = 0; i < expect; ++i)
          CHECK(buffers[slot][i] == pattern(completed, i), "message %zu byte %zu wrong", completed,
                i);
        CHECK(buffers[slot][expect] == 0xee, "message %zu wrote past its size", completed);
        ++completed;
      }
      for (int i = 0; i < kInFlight; ++i) CHECK_OK(net->deregMr(rc, mh[i]));
      CHECK_OK(net->closeRecv(rc));
    } else {
      char handle[wire::kHandleMaxBytes];
      readAll(fd, handle, sizeof(handle));
      void* sc = connectTo(*net, handle);
      std::vector<void*> reqs(kInFlight, nullptr);
      size_t posted = 0, completed = 0;
      while (completed < total) {
        while (posted < total && posted - completed < kInFlight) {
          int slot = static_cast<int>(posted % kInFlight);
          size_t size = sizes[posted % sizes.size()];
          for (size_t i = 0; i < size; ++i) buffers[slot][i] = pattern(posted, i);
          void* req = nullptr;
          CHECK_OK(net->isend(sc, buffers[slot].data(), size, 1, nullptr, &req));
          if (req == nullptr) break;
          reqs[slot] = req;
          ++posted;
        }
        int got = -1;
        CHECK_OK(waitRequest(*net, reqs[completed % kInFlight], &got));
        ++completed;
      }
      CHECK_OK(net->closeSend(sc));
    }
    CHECK_OK(net->finalize());
  };
  expectAllZero(runRanks(2, body, relayPair));
}

// A grouped receive of 4 buffers picks each message's buffer by its tag.
TEST_P(NetVersion, GroupedReceiveMatchesTags) {
  int version = GetParam();
  auto body = [version](int rank, int fd) {
    void* lib = loadPlugin();
    auto net = openNet(lib, version);
    CHECK_OK(net->init());
    const int tags[4] = {10, 11, 12, 13};
    const int sendOrder[4] = {12, 10, 13, 11};
    if (rank == 0) {
      char handle[wire::kHandleMaxBytes];
      void* lc = nullptr;
      CHECK_OK(net->listen(0, handle, &lc));
      writeAll(fd, handle, sizeof(handle));
      void* rc = acceptFrom(*net, lc);
      for (int round = 0; round < 3; ++round) {
        std::vector<uint8_t> bufs[4];
        void* data[4];
        size_t caps[4];
        int t[4];
        for (int i = 0; i < 4; ++i) {
          bufs[i].assign(1024, 0);
          data[i] = bufs[i].data();
          caps[i] = 1024;
          t[i] = tags[i];
        }
        void* req = nullptr;
        CHECK_OK(net->irecv(rc, 4, data, caps, t, nullptr, &req));
        CHECK(req != nullptr, "grouped irecv refused");
        int got[4] = {-1, -1, -1, -1};
        CHECK_OK(waitRequest(*net, req, got));
        for (int i = 0; i < 4; ++i) {
          // The message with tag T carries T + round in every byte, T - 9 bytes long.
          int expectSize = tags[i] - 9 + round;
          CHECK(got[i] == expectSize, "buffer %d got %d bytes, expected %d", i, got[i], expectSize);
          for (int b = 0; b < expectSize; ++b)
            CHECK(bufs[i][static_cast<size_t>(b)] == tags[i] + round,
                  "buffer %d has the wrong message", i);
        }
      }
      CHECK_OK(net->closeRecv(rc));
      CHECK_OK(net->closeListen(lc));
    } else {
      char handle[wire::kHandleMaxBytes];
      readAll(fd, handle, sizeof(handle));
      void* sc = connectTo(*net, handle);
      for (int round = 0; round < 3; ++round) {
        std::vector<uint8_t> bufs[4];
        void* reqs[4];
        for (int i = 0; i < 4; ++i) {
          int tag = sendOrder[i];
          const int length = tag - 9 + round;
          bufs[i].assign(static_cast<size_t>(length), static_cast<uint8_t>(tag + round));
          CHECK_OK(net->isend(sc, bufs[i].data(), bufs[i].size(), tag, nullptr, &reqs[i]));
          CHECK(reqs[i] != nullptr, "isend refused");
        }
        for (void* r : reqs) CHECK_OK(waitRequest(*net, r, nullptr));
      }
      CHECK_OK(net->closeSend(sc));
    }
    CHECK_OK(net->finalize());
  };
  expectAllZero(runRanks(2, body, relayPair));
}

INSTANTIATE_TEST_SUITE_P(Versions, NetVersion, ::testing::Values(8, 9, 10, 11, 12),
                         [](const auto& info) {
                           char name[16];
                           snprintf(name, sizeof(name), "v%d", info.param);
                           return std::string(name);
                         });

// Two communicators (two v11 contexts) in each process, each with a
// connection in both directions, driven by two threads at once.
TEST(NetConcurrency, TwoThreadsTwoCommunicators) {
  auto body = [](int rank, int fd) {
    void* lib = loadPlugin();
    auto nets = std::vector<std::unique_ptr<Net>>();
    for (int c = 0; c < 2; ++c) {
      nets.push_back(openNet(lib, 11));
      CHECK_OK(nets.back()->init());
    }
    // Each communicator c: rank 0 listens for the forward link, rank 1 for the reverse one.
    void* send[2] = {};
    void* recv[2] = {};
    char handles[2][wire::kHandleMaxBytes];
    void* lcs[2];
    for (int c = 0; c < 2; ++c) CHECK_OK(nets[c]->listen(0, handles[c], &lcs[c]));
    writeAll(fd, handles, sizeof(handles));
    char peer[2][wire::kHandleMaxBytes];
    readAll(fd, peer, sizeof(peer));
    for (int c = 0; c < 2; ++c) {
      auto deadline = Clock::now() + std::chrono::seconds(20);
      while (send[c] == nullptr || recv[c] == nullptr) {
        if (send[c] == nullptr) CHECK_OK(nets[c]->connect(0, peer[c], &send[c]));
        if (recv[c] == nullptr) CHECK_OK(nets[c]->accept(lcs[c], &recv[c]));
        CHECK(Clock::now() < deadline, "connect/accept");
      }
      CHECK_OK(nets[c]->closeListen(lcs[c]));
    }
    std::atomic<int> failures{0};
    auto drive = [&](int c) {
      Net& net = *nets[c];
      const int messages = 200;
      std::vector<uint8_t> out(70000), in(70000 + 16);
      for (int m = 0; m < messages; ++m) {
        const int mySize = (m * 977 + c * 13 + rank) % 70000;
        const auto size = static_cast<size_t>(mySize);
        for (size_t i = 0; i < size; ++i)
          out[i] = pattern(static_cast<size_t>(m) + static_cast<size_t>(c), i);
        void* sreq = nullptr;
        void* rreq = nullptr;
        void* data = in.data();
        size_t cap = in.size();
        int tag = 1 - rank;
        if (net.isend(send[c], out.data(), size, rank, nullptr, &sreq) != 0 || sreq == nullptr ||
            net.irecv(recv[c], 1, &data, &cap, &tag, nullptr, &rreq) != 0 || rreq == nullptr) {
          failures++;
          return;
        }
        int got = -1;
        if (waitRequest(net, sreq, nullptr) != 0 || waitRequest(net, rreq, &got) != 0) {
          failures++;
          return;
        }
        const int theirSize = (m * 977 + c * 13 + (1 - rank)) % 70000;
        const auto peerSize = static_cast<size_t>(theirSize);
        if (got != static_cast<int>(peerSize)) failures++;
        for (size_t i = 0; i < peerSize; ++i)
          if (in[i] != pattern(static_cast<size_t>(m) + static_cast<size_t>(c), i)) {
            failures++;
            break;
          }
      }
    };
    std::thread a(drive, 0), b(drive, 1);
    a.join();
    b.join();
    CHECK(failures.load() == 0, "%d failures", failures.load());
    for (int c = 0; c < 2; ++c) {
      CHECK_OK(nets[c]->closeSend(send[c]));
      CHECK_OK(nets[c]->closeRecv(recv[c]));
      CHECK_OK(nets[c]->finalize());
    }
  };
  auto relay = [](std::vector<Rank>& ranks) {
    char h[2][2][wire::kHandleMaxBytes];
    for (int r = 0; r < 2; ++r) {
      size_t got = 0;
      while (got < sizeof(h[r])) {
        ssize_t n = read(ranks[static_cast<size_t>(r)].fd, reinterpret_cast<char*>(h[r]) + got,
                         sizeof(h[r]) - got);
        if (n <= 0) return;
        got += static_cast<size_t>(n);
      }
    }
    for (int r = 0; r < 2; ++r) {
      ssize_t put = write(ranks[static_cast<size_t>(r)].fd, h[1 - r], sizeof(h[1 - r]));
      (void)put;
    }
  };
  expectAllZero(runRanks(2, body, relay));
}

// Each process picks the data plane of what it listens for, and a connector
// follows the handle: rank 0 listens on UCX and rank 1 on TCP, both connect
// to the other and send one message each way, over the two planes at once.
TEST(NetPlanes, ConnectFollowsTheListener) {
  auto probe = runRanks(1, [](int, int) {
    setenv("SQUALL_NET_TRANSPORT", "ucx", 1);
    auto net = openNet(loadPlugin(), 11);
    _exit(net->init() == wire::kSuccess ? 0 : 3);
  });
  if (probe[0] == 3) GTEST_SKIP() << "no UCX data plane (built without UCX, or UCX does not start)";
  auto body = [](int rank, int fd) {
    setenv("SQUALL_NET_TRANSPORT", rank == 0 ? "ucx" : "tcp", 1);
    auto net = openNet(loadPlugin(), 11);
    CHECK_OK(net->init());
    char mine[wire::kHandleMaxBytes], peer[wire::kHandleMaxBytes];
    void* lc = nullptr;
    CHECK_OK(net->listen(0, mine, &lc));
    writeAll(fd, mine, sizeof(mine));
    readAll(fd, peer, sizeof(peer));
    void* sc = nullptr;
    void* rc = nullptr;
    auto deadline = Clock::now() + std::chrono::seconds(20);
    while (sc == nullptr || rc == nullptr) {
      if (sc == nullptr) CHECK_OK(net->connect(0, peer, &sc));
      if (rc == nullptr) CHECK_OK(net->accept(lc, &rc));
      CHECK(Clock::now() < deadline, "connect/accept");
    }
    CHECK_OK(net->closeListen(lc));
    std::vector<uint8_t> out(1000), in(2000);
    for (size_t i = 0; i < out.size(); ++i) out[i] = pattern(static_cast<size_t>(rank), i);
    void* sreq = nullptr;
    void* rreq = nullptr;
    void* data = in.data();
    size_t cap = in.size();
    int tag = 7;
    CHECK_OK(net->isend(sc, out.data(), out.size(), 7, nullptr, &sreq));
    CHECK_OK(net->irecv(rc, 1, &data, &cap, &tag, nullptr, &rreq));
    CHECK(sreq != nullptr && rreq != nullptr, "busy with nothing in flight");
    int got = -1;
    CHECK_OK(waitRequest(*net, sreq, nullptr));
    CHECK_OK(waitRequest(*net, rreq, &got));
    CHECK(got == 1000, "received %d bytes, not 1000", got);
    for (size_t i = 0; i < 1000; ++i)
      CHECK(in[i] == pattern(static_cast<size_t>(1 - rank), i), "byte %zu differs", i);
    CHECK_OK(net->closeSend(sc));
    CHECK_OK(net->closeRecv(rc));
    CHECK_OK(net->finalize());
  };
  auto swap = [](std::vector<Rank>& ranks) {
    char h[2][wire::kHandleMaxBytes];
    for (int r = 0; r < 2; ++r) {
      size_t got = 0;
      while (got < sizeof(h[r])) {
        ssize_t n = read(ranks[static_cast<size_t>(r)].fd, h[r] + got, sizeof(h[r]) - got);
        if (n <= 0) return;
        got += static_cast<size_t>(n);
      }
    }
    for (int r = 0; r < 2; ++r) {
      ssize_t put = write(ranks[static_cast<size_t>(r)].fd, h[1 - r], sizeof(h[1 - r]));
      (void)put;
    }
  };
  expectAllZero(runRanks(2, body, swap));
}

// A peer killed mid-connection: the survivor's pending receive fails with
// ncclRemoteError, well within SQUALL_TIMEOUT_S.
TEST(NetFailure, KilledPeerFailsPendingReceive) {
  auto body = [](int rank, int fd) {
    void* lib = loadPlugin();
    auto net = openNet(lib, 11);
    CHECK_OK(net->init());
    if (rank == 0) {
      char handle[wire::kHandleMaxBytes];
      void* lc = nullptr;
      CHECK_OK(net->listen(0, handle, &lc));
      writeAll(fd, handle, sizeof(handle));
      void* rc = acceptFrom(*net, lc);
      std::vector<uint8_t> buf(1 << 20);
      void* data = buf.data();
      size_t cap = buf.size();
      int tag = 1;
      // The first message arrives, the second never does: the sender is killed.
      for (int m = 0; m < 2; ++m) {
        void* req = nullptr;
        CHECK_OK(net->irecv(rc, 1, &data, &cap, &tag, nullptr, &req));
        auto start = Clock::now();
        int rcode = waitRequest(*net, req, nullptr, 60);
        double took = std::chrono::duration<double>(Clock::now() - start).count();
        if (m == 0) {
          CHECK(rcode == wire::kSuccess, "first message: %d", rcode);
        } else {
          CHECK(rcode == wire::kRemoteError, "dead peer gave %d, not ncclRemoteError", rcode);
          CHECK(took < 20, "took %.1f s (SQUALL_TIMEOUT_S is 20)", took);
        }
      }
      CHECK_OK(net->closeRecv(rc));
      CHECK_OK(net->closeListen(lc));
    } else {
      char handle[wire::kHandleMaxBytes];
      readAll(fd, handle, sizeof(handle));
      void* sc = connectTo(*net, handle);
      std::vector<uint8_t> buf(100, 1);
      void* req = nullptr;
      CHECK_OK(net->isend(sc, buf.data(), buf.size(), 1, nullptr, &req));
      CHECK_OK(waitRequest(*net, req, nullptr));
      // Death before the second message.
      usleep(200000);
      raise(SIGKILL);
    }
    CHECK_OK(net->finalize());
  };
  auto codes = runRanks(2, body, relayPair);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], -SIGKILL);
}

// The sender side: sends to a killed receiver fail with ncclRemoteError.
TEST(NetFailure, KilledPeerFailsPendingSend) {
  auto body = [](int rank, int fd) {
    void* lib = loadPlugin();
    auto net = openNet(lib, 11);
    CHECK_OK(net->init());
    if (rank == 0) {
      char handle[wire::kHandleMaxBytes];
      void* lc = nullptr;
      CHECK_OK(net->listen(0, handle, &lc));
      writeAll(fd, handle, sizeof(handle));
      acceptFrom(*net, lc);
      char go = 0;
      readAll(fd, &go, 1);
      raise(SIGKILL);
    } else {
      char handle[wire::kHandleMaxBytes];
      readAll(fd, handle, sizeof(handle));
      void* sc = connectTo(*net, handle);
      char go = 1;
      writeAll(fd, &go, 1);
      std::vector<uint8_t> big(4 << 20, 3);
      auto start = Clock::now();
      int rcode = wire::kSuccess;
      // Keep sending until the dead peer's reset shows up.
      while (rcode == wire::kSuccess && Clock::now() - start < std::chrono::seconds(30)) {
        void* req = nullptr;
        rcode = net->isend(sc, big.data(), big.size(), 1, nullptr, &req);
        if (rcode == wire::kSuccess && req != nullptr) rcode = waitRequest(*net, req, nullptr, 30);
      }
      double took = std::chrono::duration<double>(Clock::now() - start).count();
      CHECK(rcode == wire::kRemoteError, "sends to a dead peer gave %d", rcode);
      CHECK(took < 20, "took %.1f s", took);
      CHECK_OK(net->closeSend(sc));
      CHECK_OK(net->finalize());
    }
  };
  auto relay = [](std::vector<Rank>& ranks) {
    relayPair(ranks);
    char go = 0;
    if (read(ranks[1].fd, &go, 1) == 1) {
      ssize_t put = write(ranks[0].fd, &go, 1);
      (void)put;
    }
  };
  auto codes = runRanks(2, body, relay);
  EXPECT_EQ(codes[0], -SIGKILL);
  EXPECT_EQ(codes[1], 0);
}

// A receiver that posts nothing for longer than SQUALL_TIMEOUT_S is busy,
// not dead (pipeline stages, a checkpoint between steps): the sender, held
// against a full window meanwhile, must not lose its connection. 16 MiB
// queued, the receive posted after 5 s with SQUALL_TIMEOUT_S=2.
// One call does a bounded amount of work: NCCL's proxy progresses every
// channel between two calls, so a call that moved a whole window would stall
// the others. On the TCP plane no isend, irecv or test moves more than 256
// KiB (kMaxBytesPerCall in plugin/nccl/net.h, headers included), counted in what
// lands in the receive buffer: after one isend of 4 MiB, however long the
// receiver tests, at most that much arrives; once everything is in the
// kernel's hands, each test() call adds at most that much.
TEST(NetBoundedCalls, EachCallMovesAtMostTheCap) {
  const char* plane = getenv("SQUALL_NET_TRANSPORT");
  if (plane != nullptr && strcmp(plane, "ucx") == 0)
    GTEST_SKIP() << "the byte cap is the TCP plane's; UCX's calls are bounded in worker rounds";
  int sync[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sync), 0);
  auto body = [sync](int rank, int fd) {
    constexpr size_t kCap = size_t{256} << 10;
    const size_t bytes = size_t{4} << 20;
    void* lib = loadPlugin();
    auto net = openNet(lib, 12);
    CHECK_OK(net->init());
    char step = 0;
    if (rank == 0) {
      char handle[wire::kHandleMaxBytes];
      void* lc = nullptr;
      CHECK_OK(net->listen(0, handle, &lc));
      writeAll(fd, handle, sizeof(handle));
      void* rc = acceptFrom(*net, lc);
      std::vector<uint8_t> buf(bytes, 0);
      void* data = buf.data();
      size_t cap = buf.size();
      int tag = 1;
      void* req = nullptr;
      CHECK_OK(net->irecv(rc, 1, &data, &cap, &tag, nullptr, &req));
      CHECK(req != nullptr, "irecv refused");
      // The payload is all 0xab, written in order: the filled prefix is what arrived.
      auto arrived = [&] {
        size_t n = 0;
        while (n < bytes && buf[n] == 0xab) ++n;
        return n;
      };
      readAll(sync[0], &step, 1);  // the sender made its one isend call
      int done = 0;
      int sizes[8];
      for (int i = 0; i < 100 && !done; ++i) {
        CHECK_OK(net->test(req, &done, sizes));
        usleep(1000);
      }
      size_t first = arrived();
      CHECK(!done && first > 0 && first <= kCap,
            "one isend call of 4 MiB delivered %zu bytes (at most %zu expected)", first, kCap);
      writeAll(sync[0], &step, 1);
      readAll(sync[0], &step, 1);  // the sender's test() reported the send done
      size_t before = first;
      int calls = 0;
      while (!done) {
        CHECK_OK(net->test(req, &done, sizes));
        ++calls;
        size_t now = done ? bytes : arrived();
        CHECK(now - before <= kCap, "one test() call moved %zu bytes (at most %zu expected)",
              now - before, kCap);
        before = now;
        CHECK(calls < 1000000, "the receive did not finish");
      }
      CHECK(sizes[0] == static_cast<int>(bytes) && arrived() == bytes, "received %d bytes",
            sizes[0]);
      CHECK(static_cast<size_t>(calls) >= (bytes - first) / kCap, "%d test() calls moved %zu bytes",
            calls, bytes - first);
      CHECK_OK(net->closeRecv(rc));
      CHECK_OK(net->closeListen(lc));
    } else {
      char handle[wire::kHandleMaxBytes];
      readAll(fd, handle, sizeof(handle));
      void* sc = connectTo(*net, handle);
      std::vector<uint8_t> buf(bytes, 0xab);
      void* req = nullptr;
      CHECK_OK(net->isend(sc, buf.data(), buf.size(), 1, nullptr, &req));
      CHECK(req != nullptr, "isend refused");
      writeAll(sync[1], &step, 1);
      readAll(sync[1], &step, 1);  // the receiver has seen what one call moved
      CHECK_OK(waitRequest(*net, req, nullptr));
      writeAll(sync[1], &step, 1);
      CHECK_OK(net->closeSend(sc));
    }
    CHECK_OK(net->finalize());
  };
  expectAllZero(runRanks(2, body, relayPair));
  close(sync[0]);
  close(sync[1]);
}

TEST(NetFailure, SlowReceiverIsNotADeadOne) {
  auto body = [](int rank, int fd) {
    setenv("SQUALL_TIMEOUT_S", "2", 1);
    void* lib = loadPlugin();
    auto net = openNet(lib, 11);
    CHECK_OK(net->init());
    const size_t bytes = size_t{16} << 20;
    if (rank == 0) {
      char handle[wire::kHandleMaxBytes];
      void* lc = nullptr;
      CHECK_OK(net->listen(0, handle, &lc));
      writeAll(fd, handle, sizeof(handle));
      void* rc = acceptFrom(*net, lc);
      sleep(5);
      std::vector<uint8_t> buf(bytes, 0);
      void* data = buf.data();
      size_t cap = buf.size();
      int tag = 1;
      void* req = nullptr;
      CHECK_OK(net->irecv(rc, 1, &data, &cap, &tag, nullptr, &req));
      CHECK_OK(waitRequest(*net, req, nullptr, 30));
      CHECK(buf.front() == 9 && buf.back() == 9, "payload");
      CHECK_OK(net->closeRecv(rc));
      CHECK_OK(net->closeListen(lc));
    } else {
      char handle[wire::kHandleMaxBytes];
      readAll(fd, handle, sizeof(handle));
      void* sc = connectTo(*net, handle);
      std::vector<uint8_t> buf(bytes, 9);
      void* req = nullptr;
      CHECK_OK(net->isend(sc, buf.data(), buf.size(), 1, nullptr, &req));
      CHECK_OK(waitRequest(*net, req, nullptr, 30));
      CHECK_OK(net->closeSend(sc));
    }
    CHECK_OK(net->finalize());
  };
  expectAllZero(runRanks(2, body, relayPair));
}

#ifdef SQUALL_TEST_UCX
// Sends tagged messages from a raw UCP endpoint to the listener at `port`
// without ever presenting a hello: the tags a guessing attacker would try
// (connection fields 1..8, sequences 0..15, NCCL tag 1). Returns once UCX
// has sent them all (the listener's accept() loop wires the endpoint up).
bool forgeUcxMessages(uint16_t port, const std::vector<uint8_t>& payload) {
  ucp_config_t* config = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return false;
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_AM;
  ucp_context_h context = nullptr;
  const ucs_status_t inited = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (inited != UCS_OK) return false;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  if (ucp_worker_create(context, &wp, &worker) != UCS_OK) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                  UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;  // as the plugin's endpoints
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&a);
  ep.sockaddr.addrlen = sizeof(a);
  ucp_ep_h endpoint = nullptr;
  if (ucp_ep_create(worker, &ep, &endpoint) != UCS_OK) return false;
  std::vector<ucs_status_ptr_t> sends;
  ucp_request_param_t send{};
  for (uint64_t connection = 1; connection <= 8; ++connection)
    for (uint64_t sequence = 0; sequence < 16; ++sequence) {
      const ucp_tag_t tag = (connection << 44) | (sequence << 24) | 1;
      ucs_status_ptr_t r = ucp_tag_send_nbx(endpoint, payload.data(), payload.size(), tag, &send);
      if (UCS_PTR_IS_ERR(r)) return false;
      if (r != nullptr) sends.push_back(r);
    }
  const auto deadline = Clock::now() + std::chrono::seconds(15);
  for (ucs_status_ptr_t r : sends) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline)
      ucp_worker_progress(worker);
    if (ucp_request_check_status(r) != UCS_OK) {
      fprintf(stderr, "forged send: %s\n", ucs_status_string(ucp_request_check_status(r)));
      return false;
    }
    ucp_request_free(r);
  }
  return true;  // the process exits with its endpoint open, as an attacker's would
}

// A stranger that reaches a UCX listener but never presents its identity
// must not be able to land data in the accepted connection's receives by
// guessing tags (UCX's tag matching is worker-wide and does not check the
// sender): rank 1 forges the likely tags, then rank 2 connects with the real
// handle and sends; rank 0's receive gets rank 2's bytes.
TEST(NetUcx, ForgedTagsDoNotReachAReceive) {
  const char* plane = getenv("SQUALL_NET_TRANSPORT");
  if (plane == nullptr || strcmp(plane, "ucx") != 0)
    GTEST_SKIP() << "the UCX data plane runs in nccl_plugin_net_ucx";
  auto body = [](int rank, int fd) {
    std::vector<uint8_t> payload(100, rank == 1 ? 0x66 : 0x07);
    char handle[wire::kHandleMaxBytes];
    if (rank == 1) {
      readAll(fd, handle, sizeof(handle));
      CHECK(forgeUcxMessages(handlePort(handle), payload), "forging failed to send");
      char go = 1;
      writeAll(fd, &go, 1);
      return;
    }
    void* lib = loadPlugin();
    auto net = openNet(lib, 11);
    CHECK_OK(net->init());
    if (rank == 0) {
      void* lc = nullptr;
      CHECK_OK(net->listen(0, handle, &lc));
      writeAll(fd, handle, sizeof(handle));
      void* rc = acceptFrom(*net, lc);
      std::vector<uint8_t> got(payload.size(), 0);
      void* data = got.data();
      size_t cap = got.size();
      int tag = 1;
      void* req = nullptr;
      CHECK_OK(net->irecv(rc, 1, &data, &cap, &tag, nullptr, &req));
      CHECK_OK(waitRequest(*net, req, nullptr, 30));
      CHECK(got.front() == 0x07 && got.back() == 0x07, "the receive got 0x%02x: a forged message",
            got.front());
      CHECK_OK(net->closeRecv(rc));
      CHECK_OK(net->closeListen(lc));
    } else {
      readAll(fd, handle, sizeof(handle));
      char go = 0;
      readAll(fd, &go, 1);  // after the forgeries have gone out
      void* sc = connectTo(*net, handle);
      void* req = nullptr;
      CHECK_OK(net->isend(sc, payload.data(), payload.size(), 1, nullptr, &req));
      CHECK_OK(waitRequest(*net, req, nullptr, 30));
      CHECK_OK(net->closeSend(sc));
    }
    CHECK_OK(net->finalize());
  };
  // Rank 0's handle to ranks 1 and 2; rank 1's go to rank 2.
  auto relay = [](std::vector<Rank>& ranks) {
    char handle[wire::kHandleMaxBytes];
    size_t got = 0;
    while (got < sizeof(handle)) {
      ssize_t n = read(ranks[0].fd, handle + got, sizeof(handle) - got);
      if (n <= 0) return;
      got += static_cast<size_t>(n);
    }
    for (int r : {1, 2}) {
      ssize_t put = write(ranks[static_cast<size_t>(r)].fd, handle, sizeof(handle));
      (void)put;
    }
    char go = 0;
    if (read(ranks[1].fd, &go, 1) == 1) {
      ssize_t put = write(ranks[2].fd, &go, 1);
      (void)put;
    }
  };
  expectAllZero(runRanks(3, body, relay));
}

// What the plugin logged through NCCL's logger (a child's own copy).
std::string gLogged;
void capturingLogger(wire::LogLevel, unsigned long, const char*, int, const char* format, ...) {
  char text[2048];
  va_list args;
  va_start(args, format);
  vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  gLogged += text;
  gLogged += '\n';
}
int timesLogged(const char* text) {
  int n = 0;
  for (size_t at = gLogged.find(text); at != std::string::npos; at = gLogged.find(text, at + 1))
    ++n;
  return n;
}

// A host without UCX, played with SQUALL_UCX_LIBRARY naming no library: auto
// listens on TCP and says why once, an explicit ucx fails init saying what to
// install, and connecting to a peer that listens on UCX fails the same way.
TEST(NetPlanes, WithoutUcxAutoUsesTcpAndExplicitUcxFails) {
  static constexpr const char* kMissing = "/nonexistent/squall-test/libucp.so.0";
  auto withoutUcx = [](const char* plane) {
    setenv("SQUALL_UCX_LIBRARY", kMissing, 1);
    setenv("SQUALL_NET_TRANSPORT", plane, 1);
    setenv("SQUALL_DEBUG", "INFO", 1);
    void* lib = loadPlugin();
    return static_cast<wire::NetV11*>(dlsym(lib, "ncclNetPlugin_v11"));
  };
  auto codes = runRanks(1, [&](int, int) {
    wire::NetV11* t = withoutUcx("auto");
    wire::CommConfig config{-1};
    void* ctx[2] = {nullptr, nullptr};
    for (void*& c : ctx) CHECK_OK(t->init(&c, 7, &config, capturingLogger, nullptr));
    char handle[wire::kHandleMaxBytes];
    void* lc = nullptr;
    CHECK_OK(t->listen(ctx[0], 0, handle, &lc));
    void* sc = nullptr;
    void* rc = nullptr;
    wire::NetDeviceHandle* dh = nullptr;
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (sc == nullptr || rc == nullptr) {
      if (sc == nullptr) CHECK_OK(t->connect(ctx[1], 0, handle, &sc, &dh));
      if (rc == nullptr) CHECK_OK(t->accept(lc, &rc, &dh));
      CHECK(Clock::now() < deadline, "connect over TCP");
    }
    CHECK(timesLogged("UCX was not found, so the net uses TCP") == 1,
          "the fallback was said %d times, not once:\n%s",
          timesLogged("UCX was not found, so the net uses TCP"), gLogged.c_str());
    CHECK(timesLogged(kMissing) == 1 && timesLogged("libucx0") == 1,
          "the fallback does not say what is missing and what to install:\n%s", gLogged.c_str());
    CHECK_OK(t->closeSend(sc));
    CHECK_OK(t->closeRecv(rc));
    CHECK_OK(t->closeListen(lc));
    for (void* c : ctx) CHECK_OK(t->finalize(c));
  });
  expectAllZero(codes);
  codes = runRanks(1, [&](int, int) {
    wire::NetV11* t = withoutUcx("ucx");
    wire::CommConfig config{-1};
    void* ctx = nullptr;
    CHECK(t->init(&ctx, 7, &config, capturingLogger, nullptr) != wire::kSuccess,
          "init with SQUALL_NET_TRANSPORT=ucx succeeded without UCX");
    CHECK(timesLogged("SQUALL_NET_TRANSPORT=ucx, but UCX could not be loaded") == 1 &&
              timesLogged("libucx0") >= 1 && timesLogged("SQUALL_UCX_LIBRARY") >= 1,
          "the refusal does not say what is missing and what to do:\n%s", gLogged.c_str());
  });
  expectAllZero(codes);

  auto probe = runRanks(1, [](int, int) {
    setenv("SQUALL_NET_TRANSPORT", "ucx", 1);
    auto net = openNet(loadPlugin(), 11);
    _exit(net->init() == wire::kSuccess ? 0 : 3);
  });
  if (probe[0] == 3) GTEST_SKIP() << "no UCX data plane to connect to (UCX does not start)";
  // Rank 0 listens on UCX and leaves: the connector fails before it reaches
  // the network, on loading UCX.
  auto body = [&](int rank, int fd) {
    if (rank == 0) {
      setenv("SQUALL_NET_TRANSPORT", "ucx", 1);
      auto net = openNet(loadPlugin(), 11);
      CHECK_OK(net->init());
      char handle[wire::kHandleMaxBytes];
      void* lc = nullptr;
      CHECK_OK(net->listen(0, handle, &lc));
      writeAll(fd, handle, sizeof(handle));
      CHECK_OK(net->closeListen(lc));
      CHECK_OK(net->finalize());
      return;
    }
    wire::NetV11* t = withoutUcx("auto");
    wire::CommConfig config{-1};
    void* ctx = nullptr;
    CHECK_OK(t->init(&ctx, 7, &config, capturingLogger, nullptr));
    char handle[wire::kHandleMaxBytes];
    readAll(fd, handle, sizeof(handle));
    void* sc = nullptr;
    wire::NetDeviceHandle* dh = nullptr;
    CHECK(t->connect(ctx, 0, handle, &sc, &dh) != wire::kSuccess && sc == nullptr,
          "connected to a UCX listener without UCX");
    CHECK(timesLogged("UCX could not be loaded") >= 1 &&
              timesLogged("set SQUALL_NET_TRANSPORT=tcp on every node") >= 1,
          "the failed connect does not say what to do:\n%s", gLogged.c_str());
    CHECK_OK(t->finalize(ctx));
  };
  expectAllZero(runRanks(2, body, relayPair));
}
#endif

// Garbage, stale and foreign handles fail connect, each in bounded time.
TEST(NetFailure, BadHandlesFailConnectInBoundedTime) {
  auto codes = runRanks(1, [](int, int) {
    setenv("SQUALL_TIMEOUT_S", "3", 1);
    void* lib = loadPlugin();
    auto net = openNet(lib, 11);
    CHECK_OK(net->init());
    auto connectOutcome = [&](void* handle, double* seconds) {
      auto start = Clock::now();
      void* sc = nullptr;
      int rc = wire::kSuccess;
      while (rc == wire::kSuccess && sc == nullptr &&
             Clock::now() - start < std::chrono::seconds(30)) {
        rc = net->connect(0, handle, &sc);
        usleep(1000);
      }
      *seconds = std::chrono::duration<double>(Clock::now() - start).count();
      CHECK(sc == nullptr, "a bad handle connected");
      return rc;
    };
    double took = 0;
    // Garbage bytes.
    char garbage[wire::kHandleMaxBytes];
    for (size_t i = 0; i < sizeof(garbage); ++i) garbage[i] = static_cast<char>(i * 37 + 11);
    CHECK(connectOutcome(garbage, &took) == wire::kInvalidArgument, "garbage handle");
    CHECK(took < 1, "garbage took %.1f s", took);
    // Stale: the listener is gone.
    char stale[wire::kHandleMaxBytes];
    void* lc = nullptr;
    CHECK_OK(net->listen(0, stale, &lc));
    CHECK_OK(net->closeListen(lc));
    CHECK(connectOutcome(stale, &took) == wire::kRemoteError, "stale handle");
    CHECK(took < 4, "stale took %.1f s", took);
    // Foreign: a live listener's address with another listener's identity;
    // the accepting side drops it and the connector fails.
    char a[wire::kHandleMaxBytes], b[wire::kHandleMaxBytes];
    void* la = nullptr;
    void* lb = nullptr;
    CHECK_OK(net->listen(0, a, &la));
    CHECK_OK(net->listen(0, b, &lb));
    char forged[wire::kHandleMaxBytes];
    memcpy(forged, b, sizeof(forged));
    memcpy(forged + 16, a + 16, 24);  // a's address, b's nonce
    std::atomic<bool> stop{false};
    std::thread acceptor([&] {
      while (!stop) {
        void* rc = nullptr;
        net->accept(la, &rc);
        CHECK(rc == nullptr, "the forged handle was accepted");
        usleep(1000);
      }
    });
    CHECK(connectOutcome(forged, &took) == wire::kRemoteError, "forged handle");
    CHECK(took < 4, "forged took %.1f s", took);
    stop = true;
    acceptor.join();
    // A listener that never answers: the connect deadline (SQUALL_TIMEOUT_S=3).
    CHECK(connectOutcome(b, &took) == wire::kRemoteError, "silent listener");
    CHECK(took >= 2.5 && took < 6, "silent listener took %.1f s", took);
    CHECK_OK(net->closeListen(la));
    CHECK_OK(net->closeListen(lb));
    CHECK_OK(net->finalize());
  });
  expectAllZero(codes);
}

// NCCL unloads the library when its last communicator goes and loads it
// again for the next: three cycles with a connection each, and the library
// is really gone in between (nothing pins it in memory). The logger NCCL
// passes carries the plugin's lines.
TEST(Lifecycle, LoadUnloadReload) {
  auto codes = runRanks(1, [](int, int) {
    setenv("SQUALL_DEBUG", "INFO", 1);
    for (int cycle = 0; cycle < 3; ++cycle) {
      const int threads = threadCount();
      void* lib = loadPlugin();
      auto* t = static_cast<wire::NetV11*>(dlsym(lib, "ncclNetPlugin_v11"));
      void* ctx = nullptr;
      wire::CommConfig config{-1};
      gLoggerCalls = 0;
      CHECK_OK(t->init(&ctx, 7, &config, countingLogger, nullptr));
      CHECK(gLoggerCalls.load() > 0, "init did not log through NCCL's logger");
      char handle[wire::kHandleMaxBytes];
      void* lc = nullptr;
      CHECK_OK(t->listen(ctx, 0, handle, &lc));
      void* sc = nullptr;
      void* rc = nullptr;
      wire::NetDeviceHandle* dh = nullptr;
      auto deadline = Clock::now() + std::chrono::seconds(10);
      while (sc == nullptr || rc == nullptr) {
        if (sc == nullptr) CHECK_OK(t->connect(ctx, 0, handle, &sc, &dh));
        if (rc == nullptr) CHECK_OK(t->accept(lc, &rc, &dh));
        CHECK(Clock::now() < deadline, "connect");
      }
      // A bad call logs its reason through NCCL's logger. It runs on a thread
      // of its own, as NCCL's proxy threads do: the error text it leaves in
      // thread-local storage keeps a library loaded until its thread ends.
      int before = gLoggerCalls.load();
      std::thread proxy([&] {
        void* bad = nullptr;
        CHECK(t->regMr(rc, handle, 1, wire::kPtrCuda, &bad) == wire::kInvalidArgument,
              "regMr CUDA");
      });
      proxy.join();
      CHECK(gLoggerCalls.load() > before, "the refusal was not logged through NCCL's logger");
      CHECK_OK(t->closeSend(sc));
      CHECK_OK(t->closeRecv(rc));
      CHECK_OK(t->closeListen(lc));
      CHECK_OK(t->finalize(ctx));
      CHECK(dlclose(lib) == 0, "dlclose: %s", dlerror());
      void* still = dlopen(SQUALL_PLUGIN_PATH, RTLD_NOW | RTLD_NOLOAD);
      CHECK(still == nullptr, "the library stayed loaded after dlclose (cycle %d)", cycle);
      // Whatever the data plane started (UCX's own threads too) is gone.
      CHECK(threadCount() == threads, "%d threads before the load, %d after the unload", threads,
            threadCount());
    }
  });
  expectAllZero(codes);
}

// The same for CollNet, whose communicators run worker threads: a group (of
// one head, so it fits in one process) forms, reduces, closes, and the
// library leaves memory, three times over.
TEST(Lifecycle, CollNetThreadsStopBeforeUnload) {
  auto codes = runRanks(1, [](int, int) {
    for (int cycle = 0; cycle < 3; ++cycle) {
      void* lib = loadPlugin();
      auto* t = static_cast<wire::CollNetV11*>(dlsym(lib, "ncclCollNetPlugin_v11"));
      void* ctx = nullptr;
      CHECK_OK(t->init(&ctx, 3, logger));
      char handle[wire::kHandleMaxBytes];
      void* lc = nullptr;
      CHECK_OK(t->listen(ctx, 0, handle, &lc));
      void* handles[1] = {handle};
      void* comm = nullptr;
      CHECK_OK(t->connect(handles, 1, 0, lc, &comm));
      CHECK_OK(t->closeListen(lc));
      std::vector<float> in(1000, 2.0f), out(1000, 0.0f);
      for (int op = 0; op < 8; ++op) {
        void* req = nullptr;
        CHECK_OK(t->iallreduce(comm, in.data(), out.data(), in.size(), wire::kFloat32, wire::kSum,
                               nullptr, nullptr, &req));
        int done = 0;
        while (!done) CHECK_OK(t->test(req, &done, nullptr));
      }
      CHECK(out[999] == 2.0f, "a group of one returns its input");
      CHECK_OK(t->closeColl(comm));
      CHECK_OK(t->finalize(ctx));
      CHECK(dlclose(lib) == 0, "dlclose: %s", dlerror());
      CHECK(dlopen(SQUALL_PLUGIN_PATH, RTLD_NOW | RTLD_NOLOAD) == nullptr,
            "the library stayed loaded after its CollNet closed (cycle %d)", cycle);
    }
  });
  expectAllZero(codes);
}

// ---- CollNet -------------------------------------------------------------------

struct CollNet {
  int version;
  void* table;
  void* ctx = nullptr;
  int init() {
    switch (version) {
      case 8: return static_cast<wire::CollNetV8*>(table)->init(logger);
      case 9:
      case 10: return static_cast<wire::CollNetV9*>(table)->init(logger);
      case 11: return static_cast<wire::CollNetV11*>(table)->init(&ctx, 99, logger);
      case 12: return static_cast<wire::CollNetV12*>(table)->init(&ctx, 99, logger);
    }
    die("no adapter for CollNet v%d", version);
  }
  int listen(void* handle, void** lc) {
    switch (version) {
      case 8: return static_cast<wire::CollNetV8*>(table)->listen(0, handle, lc);
      case 9:
      case 10: return static_cast<wire::CollNetV9*>(table)->listen(0, handle, lc);
      case 11: return static_cast<wire::CollNetV11*>(table)->listen(ctx, 0, handle, lc);
      case 12: return static_cast<wire::CollNetV12*>(table)->listen(ctx, 0, handle, lc);
    }
    die("no adapter for CollNet v%d", version);
  }
  // The members from connect on share their offsets in every version, apart
  // from iallreduce's count and the SGE size type.
  wire::CollNetV11* t() { return static_cast<wire::CollNetV11*>(table); }
  int iallreduce(void* comm, void* s, void* r, size_t count, wire::DataType type, wire::RedOp op,
                 void** req) {
    if (version == 8)
      return static_cast<wire::CollNetV8*>(table)->iallreduce(comm, s, r, static_cast<int>(count),
                                                              type, op, nullptr, nullptr, req);
    return t()->iallreduce(comm, s, r, count, type, op, nullptr, nullptr, req);
  }
  int finalize() { return version >= 11 ? t()->finalize(ctx) : wire::kSuccess; }
};

// What rank r contributes at element i: large against any codec error, so a
// missing or doubled contribution cannot pass.
float contribution(int r, size_t i) {
  return static_cast<float>((r + 1) * (1 + static_cast<int>(i % 5)));
}

// Silent connections opened to a head's rendezvous before the group forms
// (strays): connect must still complete, and quickly.
int gRendezvousStrays = 0;

void collNetRanks(int nranks, int version, const char* codec) {
  auto body = [nranks, version, codec](int rank, int fd) {
    setenv("SQUALL_COLLNET_CODEC", codec, 1);
    void* lib = loadPlugin();
    char name[32];
    snprintf(name, sizeof(name), "ncclCollNetPlugin_v%d", version);
    CollNet cn{version, dlsym(lib, name)};
    CHECK(cn.table != nullptr, "%s missing", name);
    CHECK_OK(cn.init());
    int ndev = 0;
    CHECK_OK(cn.t()->devices(&ndev));
    CHECK(ndev >= 1, "no CollNet device");
    int supported = -1;
    CHECK_OK(cn.t()->reduceSupport(wire::kFloat32, wire::kSum, &supported));
    CHECK(supported == 1, "fp32 sum");
    CHECK_OK(cn.t()->reduceSupport(wire::kFloat32, wire::kProd, &supported));
    CHECK(supported == 0, "prod is not implemented");
    CHECK_OK(cn.t()->reduceSupport(wire::kUint8, wire::kSum, &supported));
    CHECK(supported == 0, "uint8 is not implemented");
    char handle[wire::kHandleMaxBytes];
    void* lc = nullptr;
    CHECK_OK(cn.listen(handle, &lc));
    // Before the handle goes out, so the strays are ahead of rank 0 in the
    // listener's queue.
    std::vector<int> strays;
    if (rank == 1 && gRendezvousStrays > 0) {
      strays = openStrays(handlePort(handle), gRendezvousStrays);
      CHECK(strays.size() == static_cast<size_t>(gRendezvousStrays), "opened %zu strays",
            strays.size());
    }
    writeAll(fd, handle, sizeof(handle));
    std::vector<char> all(static_cast<size_t>(nranks) * wire::kHandleMaxBytes);
    readAll(fd, all.data(), all.size());
    std::vector<void*> handles(static_cast<size_t>(nranks));
    for (int r = 0; r < nranks; ++r)
      handles[static_cast<size_t>(r)] = all.data() + static_cast<size_t>(r) * wire::kHandleMaxBytes;
    void* comm = nullptr;
    const auto connectStart = Clock::now();
    CHECK_OK(cn.t()->connect(handles.data(), nranks, rank, lc, &comm));
    CHECK(comm != nullptr, "connect gave no collComm");
    CHECK(Clock::now() - connectStart < std::chrono::seconds(20), "connect took %.1f s",
          std::chrono::duration<double>(Clock::now() - connectStart).count());
    for (int s : strays) close(s);
    CHECK_OK(cn.t()->closeListen(lc));
    bool exact = strcmp(codec, "none") == 0;
    // Like NCCL: one staging region registered twice, ops on slices, many in flight.
    const std::vector<size_t> counts = {1, 1000, 4099, 1 << 18, 3, 65536};
    size_t total = 0;
    for (size_t c : counts) total += c;
    std::vector<float> send(total), recv(total, -1.0f);
    void* smh = nullptr;
    void* rmh = nullptr;
    CHECK_OK(cn.t()->regMr(comm, send.data(), send.size() * 4, wire::kPtrHost, &smh));
    CHECK_OK(cn.t()->regMr(comm, recv.data(), recv.size() * 4, wire::kPtrHost, &rmh));
    double sumAll = 0;
    for (int r = 0; r < nranks; ++r) sumAll += r + 1;
    // Three passes over the same slices. Compressors are pooled per lane and
    // count, and operation k runs on lane k mod SQUALL_COLLNET_LANES (4): the
    // second pass starts on lane 2 and finds none to reuse, the third starts on
    // lane 0 and reuses the first pass's, at 1/1024 of the scale, so an error
    // of the first pass carried into the third would be 1024 times its
    // tolerance.
    auto pass = [&](double scale) {
      for (size_t i = 0; i < total; ++i)
        send[i] = static_cast<float>(contribution(rank, i) * scale);
      std::vector<void*> reqs;
      size_t off = 0;
      for (size_t c : counts) {
        void* req = nullptr;
        CHECK_OK(cn.iallreduce(comm, send.data() + off, recv.data() + off, c, wire::kFloat32,
                               wire::kSum, &req));
        CHECK(req != nullptr, "iallreduce refused");
        reqs.push_back(req);
        off += c;
      }
      for (void* req : reqs) {
        int done = 0;
        auto deadline = Clock::now() + std::chrono::seconds(60);
        while (!done) {
          CHECK_OK(cn.t()->test(req, &done, nullptr));
          CHECK(Clock::now() < deadline, "iallreduce not done");
        }
      }
      // Bound per element: each rank's input and the reduced sum are each
      // encoded once; block-scaled int8 errs by up to half a step of its
      // block's largest value, the float codecs by half an ulp.
      double maxContribution = 0;
      for (int r = 0; r < nranks; ++r) maxContribution += contribution(r, 4);
      const double maxSum = maxContribution;
      off = 0;
      for (size_t c : counts) {
        for (size_t i = 0; i < c; ++i) {
          size_t g = off + i;
          double expect = sumAll * (1 + static_cast<double>(g % 5)) * scale;
          double tol = 0;
          if (!exact) {
            if (strcmp(codec, "bf16") == 0) tol = std::ldexp(maxContribution + maxSum, -8);
            if (strcmp(codec, "fp16") == 0) tol = std::ldexp(maxContribution + maxSum, -11);
            if (strcmp(codec, "int8") == 0) tol = (maxContribution + maxSum) / 127.0 * 0.5 + 1e-6;
            tol *= 1.01 * scale;
          }
          double err = std::fabs(recv[g] - expect);
          CHECK(exact ? recv[g] == static_cast<float>(expect) : err <= tol,
                "%d ranks codec %s scale %g: element %zu of op of %zu is %.6g, expected %.6g "
                "(tol %.4g)",
                nranks, codec, scale, i, c, recv[g], expect, tol);
        }
        off += c;
      }
    };
    pass(1.0);
    pass(1.0);
    pass(1.0 / 1024);
    // Exact ops the codec never touches: max over int32.
    {
      std::vector<int32_t> si(513), ri(513, 0);
      for (size_t i = 0; i < si.size(); ++i)
        si[i] = static_cast<int32_t>(i) * (rank == nranks - 1 ? 3 : 1);
      void* req = nullptr;
      CHECK_OK(
          cn.iallreduce(comm, si.data(), ri.data(), si.size(), wire::kInt32, wire::kMax, &req));
      int done = 0;
      while (!done) CHECK_OK(cn.t()->test(req, &done, nullptr));
      for (size_t i = 0; i < ri.size(); ++i)
        CHECK(ri[i] == static_cast<int32_t>(i) * 3, "max int32 at %zu", i);
    }
    // iallgather and ireducescatter over a window that cuts rank segments.
    if (version >= 9) {
      const size_t bpr = 40;  // bytes per rank (10 floats)
      size_t globalBytes = bpr * static_cast<size_t>(nranks);
      size_t wo = 12, wb = globalBytes - 12 - 8;
      // allgather: rank r owns bytes [r*bpr, (r+1)*bpr) with value r*1000 + byte.
      std::vector<uint8_t> mine(bpr);
      for (size_t b = 0; b < bpr; ++b)
        mine[b] = static_cast<uint8_t>(static_cast<size_t>(rank) * 50 + b);
      size_t lo = std::max(wo, static_cast<size_t>(rank) * bpr);
      std::vector<uint8_t> window(wb, 0);
      wire::SgeV9 part{nullptr, window.data(), wb};
      void* req = nullptr;
      CHECK_OK(cn.t()->iallgather(comm, mine.data() + (lo - static_cast<size_t>(rank) * bpr), 1,
                                  &part, bpr, wo, wb, nullptr, &req));
      int done = 0;
      while (!done) CHECK_OK(cn.t()->test(req, &done, nullptr));
      for (size_t b = 0; b < wb; ++b) {
        size_t g = wo + b;
        CHECK(window[b] == static_cast<uint8_t>((g / bpr) * 50 + g % bpr), "allgather byte %zu", g);
      }
      // reducescatter: input for the window of the global vector; sum.
      std::vector<float> in(wb / 4);
      for (size_t e = 0; e < in.size(); ++e) in[e] = contribution(rank, (wo / 4) + e);
      wire::SgeV9 sp{nullptr, in.data(), wb};
      std::vector<float> out(bpr / 4, -1.0f);
      CHECK_OK(cn.t()->ireducescatter(comm, 1, &sp, out.data(), bpr, wo, wb, wire::kFloat32,
                                      wire::kSum, nullptr, &req));
      done = 0;
      while (!done) CHECK_OK(cn.t()->test(req, &done, nullptr));
      size_t hi = std::min(wo + wb, static_cast<size_t>(rank + 1) * bpr);
      for (size_t g = lo; g < hi; g += 4) {
        float expect = static_cast<float>(sumAll * (1 + static_cast<double>((g / 4) % 5)));
        CHECK(out[(g - lo) / 4] == expect, "reducescatter element at byte %zu: %f vs %f", g,
              out[(g - lo) / 4], expect);
      }
    }
    CHECK_OK(cn.t()->deregMr(comm, smh));
    CHECK_OK(cn.t()->deregMr(comm, rmh));
    CHECK_OK(cn.t()->closeColl(comm));
    CHECK_OK(cn.finalize());
  };
  expectAllZero(runRanks(nranks, body, relayAll, 180));
}

TEST(CollNet, ExactAtTwoRanksEveryVersion) {
  for (int v : {8, 9, 10, 11, 12}) {
    SCOPED_TRACE(testing::Message() << "v" << v);
    collNetRanks(2, v, "none");
  }
}
TEST(CollNet, ExactAtThreeAndFourRanks) {
  collNetRanks(3, 11, "none");
  collNetRanks(4, 11, "none");
}
// 40 silent connections to rank 1's rendezvous before rank 0 delivers the
// group id: they are turned away in parallel (pending cap, handshake
// deadline), not one by one at 5 s each.
TEST(CollNet, SilentStraysOnTheRendezvousDoNotStallConnect) {
  gRendezvousStrays = 40;
  collNetRanks(3, 11, "none");
  gRendezvousStrays = 0;
}
TEST(CollNet, CodecsWithinBounds) {
  for (const char* codec : {"bf16", "fp16", "int8"}) {
    SCOPED_TRACE(codec);
    collNetRanks(3, 11, codec);
    collNetRanks(4, 11, codec);
  }
}
// A head killed after the group formed: the others' pending iallreduce fails
// with ncclRemoteError within SQUALL_TIMEOUT_S (20 s here).
TEST(CollNet, KilledHeadFailsPendingAllReduce) {
  const int nranks = 3;
  auto body = [nranks](int rank, int fd) {
    void* lib = loadPlugin();
    auto* t = static_cast<wire::CollNetV11*>(dlsym(lib, "ncclCollNetPlugin_v11"));
    void* ctx = nullptr;
    CHECK_OK(t->init(&ctx, 5, logger));
    char handle[wire::kHandleMaxBytes];
    void* lc = nullptr;
    CHECK_OK(t->listen(ctx, 0, handle, &lc));
    writeAll(fd, handle, sizeof(handle));
    std::vector<char> all(static_cast<size_t>(nranks) * wire::kHandleMaxBytes);
    readAll(fd, all.data(), all.size());
    std::vector<void*> handles;
    handles.reserve(static_cast<size_t>(nranks));
    for (int r = 0; r < nranks; ++r)
      handles.push_back(all.data() + static_cast<size_t>(r) * wire::kHandleMaxBytes);
    void* comm = nullptr;
    CHECK_OK(t->connect(handles.data(), nranks, rank, lc, &comm));
    CHECK_OK(t->closeListen(lc));
    std::vector<float> in(1 << 16, 1.0f), out(1 << 16);
    void* req = nullptr;
    // A few operations on every lane first, so the group is complete
    // everywhere before the head dies.
    for (int op = 0; op < 8; ++op) {
      CHECK_OK(t->iallreduce(comm, in.data(), out.data(), in.size(), wire::kFloat32, wire::kSum,
                             nullptr, nullptr, &req));
      int done = 0;
      while (!done) CHECK_OK(t->test(req, &done, nullptr));
    }
    if (rank == nranks - 1) raise(SIGKILL);
    CHECK_OK(t->iallreduce(comm, in.data(), out.data(), in.size(), wire::kFloat32, wire::kSum,
                           nullptr, nullptr, &req));
    auto start = Clock::now();
    int done = 0, rc = wire::kSuccess;
    while (!done && rc == wire::kSuccess && Clock::now() - start < std::chrono::seconds(40))
      rc = t->test(req, &done, nullptr);
    double took = std::chrono::duration<double>(Clock::now() - start).count();
    CHECK(!done && rc == wire::kRemoteError, "allreduce with a dead head: done %d rc %d", done, rc);
    CHECK(took < 21, "took %.1f s (SQUALL_TIMEOUT_S is 20)", took);
    CHECK_OK(t->closeColl(comm));
    CHECK_OK(t->finalize(ctx));
  };
  auto codes = runRanks(nranks, body, relayAll, 120);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], -SIGKILL);
}

TEST(CollNet, OneBitIsRefusedAtInit) {
  auto codes = runRanks(1, [](int, int) {
    setenv("SQUALL_COLLNET_CODEC", "onebit", 1);
    void* lib = loadPlugin();
    auto* t = static_cast<wire::CollNetV11*>(dlsym(lib, "ncclCollNetPlugin_v11"));
    void* ctx = nullptr;
    CHECK(t->init(&ctx, 1, logger) == wire::kInvalidArgument,
          "onebit must disable CollNet at init");
    auto* v12 = static_cast<wire::CollNetV12*>(dlsym(lib, "ncclCollNetPlugin_v12"));
    CHECK(v12->init(&ctx, 1, logger) == wire::kInvalidArgument,
          "v12: onebit must disable CollNet at init");
    for (const char* name :
         {"ncclCollNetPlugin_v8", "ncclCollNetPlugin_v9", "ncclCollNetPlugin_v10"}) {
      auto* older = static_cast<wire::CollNetV9*>(dlsym(lib, name));
      CHECK(older->init(logger) == wire::kInvalidArgument, "%s: onebit must disable CollNet", name);
    }
  });
  expectAllZero(codes);
}

}  // namespace
