// Rendezvous: turns "here are N ranks and a unique id" into a small, reliable
// out-of-band channel among them, which transports use to exchange their
// addresses and which the communicator uses for setup-time agreement.
//
// The unique id holds the root's address and a 128-bit random job secret.
// Rank 0 listens there; every other rank connects and introduces itself with
// a handshake (magic, protocol version, secret, rank, nranks). A connection
// that fails any check is dropped and logged, and the job carries on waiting
// for the real rank. Ranks that have not arrived within SQUALL_TIMEOUT_S make
// init fail with an error naming them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "src/bootstrap/socket.h"
#include "src/common/status.h"

namespace squall::bootstrap {

constexpr size_t kUniqueIdBytes = 128;

// Byte-compatible with the public squallUniqueId.
struct UniqueId {
  uint8_t bytes[kUniqueIdBytes];
};

// Picks the root address (SQUALL_SOCKET_IFNAME / the host's first
// non-loopback IPv4 address, or 127.0.0.1) and a random secret, and starts
// listening; the listener is handed to the rank-0 Bootstrap of this process.
Status createUniqueId(UniqueId* id);

// From the launcher's variables (torchrun, srun, mpirun; see launch_env.h).
// The secret is derived from SQUALL_JOB_SECRET when set, else from the job id
// of srun and mpirun jobs, else a fixed value (such jobs rely on the network
// being private).
Status uniqueIdFromEnv(UniqueId* id, int* rank, int* nranks);

class Bootstrap {
 public:
  static Status create(const UniqueId& id, int nranks, int rank, std::chrono::milliseconds timeout,
                       std::unique_ptr<Bootstrap>* out);
  virtual ~Bootstrap() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Every rank contributes `bytes` bytes; `all` receives size() * bytes, in
  // rank order. Collective: every rank calls it with the same `bytes`.
  virtual Status allGather(const void* mine, size_t bytes, void* all) = 0;
  virtual Status barrier() = 0;

  // Setup details for transports. The defaults (loopback, 300 s, a zero
  // secret) only serve other implementations such as test doubles.
  //
  // The address of the interface this rank reaches the root from; a
  // transport listens there so its peers reach it over the same network.
  virtual SocketAddress localAddress() const { return SocketAddress::loopbackV4(); }
  // The budget given to create(); transports use it for their own setup.
  virtual std::chrono::milliseconds timeout() const { return std::chrono::seconds(300); }
  // 128 random bits shared by the ranks of this job (from the unique id);
  // transports present it in their own handshakes to reject strays.
  virtual void jobSecret(uint8_t out[16]) const {
    for (int i = 0; i < 16; ++i) out[i] = 0;
  }
};

// SQUALL_TIMEOUT_S as a duration (at least one second).
std::chrono::milliseconds defaultTimeout();

}  // namespace squall::bootstrap
