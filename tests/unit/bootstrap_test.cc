// Rendezvous: ranks as threads and as processes, strays and impostors that
// must be refused without harming the job, missing and dying ranks that must
// be named, and the torchrun-style environment.
#include "src/bootstrap/bootstrap.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "src/bootstrap/local_ranks.h"
#include "src/bootstrap/socket.h"
#include "src/transport/tcp/tcp_transport.h"

namespace squall::bootstrap {
namespace {

using namespace std::chrono_literals;

// Every test stays on loopback.
class BootstrapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("SQUALL_SOCKET_IFNAME", "lo", 1);
    setenv("SQUALL_DEBUG", "WARN", 0);  // the tests read WARN lines; TRACE helps debugging
    unsetenv("SQUALL_DEBUG_FILE");
    reloadLogConfig();
  }
};

// Runs fn(rank) on one thread per rank.
void onThreads(int nranks, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(nranks));
  for (int r = 0; r < nranks; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

TEST_F(BootstrapTest, ThreadsJoinAndExchange) {
  for (int nranks : {1, 2, 5}) {
    UniqueId id;
    ASSERT_EQ(createUniqueId(&id), Status::kOk);
    onThreads(nranks, [&](int rank) {
      std::unique_ptr<Bootstrap> boot;
      ASSERT_EQ(Bootstrap::create(id, nranks, rank, 10s, &boot), Status::kOk) << lastError();
      EXPECT_EQ(boot->rank(), rank);
      EXPECT_EQ(boot->size(), nranks);
      for (int round = 0; round < 3; ++round) {
        uint64_t mine = static_cast<uint64_t>(rank) * 1000 + static_cast<uint64_t>(round);
        std::vector<uint64_t> all(static_cast<size_t>(nranks));
        ASSERT_EQ(boot->allGather(&mine, sizeof(mine), all.data()), Status::kOk) << lastError();
        for (int r = 0; r < nranks; ++r)
          EXPECT_EQ(all[static_cast<size_t>(r)], static_cast<uint64_t>(r) * 1000 + round);
        ASSERT_EQ(boot->barrier(), Status::kOk) << lastError();
      }
      EXPECT_EQ(boot->allGather(nullptr, 0, nullptr), Status::kOk);
    });
  }
}

// The unique id's layout (docs/protocol.md): root address at 8, secret at 32.
struct RawId {
  sockaddr_in root{};
  uint8_t secret[16];
};

RawId parseId(const UniqueId& id) {
  RawId raw;
  uint16_t family, port;
  std::memcpy(&family, id.bytes + 8, 2);
  std::memcpy(&port, id.bytes + 10, 2);
  EXPECT_EQ(family, 4);
  raw.root.sin_family = AF_INET;
  raw.root.sin_port = htons(port);
  std::memcpy(&raw.root.sin_addr, id.bytes + 16, 4);
  std::memcpy(raw.secret, id.bytes + 32, 16);
  return raw;
}

// Connects to the root like a rank would and sends `hello` (56 bytes) or
// garbage; returns once the root closed the connection (or after 5 s).
void impostor(const RawId& id, const void* hello, size_t bytes) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&id.root), sizeof(id.root)), 0);
  ASSERT_EQ(send(fd, hello, bytes, MSG_NOSIGNAL), static_cast<ssize_t>(bytes));
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char byte;
  ssize_t got = recv(fd, &byte, 1, 0);
  // EOF, or a reset when the root closed with some of our bytes unread.
  EXPECT_TRUE(got == 0 || (got < 0 && errno == ECONNRESET))
      << "the root should have closed the impostor's connection";
  close(fd);
}

std::vector<uint8_t> makeHello(uint32_t magic, uint32_t version, const uint8_t* secret,
                               int32_t rank, int32_t nranks) {
  std::vector<uint8_t> hello(56, 0);
  std::memcpy(hello.data(), &magic, 4);
  std::memcpy(hello.data() + 4, &version, 4);
  std::memcpy(hello.data() + 8, secret, 16);
  std::memcpy(hello.data() + 24, &rank, 4);
  std::memcpy(hello.data() + 28, &nranks, 4);
  return hello;
}

// Ranks of one machine share its cores unless they are bound to disjoint
// ones: unbound, every rank counts all three; each bound to a CPU of its
// own, each counts only itself; two bound to the same CPU count each other.
TEST_F(BootstrapTest, LocalRanksAreThoseSharingCores) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  const int nranks = 3;
  // -1: unbound; else the index into cpus this rank is bound to.
  auto count = [&](const std::vector<int>& binding) {
    UniqueId id;
    EXPECT_EQ(createUniqueId(&id), Status::kOk);
    std::vector<int> counted(nranks, 0);
    onThreads(nranks, [&](int rank) {
      const int b = binding[static_cast<size_t>(rank)];
      if (b >= 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[static_cast<size_t>(b)], &one);
        ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof(one), &one), 0);
      }
      std::unique_ptr<Bootstrap> boot;
      ASSERT_EQ(Bootstrap::create(id, nranks, rank, 10s, &boot), Status::kOk) << lastError();
      ASSERT_EQ(countLocalRanks(*boot, &counted[static_cast<size_t>(rank)]), Status::kOk)
          << lastError();
    });
    return counted;
  };
  EXPECT_EQ(count({-1, -1, -1}), (std::vector<int>{3, 3, 3}));
  if (cpus.size() < 2) GTEST_SKIP() << "this process may run on one CPU only";
  EXPECT_EQ(count({0, 1, 1}), (std::vector<int>{1, 2, 2}));
  EXPECT_EQ(count({0, 1, -1}), (std::vector<int>{2, 2, 3}));
}

// The default address is not a container bridge's while a real interface is
// up: docker0 (made first, so listed first) is passed over for eth7. In a
// private network namespace; skipped without root or namespaces.
TEST(LocalAddress, BridgesAreNotTheDefault) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for a network namespace";
  if (std::system("command -v ip >/dev/null 2>&1") != 0) GTEST_SKIP() << "needs ip (iproute2)";
  fflush(nullptr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (unshare(CLONE_NEWNET) != 0) _exit(77);
    if (std::system("ip link add docker0 type bridge && ip addr add 172.17.0.1/16 dev docker0 && "
                    "ip link set docker0 up && ip link add eth7 type veth peer name eth7p && "
                    "ip addr add 10.99.0.1/24 dev eth7 && ip link set eth7 up && "
                    "ip link set eth7p up") != 0)
      _exit(77);
    unsetenv("SQUALL_SOCKET_IFNAME");
    SocketAddress address;
    std::string error;
    if (!chooseLocalAddress(&address, &error)) _exit(2);
    const std::string text = address.toString();
    std::fprintf(stderr, "chose %s\n", text.c_str());
    _exit(text.rfind("10.99.0.1", 0) == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "no network namespace, bridge or veth";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the default address is docker0's";
}

TEST_F(BootstrapTest, ImpostorsAreRefusedAndTheJobCarriesOn) {
  constexpr uint32_t kMagic = 0x48425153;
  constexpr int kRanks = 3;
  UniqueId id;
  ASSERT_EQ(createUniqueId(&id), Status::kOk);
  RawId raw = parseId(id);
  uint8_t wrong[16];
  std::memset(wrong, 0x5a, sizeof(wrong));
  testing::internal::CaptureStderr();
  std::vector<std::thread> threads;
  auto rank = [&](int r) {
    std::unique_ptr<Bootstrap> boot;
    ASSERT_EQ(Bootstrap::create(id, kRanks, r, 10s, &boot), Status::kOk) << lastError();
    int mine = r + 40;
    int all[kRanks];
    ASSERT_EQ(boot->allGather(&mine, sizeof(mine), all), Status::kOk) << lastError();
    for (int i = 0; i < kRanks; ++i) EXPECT_EQ(all[i], i + 40);
  };
  threads.emplace_back(rank, 0);
  threads.emplace_back(rank, 1);
  std::this_thread::sleep_for(300ms);  // rank 1 has joined: a second "rank 1" is a duplicate
  const char garbage[] = "GET / HTTP/1.0\r\n\r\n this is not a squall client at all, no.";
  impostor(raw, garbage, sizeof(garbage));
  impostor(raw, makeHello(kMagic, 1, wrong, 2, kRanks).data(), 56);
  impostor(raw, makeHello(kMagic, 99, raw.secret, 2, kRanks).data(), 56);
  impostor(raw, makeHello(kMagic, 1, raw.secret, 7, kRanks).data(), 56);
  impostor(raw, makeHello(kMagic, 1, raw.secret, 2, 4).data(), 56);
  impostor(raw, makeHello(kMagic, 1, raw.secret, 1, kRanks).data(), 56);
  {  // connects and leaves without a word
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&raw.root), sizeof(raw.root)), 0);
    close(fd);
  }
  threads.emplace_back(rank, 2);
  for (std::thread& t : threads) t.join();
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("bad magic"), std::string::npos) << log;
  EXPECT_NE(log.find("wrong job secret"), std::string::npos) << log;
  EXPECT_NE(log.find("protocol version 99"), std::string::npos) << log;
  EXPECT_NE(log.find("claims rank 7, outside 1..2"), std::string::npos) << log;
  EXPECT_NE(log.find("world size of 4"), std::string::npos) << log;
  EXPECT_NE(log.find("claims rank 1, which has already joined"), std::string::npos) << log;
  EXPECT_NE(log.find("closed the connection before completing"), std::string::npos) << log;
  EXPECT_NE(log.find("refused a bootstrap connection from 127.0.0.1:"), std::string::npos) << log;
}

// A member that joined properly and then sends a malformed frame: rank 0
// fails (bad magic: kCorruptData; wrong size: kInvalidUsage) without reading
// past what it expected.
TEST_F(BootstrapTest, MalformedFramesFromAMemberAreRejected) {
  constexpr uint32_t kMagic = 0x48425153;
  for (int variant = 0; variant < 2; ++variant) {
    UniqueId id;
    ASSERT_EQ(createUniqueId(&id), Status::kOk);
    RawId raw = parseId(id);
    std::thread fake([&] {
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      ASSERT_EQ(connect(fd, reinterpret_cast<const sockaddr*>(&raw.root), sizeof(raw.root)), 0);
      std::vector<uint8_t> hello = makeHello(kMagic, 1, raw.secret, 1, 2);
      ASSERT_EQ(send(fd, hello.data(), hello.size(), MSG_NOSIGNAL), 56);
      char ack[8];
      ASSERT_EQ(recv(fd, ack, sizeof(ack), MSG_WAITALL), 8);
      uint32_t header[4] = {variant == 0 ? 0xdeadbeefu : 0x46425153u, 1, 1u << 30, 0};
      ASSERT_EQ(send(fd, header, sizeof(header), MSG_NOSIGNAL), 16);
      char byte;
      recv(fd, &byte, 1, 0);  // until rank 0 hangs up
      close(fd);
    });
    std::unique_ptr<Bootstrap> boot;
    ASSERT_EQ(Bootstrap::create(id, 2, 0, 5s, &boot), Status::kOk) << lastError();
    uint64_t mine = 1, all[2] = {0, 0};
    if (variant == 0) {
      EXPECT_EQ(boot->allGather(&mine, 8, all), Status::kCorruptData);
      EXPECT_NE(lastError().find("rank 1 sent a malformed bootstrap frame (bad magic 0xdeadbeef)"),
                std::string::npos)
          << lastError();
    } else {
      EXPECT_EQ(boot->allGather(&mine, 8, all), Status::kInvalidUsage);
      EXPECT_NE(lastError().find("rank 1 called bootstrap allGather with 1073741824 bytes but "
                                 "rank 0 called allGather with 8 bytes"),
                std::string::npos)
          << lastError();
    }
    EXPECT_EQ(all[1], 0u);
    // The bootstrap refuses to go on after a failure.
    EXPECT_EQ(boot->barrier(), Status::kRemoteError);
    fake.join();
  }
}

// A root that answers with an oversized reply: the member fails with
// kCorruptData before reading any of it.
TEST_F(BootstrapTest, MalformedReplyFromTheRootIsRejected) {
  UniqueId id;
  ASSERT_EQ(createUniqueId(&id), Status::kOk);  // only for a valid layout and secret
  RawId raw = parseId(id);
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  socklen_t len = sizeof(address);
  getsockname(listener, reinterpret_cast<sockaddr*>(&address), &len);
  uint16_t port = ntohs(address.sin_port);
  std::memcpy(id.bytes + 10, &port, 2);  // point the id at the fake root
  std::thread root([&] {
    int fd = accept(listener, nullptr, nullptr);
    ASSERT_GE(fd, 0);
    char hello[56];
    ASSERT_EQ(recv(fd, hello, sizeof(hello), MSG_WAITALL), 56);
    EXPECT_EQ(std::memcmp(hello + 8, raw.secret, 16), 0);
    uint32_t ack[2] = {0x41425153, 1};
    ASSERT_EQ(send(fd, ack, sizeof(ack), MSG_NOSIGNAL), 8);
    char frame[16 + 8];
    ASSERT_EQ(recv(fd, frame, sizeof(frame), MSG_WAITALL), 24);
    uint64_t reply[2] = {0x46425153ull | (1ull << 32), 1ull << 40};
    ASSERT_EQ(send(fd, reply, sizeof(reply), MSG_NOSIGNAL), 16);
    char byte;
    recv(fd, &byte, 1, 0);
    close(fd);
  });
  std::unique_ptr<Bootstrap> boot;
  ASSERT_EQ(Bootstrap::create(id, 2, 1, 5s, &boot), Status::kOk) << lastError();
  uint64_t mine = 1, all[2] = {0, 0};
  EXPECT_EQ(boot->allGather(&mine, 8, all), Status::kCorruptData);
  EXPECT_NE(lastError().find("1099511627776 bytes instead of 16"), std::string::npos)
      << lastError();
  EXPECT_EQ(all[0], 0u);
  boot.reset();
  root.join();
  close(listener);
}

TEST_F(BootstrapTest, MissingRanksAreNamed) {
  UniqueId id;
  ASSERT_EQ(createUniqueId(&id), Status::kOk);
  auto start = std::chrono::steady_clock::now();
  onThreads(2, [&](int rank) {
    std::unique_ptr<Bootstrap> boot;
    EXPECT_EQ(Bootstrap::create(id, 4, rank, 1s, &boot), Status::kTimeout);
    if (rank == 0)
      EXPECT_NE(lastError().find("ranks 2, 3 of 4 did not join within 1 s"), std::string::npos)
          << lastError();
    else
      EXPECT_NE(lastError().find("not every rank joined"), std::string::npos) << lastError();
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST_F(BootstrapTest, RootThatNeverStartsIsReported) {
  UniqueId id;
  ASSERT_EQ(createUniqueId(&id), Status::kOk);
  RawId raw = parseId(id);
  // A port nobody listens on: bind one, learn it, close it.
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&any), sizeof(any)), 0);
  socklen_t len = sizeof(any);
  getsockname(fd, reinterpret_cast<sockaddr*>(&any), &len);
  close(fd);
  uint16_t port = ntohs(any.sin_port);
  std::memcpy(id.bytes + 10, &port, 2);
  (void)raw;
  std::unique_ptr<Bootstrap> boot;
  EXPECT_EQ(Bootstrap::create(id, 2, 1, 500ms, &boot), Status::kTimeout);
  EXPECT_NE(lastError().find("could not reach the root"), std::string::npos) << lastError();
}

TEST_F(BootstrapTest, CorruptIdIsRejected) {
  UniqueId id;
  std::memset(id.bytes, 0, sizeof(id.bytes));
  std::unique_ptr<Bootstrap> boot;
  EXPECT_EQ(Bootstrap::create(id, 2, 1, 1s, &boot), Status::kInvalidArgument);
  EXPECT_NE(lastError().find("not a Squall unique id"), std::string::npos) << lastError();
  ASSERT_EQ(createUniqueId(&id), Status::kOk);
  EXPECT_EQ(Bootstrap::create(id, 2, 2, 1s, &boot), Status::kInvalidArgument);
}

class EnvTest : public BootstrapTest {
 protected:
  void SetUp() override {
    BootstrapTest::SetUp();
    for (const char* name : {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "SQUALL_PORT",
                             "SQUALL_PORT_OFFSET", "SQUALL_JOB_SECRET"})
      unsetenv(name);
  }
  void TearDown() override { SetUp(); }
  Status read() { return uniqueIdFromEnv(&id_, &rank_, &nranks_); }
  void expectError(const char* needle) {
    EXPECT_EQ(read(), Status::kInvalidArgument);
    EXPECT_NE(lastError().find(needle), std::string::npos) << lastError();
  }
  uint16_t port() const {
    uint16_t p;
    std::memcpy(&p, id_.bytes + 10, 2);
    return p;
  }
  UniqueId id_;
  int rank_ = -1, nranks_ = -1;
};

TEST_F(EnvTest, ReportsEachBadVariable) {
  expectError("WORLD_SIZE is not set");
  setenv("WORLD_SIZE", "four", 1);
  expectError("WORLD_SIZE=\"four\" is not an integer");
  setenv("WORLD_SIZE", "0", 1);
  expectError("WORLD_SIZE=0 must be a positive");
  setenv("WORLD_SIZE", "4", 1);
  expectError("RANK is not set");
  setenv("RANK", "4", 1);
  expectError("RANK=4 must be between 0 and WORLD_SIZE-1 (3)");
  setenv("RANK", "2", 1);
  expectError("MASTER_ADDR is not set");
  setenv("MASTER_ADDR", "no such host.invalid", 1);
  setenv("MASTER_PORT", "29500", 1);
  expectError("MASTER_ADDR=\"no such host.invalid\" does not resolve");
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "http", 1);
  expectError("MASTER_PORT=\"http\" is not an integer");
  setenv("MASTER_PORT", "70000", 1);
  expectError("MASTER_PORT=70000 is not a TCP port");
  setenv("MASTER_PORT", "65530", 1);
  expectError("plus SQUALL_PORT_OFFSET=17 gives 65547");
  setenv("SQUALL_PORT", "0", 1);
  expectError("SQUALL_PORT=0 is not a TCP port");
}

TEST_F(EnvTest, BuildsTheId) {
  setenv("WORLD_SIZE", "4", 1);
  setenv("RANK", "3", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  ASSERT_EQ(read(), Status::kOk) << lastError();
  EXPECT_EQ(rank_, 3);
  EXPECT_EQ(nranks_, 4);
  EXPECT_EQ(port(), 29517);
  UniqueId first = id_;
  setenv("SQUALL_PORT_OFFSET", "3", 1);
  ASSERT_EQ(read(), Status::kOk);
  EXPECT_EQ(port(), 29503);
  setenv("SQUALL_PORT", "31000", 1);
  ASSERT_EQ(read(), Status::kOk);
  EXPECT_EQ(port(), 31000);
  // The secret follows SQUALL_JOB_SECRET.
  EXPECT_EQ(std::memcmp(first.bytes + 32, id_.bytes + 32, 16), 0);
  setenv("SQUALL_JOB_SECRET", "job 17", 1);
  ASSERT_EQ(read(), Status::kOk);
  EXPECT_NE(std::memcmp(first.bytes + 32, id_.bytes + 32, 16), 0);
}

// A loopback port nobody listens on: bind one, learn it, close it. 0 when
// the address family is unavailable here.
uint16_t unusedPort(int family) {
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_storage storage{};
  socklen_t len;
  if (family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&storage);
    in->sin_family = AF_INET;
    in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof(*in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_addr = in6addr_loopback;
    len = sizeof(*in6);
  }
  uint16_t port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&storage), len) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&storage), &len) == 0)
    port = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&storage)->sin_port
                                   : reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port);
  close(fd);
  return port;
}

// Rank 0 binds the port the id names when the id was not made in its
// process; over IPv4 and (where the host has it) IPv6 loopback, through to a
// working TCP transport.
TEST_F(EnvTest, RootBindsTheNamedPort) {
  for (int family : {AF_INET, AF_INET6}) {
    uint16_t port = unusedPort(family);
    if (port == 0) {
      ASSERT_EQ(family, AF_INET6) << "no IPv4 loopback";
      continue;  // no IPv6 loopback on this host
    }
    setenv("WORLD_SIZE", "3", 1);
    setenv("RANK", "0", 1);
    setenv("MASTER_ADDR", family == AF_INET ? "127.0.0.1" : "::1", 1);
    setenv("SQUALL_PORT", std::to_string(port).c_str(), 1);
    ASSERT_EQ(read(), Status::kOk) << lastError();
    onThreads(3, [&](int rank) {
      std::unique_ptr<Bootstrap> boot;
      ASSERT_EQ(Bootstrap::create(id_, 3, rank, 10s, &boot), Status::kOk) << lastError();
      EXPECT_EQ(boot->localAddress().family(), family);
      std::unique_ptr<transport::Transport> net;
      ASSERT_EQ(transport::createTcpTransport(*boot, &net), Status::kOk) << lastError();
      int next = (rank + 1) % 3, prev = (rank + 2) % 3, got = -1;
      transport::RequestPtr requests[2];
      net->recv(prev, transport::Tag{1, 0, {}}, &got, sizeof(got), &requests[0]);
      net->send(next, transport::Tag{1, 0, {}}, &rank, sizeof(rank), &requests[1]);
      EXPECT_EQ(net->waitAll(requests, transport::Clock::now() + 5s), Status::kOk);
      EXPECT_EQ(got, prev);
      EXPECT_EQ(boot->barrier(), Status::kOk);
    });
  }
}

// Ranks as processes: rank 0 is this process, the others are fork()ed
// children that report through their exit status (0: all checks passed).
// After a full exchange, rank `kVictim` _exit()s in the middle of the next
// one; every survivor's pending requests must fail with kRemoteError naming
// it, promptly.
TEST_F(BootstrapTest, ProcessesAndAKilledPeer) {
  constexpr int kRanks = 4;
  constexpr int kVictim = 2;
  UniqueId id;
  ASSERT_EQ(createUniqueId(&id), Status::kOk);
  // Returns the number of failed checks (0: pass).
  auto body = [&](int rank) -> int {
    int failures = 0;
    auto check = [&](bool ok, const char* what) {
      if (!ok) {
        std::fprintf(stderr, "rank %d: check failed: %s (%s)\n", rank, what, lastError().c_str());
        ++failures;
      }
    };
    std::unique_ptr<Bootstrap> boot;
    if (Bootstrap::create(id, kRanks, rank, 10s, &boot) != Status::kOk) return 100;
    int pid = getpid();
    std::vector<int> pids(kRanks);
    check(boot->allGather(&pid, sizeof(pid), pids.data()) == Status::kOk, "allGather");
    check(pids[static_cast<size_t>(rank)] == pid, "own pid");
    std::unique_ptr<transport::Transport> net;
    if (transport::createTcpTransport(*boot, &net) != Status::kOk) return 101;
    using transport::RequestPtr;
    using transport::Tag;
    // Round 1: everyone with everyone.
    std::vector<int> in(kRanks, -1);
    std::vector<int> out(kRanks);
    std::vector<RequestPtr> requests(size_t{2} * kRanks);
    for (int p = 0; p < kRanks; ++p) {
      out[static_cast<size_t>(p)] = rank * 100 + p;
      net->recv(p, Tag{1, 0, {}}, &in[static_cast<size_t>(p)], sizeof(int),
                &requests[2 * static_cast<size_t>(p)]);
      net->send(p, Tag{1, 0, {}}, &out[static_cast<size_t>(p)], sizeof(int),
                &requests[2 * static_cast<size_t>(p) + 1]);
    }
    check(net->waitAll(requests, transport::Clock::now() + 5s) == Status::kOk, "round 1");
    for (int p = 0; p < kRanks; ++p) check(in[static_cast<size_t>(p)] == p * 100 + rank, "data");
    requests.clear();
    requests.resize(size_t{2} * kRanks);
    // Round 2: the victim dies instead of sending.
    std::vector<char> big(1 << 20, 'x');
    std::vector<std::vector<char>> bigIn(kRanks, std::vector<char>(1 << 20));
    if (rank == kVictim) {
      net->recv(0, Tag{2, 0, {}}, bigIn[0].data(), big.size(), &requests[0]);
      _exit(0);
    }
    for (int p = 0; p < kRanks; ++p) {
      net->recv(p, Tag{2, 0, {}}, bigIn[static_cast<size_t>(p)].data(), big.size(),
                &requests[2 * static_cast<size_t>(p)]);
      net->send(p, Tag{2, 0, {}}, big.data(), big.size(),
                &requests[2 * static_cast<size_t>(p) + 1]);
    }
    auto start = transport::Clock::now();
    Status status = net->waitAll(requests, start + 5s);
    check(status == Status::kRemoteError, "round 2 fails with kRemoteError");
    check(transport::Clock::now() - start < 3s, "promptly");
    check(requests[size_t{2} * kVictim]->done() &&
              requests[size_t{2} * kVictim]->status() == Status::kRemoteError,
          "the receive from the victim failed");
    for (int p = 0; p < kRanks; ++p) {
      if (p == kVictim) continue;
      // Requests with the survivors are unaffected.
      while (!requests[2 * static_cast<size_t>(p)]->done())
        net->waitForActivity(transport::Clock::now() + 100ms);
      check(requests[2 * static_cast<size_t>(p)]->status() == Status::kOk,
            "receive from a survivor");
    }
    // Later requests with the victim fail at once.
    RequestPtr late;
    net->send(kVictim, Tag{3, 0, {}}, big.data(), 8, &late);
    check(late->done() && late->status() == Status::kRemoteError, "a later send fails at once");
    check(
        lastError().find("rank 2 closed its connection (it may have crashed)") != std::string::npos,
        "the error names the victim");
    requests.clear();
    late.reset();
    net.reset();
    // The bootstrap notices too: rank 0 names the victim, and the other
    // survivors hear from rank 0 that the operation was abandoned.
    check(boot->barrier() == Status::kRemoteError, "the barrier fails with kRemoteError");
    if (rank == 0)
      check(lastError().find("rank 2 closed its bootstrap connection during barrier") !=
                std::string::npos,
            "rank 0 names the victim");
    else
      check(lastError().find("rank 0 closed its bootstrap connection") != std::string::npos,
            "the others name rank 0");
    return failures;
  };
  std::vector<pid_t> children;
  for (int rank = 1; rank < kRanks; ++rank) {
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      int failures = body(rank);
      std::fflush(stderr);
      _exit(failures);
    }
    children.push_back(child);
  }
  EXPECT_EQ(body(0), 0);
  for (size_t i = 0; i < children.size(); ++i) {
    int wstatus = 0;
    ASSERT_EQ(waitpid(children[i], &wstatus, 0), children[i]);
    ASSERT_TRUE(WIFEXITED(wstatus)) << "rank " << i + 1 << " crashed";
    EXPECT_EQ(WEXITSTATUS(wstatus), 0) << "rank " << i + 1 << " failed checks (see its output)";
  }
}

}  // namespace
}  // namespace squall::bootstrap
