// Small blocking-with-deadline socket helpers shared by the bootstrap and the
// TCP transport: addresses, listeners, connecting with retries, and moving an
// exact number of bytes before a deadline.
//
// Every descriptor created here is close-on-exec and non-blocking; waiting
// happens in poll() so that a deadline is always honoured. Sends use
// MSG_NOSIGNAL so a peer that went away yields EPIPE instead of SIGPIPE,
// without touching the process's signal handlers.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace squall::bootstrap {

using Deadline = std::chrono::steady_clock::time_point;

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;

  bool valid() const { return length != 0; }
  int family() const { return storage.ss_family; }
  uint16_t port() const;
  void setPort(uint16_t port);
  // "127.0.0.1:5000", "[::1]:5000".
  std::string toString() const;

  static SocketAddress loopbackV4(uint16_t port = 0);
};

// A fixed-size, byte-order-defined encoding of an IPv4/IPv6 address and port,
// as carried in the unique id and in handshakes.
struct WireAddress {
  uint16_t family = 0;  // 4 or 6 (not the host's AF_* value)
  uint16_t port = 0;    // host order
  uint32_t scope = 0;   // IPv6 scope id
  uint8_t address[16] = {};
};
static_assert(sizeof(WireAddress) == 24);

WireAddress toWire(const SocketAddress& address);
// False when `wire` names no address family we know.
bool fromWire(const WireAddress& wire, SocketAddress* address);

// Container and VM bridges (docker*, virbr*): up on many hosts with the
// same address on each (docker0 is 172.17.0.1 everywhere), so reaching a
// peer's bridge address reaches one's own. Never chosen by default while
// another interface is up (NCCL excludes them by default too).
bool isLocalBridge(const char* interfaceName);

// Resolves the interface to use: SQUALL_SOCKET_IFNAME when set, else the
// first non-loopback IPv4 interface that is not a local bridge, else a
// bridge, else 127.0.0.1. Port 0.
bool chooseLocalAddress(SocketAddress* address, std::string* error);

// Binds and listens on `address` (port 0: an ephemeral port); `bound`
// receives the actual address. Returns the fd, or -1 with `error` set.
int openListener(const SocketAddress& address, SocketAddress* bound, std::string* error);

// Connects to `address`, retrying refused/unreachable attempts until
// `deadline` since the listener may not exist yet. Returns the fd, or -1
// with `error` set.
int connectWithRetry(const SocketAddress& address, Deadline deadline, std::string* error);

// Accepts one pending connection on a non-blocking listener; -1 when none.
int acceptOne(int listener, SocketAddress* remote);

// Accepting authenticated connections, for the bootstrap root and the TCP
// transport's mesh alike: every client must first send a fixed-size hello.
// The hellos of all pending clients are read together without blocking on
// any one, so a stray or malicious client that connects and stays silent
// cannot hold up the real ones. Without the job secret a client cannot get
// past the hello, so what it can cost is bounded (docs/protocol.md): at most
// maxPending unauthenticated connections are held (a new one pushes out the
// oldest), each must complete its hello within handshakeTimeout, and an
// accept that fails for want of descriptors (EMFILE, ENFILE) pauses accepting
// briefly instead of spinning on a listener that stays readable, and is
// logged once.
struct HelloAcceptor {
  size_t helloBytes = 0;
  // Judges a complete hello: "" adopts the connection (the callee now owns
  // `fd`); anything else is the reason to refuse it, and `fd` is closed.
  std::function<std::string(const void* hello, int fd, const SocketAddress& remote)> admit;
  // Reports a refused client: admit's reason, or that it closed first. Only
  // the first few refusals are reported one by one; AcceptStats counts all.
  std::function<void(const SocketAddress& remote, const std::string& reason)> refused;
  // True once every client the caller waits for has been admitted.
  std::function<bool()> complete;
  // 0: SQUALL_BOOTSTRAP_PENDING_MAX and SQUALL_BOOTSTRAP_HANDSHAKE_MS.
  size_t maxPending = 0;
  std::chrono::milliseconds handshakeTimeout{0};
};

// What acceptHellos turned away, so that a caller whose real peers did not
// arrive can say that a flood may be the cause instead of blaming them.
struct AcceptStats {
  size_t accepted = 0;        // connections accepted, good or bad
  size_t refused = 0;         // hellos admit() refused, or closed before the hello
  size_t droppedOldest = 0;   // pushed out by the pending cap
  size_t timedOut = 0;        // no complete hello within the handshake deadline
  size_t acceptFailures = 0;  // accept() failing for want of descriptors or memory
  int acceptErrno = 0;        // the last such failure's errno
  std::string lastRefused;    // the address of the last client turned away

  size_t turnedAway() const { return refused + droppedOldest + timedOut; }
  // "" when nothing was turned away, else a clause for an error message.
  std::string describe() const;
};

// Accepts on `listener` until acceptor.complete() or `deadline`, and returns
// complete(). Clients still pending at the end are closed; the listener stays
// open. `stats` (may be null) receives what was turned away.
bool acceptHellos(int listener, const HelloAcceptor& acceptor, Deadline deadline,
                  AcceptStats* stats = nullptr);

enum class Io { kOk, kTimeout, kClosed, kError };

// Move exactly `bytes` bytes, waiting in poll() until `deadline`. kClosed:
// the peer closed (EOF, reset or broken pipe); kError: errno in *err.
Io sendAll(int fd, const void* data, size_t bytes, Deadline deadline, int* err);
Io recvAll(int fd, void* data, size_t bytes, Deadline deadline, int* err);

// "timed out", "closed by the peer", or strerror(err).
std::string ioText(Io io, int err);

// Best effort TCP_NODELAY and SO_SNDBUF/SO_RCVBUF.
void tuneStream(int fd, int bufferBytes);

}  // namespace squall::bootstrap
