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
#include <cstring>
#include <thread>
#include <vector>

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
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0) continue;
    int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (wanted.empty()) {
      if ((i->ifa_flags & IFF_LOOPBACK) != 0 || family != AF_INET) continue;
    } else if (wanted != i->ifa_name) {
      continue;
    }
    if (family == AF_INET && v4 == nullptr) v4 = i;
    if (family == AF_INET6 && v6 == nullptr) v6 = i;
  }
  const ifaddrs* pick = v4 != nullptr ? v4 : v6;
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

bool acceptHellos(int listener, const HelloAcceptor& acceptor, Deadline deadline) {
  struct Pending {
    int fd;
    SocketAddress remote;
    std::string hello;
    size_t got = 0;
  };
  std::vector<Pending> pending;
  while (!acceptor.complete() && std::chrono::steady_clock::now() < deadline) {
    std::vector<pollfd> fds;
    fds.push_back({listener, POLLIN, 0});
    for (const Pending& p : pending) fds.push_back({p.fd, POLLIN, 0});
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    int n = poll(fds.data(), fds.size(),
                 static_cast<int>(std::clamp<long long>(left.count() + 1, 0, 1000)));
    if (n <= 0) continue;
    // Read what the pending clients sent; backwards, so erasing is safe.
    for (size_t i = pending.size(); i-- > 0;) {
      if (fds[i + 1].revents == 0) continue;
      Pending& p = pending[i];
      ssize_t got = recv(p.fd, p.hello.data() + p.got, acceptor.helloBytes - p.got, MSG_DONTWAIT);
      if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      std::string reason;
      if (got <= 0) {
        reason = "it closed the connection before completing the handshake";
      } else {
        p.got += static_cast<size_t>(got);
        if (p.got < acceptor.helloBytes) continue;
        reason = acceptor.admit(p.hello.data(), p.fd, p.remote);
      }
      if (!reason.empty()) {
        acceptor.refused(p.remote, reason);
        close(p.fd);
      }
      pending.erase(pending.begin() + static_cast<long>(i));
    }
    if ((fds[0].revents & POLLIN) != 0) {
      for (;;) {
        Pending p{};
        p.fd = acceptOne(listener, &p.remote);
        if (p.fd < 0) break;
        p.hello.assign(acceptor.helloBytes, '\0');
        pending.push_back(std::move(p));
      }
    }
  }
  for (const Pending& p : pending) close(p.fd);
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
