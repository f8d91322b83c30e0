#include "src/transport/tcp/mesh.h"

#include <unistd.h>

#include <cstring>
#include <string>

#include "src/bootstrap/socket.h"
#include "src/common/params.h"
#include "src/transport/transport.h"

namespace squall::transport::tcp {
namespace {

using bootstrap::Io;
using bootstrap::SocketAddress;
using bootstrap::WireAddress;

constexpr uint32_t kHelloMagic = 0x48545153;  // "SQTH"
constexpr uint32_t kHelloVersion = 2;         // 2: connections end with a goodbye frame
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
static_assert(sizeof(Hello) == 40);

}  // namespace

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
  bootstrap::HelloAcceptor acceptor;
  acceptor.helloBytes = sizeof(Hello);
  acceptor.admit = [&](const void* bytes, int fd, const SocketAddress&) -> std::string {
    Hello hello;
    std::memcpy(&hello, bytes, sizeof(hello));
    if (hello.magic != kHelloMagic || hello.version != kHelloVersion)
      return "it is not a Squall tcp transport peer (bad magic or version)";
    if (std::memcmp(hello.secret, secret, kSecretBytes) != 0)
      return "it presented the wrong job secret";
    if (hello.to != rank || hello.nranks != size || hello.from < 0 || hello.from >= rank)
      return "it claims a rank, target or world size that does not fit this job";
    if ((*fds)[static_cast<size_t>(hello.from)] >= 0) return "its rank has already connected";
    bootstrap::tuneStream(fd, bufferBytes);
    (*fds)[static_cast<size_t>(hello.from)] = fd;
    --missing;
    return "";
  };
  acceptor.refused = [&](const SocketAddress& remote, const std::string& reason) {
    SQUALL_WARN(Subsys::kTransport, "rank %d refused a tcp connection from %s: %s", rank,
                remote.toString().c_str(), reason.c_str());
  };
  acceptor.complete = [&] { return missing == 0; };
  bootstrap::AcceptStats stats;
  if (!bootstrap::acceptHellos(listener, acceptor, until, &stats)) {
    std::string names;
    for (int peer = 0; peer < rank; ++peer) {
      if ((*fds)[static_cast<size_t>(peer)] >= 0) continue;
      if (!names.empty()) names.append(", ");
      names.append(std::to_string(peer));
    }
    cleanup();
    return SQUALL_FAIL(Status::kTimeout, Subsys::kTransport,
                       "rank(s) %s did not connect to rank %d's tcp transport within %g s (raise "
                       "SQUALL_TIMEOUT_S if they are only slow)%s",
                       names.c_str(), rank, static_cast<double>(timeout.count()) / 1000.0,
                       stats.describe().c_str());
  }
  close(listener);
  return Status::kOk;
}

}  // namespace squall::transport::tcp
