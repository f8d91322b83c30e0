// Socket plumbing for the bootstrap and the TCP transport (see socket.h).
#include "src/bootstrap/socket.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "src/common/log.h"
#include "src/common/params.h"

namespace squall::bootstrap {

uint16_t SocketAddress::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

void SocketAddress::setPort(uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
}

std::string SocketAddress::toString() const {
  char host[INET6_ADDRSTRLEN] = "?";
  char text[INET6_ADDRSTRLEN + 16];
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, host,
              sizeof(host));
    std::snprintf(text, sizeof(text), "%s:%u", host, port());
  } else if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, host,
              sizeof(host));
    std::snprintf(text, sizeof(text), "[%s]:%u", host, port());
  } else {
    return "(no address)";
  }
  return text;
}

SocketAddress SocketAddress::loopbackV4(uint16_t port) {
  SocketAddress a;
  auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
  in->sin_family = AF_INET;
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  in->sin_port = htons(port);
  a.length = sizeof(sockaddr_in);
  return a;
}

WireAddress toWire(const SocketAddress& address) {
  WireAddress w;
  if (address.family() == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&address.storage);
    w.family = 4;
    std::memcpy(w.address, &in->sin_addr, 4);
  } else if (address.family() == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&address.storage);
    w.family = 6;
    w.scope = in6->sin6_scope_id;
    std::memcpy(w.address, &in6->sin6_addr, 16);
  }
  w.port = address.port();
  return w;
}

bool fromWire(const WireAddress& wire, SocketAddress* address) {
  *address = SocketAddress();
  if (wire.family == 4) {
    auto* in = reinterpret_cast<sockaddr_in*>(&address->storage);
    in->sin_family = AF_INET;
    std::memcpy(&in->sin_addr, wire.address, 4);
    address->length = sizeof(sockaddr_in);
  } else if (wire.family == 6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&address->storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_scope_id = wire.scope;
    std::memcpy(&in6->sin6_addr, wire.address, 16);
    address->length = sizeof(sockaddr_in6);
  } else {
    return false;
  }
  address->setPort(wire.port);
  return true;
}

bool isLocalBridge(const char* interfaceName) {
  return std::strncmp(interfaceName, "docker", 6) == 0 ||
         std::strncmp(interfaceName, "virbr", 5) == 0;
}

bool chooseLocalAddress(SocketAddress* address, std::string* error) {
  std::string wanted = paramString(Param::kSocketIfname);
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    if (!wanted.empty()) {
      *error = std::string("cannot list network interfaces: ") + std::strerror(errno);
      return false;
    }
    *address = SocketAddress::loopbackV4();
    return true;
  }
  const ifaddrs* v4 = nullptr;
  const ifaddrs* v6 = nullptr;
  const ifaddrs* bridge = nullptr;  // default choice only: a bridge, last resort
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0) continue;
    int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (wanted.empty()) {
      if ((i->ifa_flags & IFF_LOOPBACK) != 0 || family != AF_INET) continue;
      if (isLocalBridge(i->ifa_name)) {
        if (bridge == nullptr) bridge = i;
        continue;
      }
    } else if (wanted != i->ifa_name) {
      continue;
    }
    if (family == AF_INET && v4 == nullptr) v4 = i;
    if (family == AF_INET6 && v6 == nullptr) v6 = i;
  }
  const ifaddrs* pick = v4 != nullptr ? v4 : v6 != nullptr ? v6 : bridge;
  if (pick != nullptr) {
    *address = SocketAddress();
    address->length =
        pick->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    std::memcpy(&address->storage, pick->ifa_addr, address->length);
    address->setPort(0);
  }
  freeifaddrs(list);
  if (pick != nullptr) return true;
  if (!wanted.empty()) {
    *error = "SQUALL_SOCKET_IFNAME=" + wanted +
             " names no interface that is up with an IPv4 or IPv6 address; set it to one "
             "listed by `ip addr`";
    return false;
  }
  *address = SocketAddress::loopbackV4();
  return true;
}

int openListener(const SocketAddress& address, SocketAddress* bound, std::string* error) {
  int fd = socket(address.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    *error = std::string("socket(): ") + std::strerror(errno);
    return -1;
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&address.storage), address.length) != 0 ||
      listen(fd, SOMAXCONN) != 0) {
    int err = errno;
    *error = "cannot listen on " + address.toString() + ": " + std::strerror(err);
    close(fd);
    errno = err;
    return -1;
  }
  *bound = SocketAddress();
  bound->length = sizeof(bound->storage);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound->storage), &bound->length);
  return fd;
}

namespace {

// Waits for `events` on `fd`; false when the deadline passed first.
bool waitFd(int fd, short events, Deadline deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    int timeout = static_cast<int>(std::min<long long>(left.count() + 1, 1000));
    int n = poll(&p, 1, timeout);
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // let the following call report it
  }
}

bool isClosedErrno(int err) { return err == ECONNRESET || err == EPIPE || err == ENOTCONN; }

}  // namespace

int connectWithRetry(const SocketAddress& address, Deadline deadline, std::string* error) {
  std::chrono::milliseconds pause(10);
  for (;;) {
    int fd = socket(address.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      *error = std::string("socket(): ") + std::strerror(errno);
      return -1;
    }
    int err = 0;
    if (connect(fd, reinterpret_cast<const sockaddr*>(&address.storage), address.length) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        if (!waitFd(fd, POLLOUT, deadline)) {
          close(fd);
          *error = "connecting to " + address.toString() + " timed out";
          return -1;
        }
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
    if (err == 0) return fd;
    close(fd);
    bool retry = err == ECONNREFUSED || err == ETIMEDOUT || err == ENETUNREACH ||
                 err == EHOSTUNREACH || err == ECONNRESET || err == EAGAIN;
    if (!retry || std::chrono::steady_clock::now() + pause >= deadline) {
      *error = "cannot connect to " + address.toString() + ": " + std::strerror(err);
      return -1;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

int acceptOne(int listener, SocketAddress* remote) {
  *remote = SocketAddress();
  remote->length = sizeof(remote->storage);
  int fd = accept4(listener, reinterpret_cast<sockaddr*>(&remote->storage), &remote->length,
                   SOCK_CLOEXEC | SOCK_NONBLOCK);
  return fd;
}

std::string AcceptStats::describe() const {
  if (turnedAway() == 0 && acceptFailures == 0) return "";
  std::string out = "; meanwhile";
  char text[512];
  if (turnedAway() > 0) {
    std::snprintf(text, sizeof(text),
                  " %zu connection(s) without a valid handshake were turned away (%zu refused, "
                  "%zu past the pending cap, %zu past the handshake deadline; the last from %s)",
                  turnedAway(), refused, droppedOldest, timedOut,
                  lastRefused.empty() ? "?" : lastRefused.c_str());
    out += text;
  }
  if (acceptFailures > 0) {
    std::snprintf(text, sizeof(text), "%s accept failed %zu time(s) (%s)",
                  turnedAway() > 0 ? " and" : "", acceptFailures, std::strerror(acceptErrno));
    out += text;
  }
  // Out of descriptors is this process's limit; turned-away connections are
  // someone else's.
  if (acceptFailures > 0)
    out +=
        ": this process ran out of file descriptors; raise the limit (ulimit -n) above the "
        "number of ranks plus the connections the job keeps open";
  if (turnedAway() > 0)
    out += acceptFailures > 0
               ? ", and a flood of connections from outside the job may have kept the real ones "
                 "out"
               : ": a flood of connections from outside the job may have kept the real ones out";
  return out;
}

namespace {
// Refusals reported one by one before the rest are only counted.
constexpr size_t kRefusalsReported = 8;
// How long accepting pauses after accept() ran out of descriptors: briefly
// when closing pending connections freed some, longer when none could be.
constexpr auto kAcceptRetry = std::chrono::milliseconds(10);
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);

bool outOfDescriptors(int err) {
  return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}
}  // namespace

bool acceptHellos(int listener, const HelloAcceptor& acceptor, Deadline deadline,
                  AcceptStats* statsOut) {
  using SteadyClock = std::chrono::steady_clock;
  struct Pending {
    int fd;
    SocketAddress remote;
    std::string hello;
    size_t got = 0;
    SteadyClock::time_point expires;
  };
  size_t cap =  // lowered when descriptors run out
      acceptor.maxPending > 0
          ? acceptor.maxPending
          : static_cast<size_t>(std::max<int64_t>(1, paramInt(Param::kBootstrapPendingMax)));
  const std::chrono::milliseconds handshake =
      acceptor.handshakeTimeout.count() > 0
          ? acceptor.handshakeTimeout
          : std::chrono::milliseconds(std::max<int64_t>(1, paramInt(Param::kBootstrapHandshakeMs)));
  AcceptStats stats;
  bool warnedDrop = false;
  bool warnedAccept = false;
  auto turnAway = [&](const Pending& p, const std::string& reason) {
    stats.lastRefused = p.remote.toString();
    if (stats.turnedAway() <= kRefusalsReported) {
      acceptor.refused(p.remote, reason);
    } else if (stats.turnedAway() == kRefusalsReported + 1) {
      acceptor.refused(p.remote, reason + " (further refusals are only counted)");
    }
    close(p.fd);
  };
  std::vector<Pending> pending;  // oldest first
  // Reads what pending[i] sent; true when it is finished with (admitted or
  // refused) and must leave the list.
  auto readHello = [&](Pending& p) {
    ssize_t got = recv(p.fd, p.hello.data() + p.got, acceptor.helloBytes - p.got, MSG_DONTWAIT);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
    std::string reason;
    if (got <= 0) {
      reason = "it closed the connection before completing the handshake";
    } else {
      p.got += static_cast<size_t>(got);
      if (p.got < acceptor.helloBytes) return false;
      reason = acceptor.admit(p.hello.data(), p.fd, p.remote);
    }
    if (!reason.empty()) {
      ++stats.refused;
      turnAway(p, reason);
    }
    return true;
  };
  auto dropOldest = [&](const char* why) {
    Pending& p = pending.front();
    ++stats.droppedOldest;
    if (!warnedDrop)
      SQUALL_WARN(Subsys::kBootstrap,
                  "more than %zu connections are waiting to complete their handshake; the "
                  "oldest are closed (%s; logged once)",
                  cap, why);
    warnedDrop = true;
    turnAway(p, "it was the oldest of too many connections without a completed handshake");
    pending.erase(pending.begin());
  };
  SteadyClock::time_point acceptPausedUntil{};
  while (!acceptor.complete() && SteadyClock::now() < deadline) {
    const auto now = SteadyClock::now();
    // Handshake deadlines: the list is in accept order, so expired ones lead.
    while (!pending.empty() && pending.front().expires <= now) {
      ++stats.timedOut;
      turnAway(pending.front(), "it did not complete its handshake in time");
      pending.erase(pending.begin());
    }
    const bool accepting = now >= acceptPausedUntil;
    std::vector<pollfd> fds;
    fds.push_back({accepting ? listener : -1, POLLIN, 0});
    for (const Pending& p : pending) fds.push_back({p.fd, POLLIN, 0});
    auto wake = std::min(deadline, now + std::chrono::seconds(1));
    if (!pending.empty()) wake = std::min(wake, pending.front().expires);
    if (!accepting) wake = std::min(wake, acceptPausedUntil);
    auto left = std::chrono::ceil<std::chrono::milliseconds>(wake - now);
    int n = poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(left.count(), 0)));
    if (n <= 0) continue;
    // Read what the pending clients sent; backwards, so erasing is safe.
    for (size_t i = pending.size(); i-- > 0;) {
      if (fds[i + 1].revents == 0) continue;
      if (readHello(pending[i])) pending.erase(pending.begin() + static_cast<long>(i));
    }
    if (!accepting || (fds[0].revents & POLLIN) == 0) continue;
    // A bounded batch, so the hellos of those already accepted are read
    // before a flood can push them out of the pending list.
    for (size_t batch = 0; batch < std::max<size_t>(1, cap / 2); ++batch) {
      Pending p{};
      p.fd = acceptOne(listener, &p.remote);
      if (p.fd < 0) {
        const int err = errno;
        if (!outOfDescriptors(err)) break;  // EAGAIN: none left; others are transient
        ++stats.acceptFailures;
        stats.acceptErrno = err;
        if (!warnedAccept)
          SQUALL_WARN(Subsys::kBootstrap,
                      "accepting a connection failed: %s; closing the older half of the "
                      "connections without a completed handshake, holding fewer from now on, "
                      "and pausing accepts briefly (raise the descriptor limit, ulimit -n, if "
                      "this persists; logged once)",
                      std::strerror(err));
        warnedAccept = true;
        // Descriptors are the scarce thing now: hold fewer unauthenticated
        // connections, so that accepting rotates through the flood by the
        // cap instead of failing again.
        const bool freed = !pending.empty();
        cap = std::max<size_t>(4, pending.size() / 2);
        while (pending.size() > cap) dropOldest("out of file descriptors");
        acceptPausedUntil = SteadyClock::now() + (freed ? kAcceptRetry : kAcceptBackoff);
        break;
      }
      ++stats.accepted;
      p.hello.assign(acceptor.helloBytes, '\0');
      p.expires = SteadyClock::now() + handshake;
      // A real client sends its hello right after connecting: it is often
      // here already.
      if (readHello(p)) continue;
      if (pending.size() >= cap) dropOldest("pending cap");
      pending.push_back(std::move(p));
    }
  }
  for (const Pending& p : pending) close(p.fd);
  if (stats.turnedAway() > kRefusalsReported + 1)
    SQUALL_WARN(Subsys::kBootstrap,
                "%zu connections in all were turned away without a valid handshake (%zu "
                "refused, %zu past the pending cap, %zu past the handshake deadline)",
                stats.turnedAway(), stats.refused, stats.droppedOldest, stats.timedOut);
  if (statsOut != nullptr) *statsOut = stats;
  return acceptor.complete();
}

Io sendAll(int fd, const void* data, size_t bytes, Deadline deadline, int* err) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = send(fd, p, bytes, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!waitFd(fd, POLLOUT, deadline)) return Io::kTimeout;
      continue;
    }
    *err = errno;
    return isClosedErrno(*err) ? Io::kClosed : Io::kError;
  }
  return Io::kOk;
}

Io recvAll(int fd, void* data, size_t bytes, Deadline deadline, int* err) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = recv(fd, p, bytes, 0);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return Io::kClosed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!waitFd(fd, POLLIN, deadline)) return Io::kTimeout;
      continue;
    }
    *err = errno;
    return isClosedErrno(*err) ? Io::kClosed : Io::kError;
  }
  return Io::kOk;
}

std::string ioText(Io io, int err) {
  switch (io) {
    case Io::kOk: return "ok";
    case Io::kTimeout: return "timed out";
    case Io::kClosed: return "the connection was closed by the peer";
    case Io::kError: return std::strerror(err);
  }
  return "?";
}

void tuneStream(int fd, int bufferBytes) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (bufferBytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufferBytes, sizeof(bufferBytes));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufferBytes, sizeof(bufferBytes));
  }
}

}  // namespace squall::bootstrap
