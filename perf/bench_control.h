// The control channel of the plugin benchmarks (nccl_net_bench,
// nccl_collnet_bench): whole-buffer send and receive on a TCP socket, and a
// fatal error that names the benchmark and errno.
#pragma once

#include <errno.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace squall::bench {

[[noreturn]] inline void die(const char* what) {
  std::fprintf(stderr, "%s: %s (%s)\n", program_invocation_short_name, what, std::strerror(errno));
  std::exit(1);
}

inline void sendAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
    if (k <= 0) die("control send");
    c += k;
    n -= static_cast<size_t>(k);
  }
}

inline void recvAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t k = recv(fd, c, n, 0);
    if (k <= 0) die("control recv");
    c += k;
    n -= static_cast<size_t>(k);
  }
}

}  // namespace squall::bench
