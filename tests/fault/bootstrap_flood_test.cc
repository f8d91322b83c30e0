// Connections without the job secret must not keep the real ranks out
// (docs/protocol.md, "Limits"): a listener holds a bounded number of
// unauthenticated connections, gives each a handshake deadline, backs off
// when accept() runs out of descriptors, and an error about missing ranks
// says that a flood was seen instead of only blaming them.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "src/bootstrap/bootstrap.h"
#include "src/bootstrap/socket.h"

namespace squall::bootstrap {
namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;
constexpr char kGoodHello[] = "REALHELO";

int listenLoopback(SocketAddress* bound) {
  std::string error;
  int fd = openListener(SocketAddress::loopbackV4(), bound, &error);
  EXPECT_GE(fd, 0) << error;
  return fd;
}

// A connected client socket (blocking), or -1.
int connectTo(const SocketAddress& address) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&address.storage), address.length) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

HelloAcceptor realHelloAcceptor(bool* admitted) {
  HelloAcceptor acceptor;
  acceptor.helloBytes = 8;
  acceptor.admit = [admitted](const void* hello, int fd, const SocketAddress&) -> std::string {
    if (std::memcmp(hello, kGoodHello, 8) != 0) return "wrong hello";
    *admitted = true;
    close(fd);
    return "";
  };
  acceptor.refused = [](const SocketAddress&, const std::string&) {};
  acceptor.complete = [admitted] { return *admitted; };
  return acceptor;
}

// Runs acceptHellos for `seconds` in a child process limited to 64
// descriptors while the parent holds `idle` connections to it, then (if
// `sendReal`) a real client. Returns {admitted, wall s, CPU s}.
struct FloodResult {
  bool admitted = false;
  double wall = 0;
  double cpu = 0;
};
FloodResult acceptUnderFlood(int idleCount, bool sendReal, std::chrono::seconds limit) {
  FloodResult out;
  SocketAddress bound;
  int listener = listenLoopback(&bound);
  if (listener < 0) return out;
  int report[2];
  EXPECT_EQ(pipe(report), 0);
  pid_t child = fork();
  EXPECT_GE(child, 0);
  if (child == 0) {
    close(report[0]);
    rlimit fdLimit{64, 64};
    setrlimit(RLIMIT_NOFILE, &fdLimit);
    bool admitted = false;
    const auto start = SteadyClock::now();
    acceptHellos(listener, realHelloAcceptor(&admitted), start + limit);
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    double result[2] = {
        std::chrono::duration<double>(SteadyClock::now() - start).count(),
        static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
            static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6};
    ssize_t ignored = write(report[1], result, sizeof(result));
    (void)ignored;
    _exit(admitted ? 0 : 1);
  }
  close(report[1]);
  close(listener);
  std::vector<int> idle;
  for (int i = 0; i < idleCount; ++i) {
    int fd = connectTo(bound);
    if (fd >= 0) idle.push_back(fd);
  }
  EXPECT_GE(idle.size(), static_cast<size_t>(idleCount) * 3 / 4);
  std::this_thread::sleep_for(200ms);  // the listener is at its limit now
  int real = -1;
  if (sendReal) {
    real = connectTo(bound);
    EXPECT_GE(real, 0);
    EXPECT_EQ(send(real, kGoodHello, 8, MSG_NOSIGNAL), 8);
  }
  int status = 0;
  EXPECT_EQ(waitpid(child, &status, 0), child);
  double result[2] = {0, 0};
  EXPECT_EQ(read(report[0], result, sizeof(result)), static_cast<ssize_t>(sizeof(result)));
  close(report[0]);
  if (real >= 0) close(real);
  for (int fd : idle) close(fd);
  out.admitted = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  out.wall = result[0];
  out.cpu = result[1];
  std::printf("accepting under the flood: %.3f s wall, %.3f s CPU\n", out.wall, out.cpu);
  return out;
}

// The case: more idle connections than the accepting process has
// descriptors. Accepting used to spin on EMFILE with the real client never
// accepted; now the older idle ones are closed and the real client gets in.
TEST(BootstrapFlood, IdleFloodPastTheDescriptorLimitDoesNotKeepTheRealClientOut) {
  FloodResult r = acceptUnderFlood(400, true, 20s);
  EXPECT_TRUE(r.admitted) << "the real client was never admitted (" << r.wall << " s)";
  EXPECT_LT(r.wall, 10.0);
}

// Out of descriptors with nobody real coming: accepting backs off instead
// of spinning on a listener that stays readable (it took 25-100% of a core).
TEST(BootstrapFlood, NoSpinWhileOutOfDescriptors) {
  FloodResult r = acceptUnderFlood(400, false, 2s);
  EXPECT_FALSE(r.admitted);
  EXPECT_LT(r.cpu, 0.1 * r.wall) << r.cpu << " s of CPU in " << r.wall << " s";
}

// A connection that never sends its hello is closed at its deadline, not
// held until the whole rendezvous gives up.
TEST(BootstrapFlood, SilentConnectionIsClosedAtItsHandshakeDeadline) {
  SocketAddress bound;
  int listener = listenLoopback(&bound);
  ASSERT_GE(listener, 0);
  bool admitted = false;
  HelloAcceptor acceptor = realHelloAcceptor(&admitted);
  acceptor.handshakeTimeout = 300ms;
  AcceptStats stats;
  std::thread server([&] { acceptHellos(listener, acceptor, SteadyClock::now() + 6s, &stats); });
  int silent = connectTo(bound);
  ASSERT_GE(silent, 0);
  const auto start = SteadyClock::now();
  pollfd p{silent, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1);
  char byte;
  EXPECT_LE(recv(silent, &byte, 1, 0), 0);  // closed by the server
  const double waited = std::chrono::duration<double>(SteadyClock::now() - start).count();
  EXPECT_LT(waited, 2.0);
  // Let the server finish: the real client comes.
  int real = connectTo(bound);
  ASSERT_GE(real, 0);
  ASSERT_EQ(send(real, kGoodHello, 8, MSG_NOSIGNAL), 8);
  server.join();
  EXPECT_TRUE(admitted);
  EXPECT_EQ(stats.timedOut, 1u);
  close(silent);
  close(real);
  close(listener);
}

// More idle connections than the pending cap: the oldest are closed, the
// real client still gets in, and the stats say what was turned away.
TEST(BootstrapFlood, PendingCapClosesTheOldest) {
  SocketAddress bound;
  int listener = listenLoopback(&bound);
  ASSERT_GE(listener, 0);
  bool admitted = false;
  HelloAcceptor acceptor = realHelloAcceptor(&admitted);
  acceptor.maxPending = 16;
  AcceptStats stats;
  std::vector<int> idle;
  idle.reserve(100);
  for (int i = 0; i < 100; ++i) idle.push_back(connectTo(bound));
  int real = connectTo(bound);
  ASSERT_GE(real, 0);
  ASSERT_EQ(send(real, kGoodHello, 8, MSG_NOSIGNAL), 8);
  EXPECT_TRUE(acceptHellos(listener, acceptor, SteadyClock::now() + 10s, &stats));
  EXPECT_GE(stats.droppedOldest, 100u - 16u);
  EXPECT_NE(stats.describe().find("past the pending cap"), std::string::npos);
  for (int fd : idle) close(fd);
  close(real);
  close(listener);
}

// What the error clause blames: running out of descriptors is this
// process's limit and says how to raise it; only connections turned away
// suggest a flood from outside.
TEST(BootstrapFlood, DescribeBlamesTheRightCause) {
  AcceptStats none;
  EXPECT_EQ(none.describe(), "");
  AcceptStats limit;
  limit.acceptFailures = 12;
  limit.acceptErrno = EMFILE;
  const std::string l = limit.describe();
  EXPECT_NE(l.find("accept failed 12 time(s)"), std::string::npos) << l;
  EXPECT_NE(l.find("ulimit -n"), std::string::npos) << l;
  EXPECT_EQ(l.find("turned away"), std::string::npos) << l;
  EXPECT_EQ(l.find("flood"), std::string::npos) << l;
  AcceptStats flood;
  flood.refused = 3;
  flood.lastRefused = "127.0.0.1:5";
  const std::string f = flood.describe();
  EXPECT_NE(f.find("3 connection(s) without a valid handshake were turned away"), std::string::npos)
      << f;
  EXPECT_NE(f.find("flood"), std::string::npos) << f;
  EXPECT_EQ(f.find("ulimit"), std::string::npos) << f;
  flood.acceptFailures = 1;
  flood.acceptErrno = ENFILE;
  const std::string both = flood.describe();
  EXPECT_NE(both.find("and accept failed 1 time(s)"), std::string::npos) << both;
  EXPECT_NE(both.find("ulimit -n"), std::string::npos) << both;
  EXPECT_NE(both.find("flood"), std::string::npos) << both;
}

// Rank 0 of a 2-rank job whose rank 1 never comes, under a flood of bad
// handshakes: the error names rank 1 and says a flood was turned away.
TEST(BootstrapFlood, MissingRankErrorMentionsTheFlood) {
  setenv("SQUALL_SOCKET_IFNAME", "lo", 1);
  UniqueId id;
  ASSERT_EQ(createUniqueId(&id), Status::kOk) << lastError();
  // The root's address is in the id (see bootstrap.cc's IdLayout): magic,
  // version, reserved, then the WireAddress.
  WireAddress wire;
  std::memcpy(&wire, id.bytes + 8, sizeof(wire));
  SocketAddress root;
  ASSERT_TRUE(fromWire(wire, &root));
  std::thread flood([&] {
    std::vector<int> fds;
    for (int i = 0; i < 40; ++i) {
      int fd = connectTo(root);
      if (fd < 0) continue;
      char junk[128];
      std::memset(junk, 'x', sizeof(junk));
      ssize_t ignored = send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
      (void)ignored;
      fds.push_back(fd);
    }
    std::this_thread::sleep_for(500ms);
    for (int fd : fds) close(fd);
  });
  std::unique_ptr<Bootstrap> boot;
  EXPECT_EQ(Bootstrap::create(id, 2, 0, 2s, &boot), Status::kTimeout);
  const std::string& why = lastError();
  flood.join();
  EXPECT_NE(why.find("rank 1 of 2 did not join"), std::string::npos) << why;
  EXPECT_NE(why.find("turned away"), std::string::npos) << why;
}

}  // namespace
}  // namespace squall::bootstrap
