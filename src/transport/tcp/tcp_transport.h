// The TCP transport: a full mesh of TCP connections among the ranks, driven
// by one progress thread per transport. Works anywhere sockets do; the
// baseline backend for slow (Ethernet) networks.
#pragma once

#include <memory>

#include "src/bootstrap/bootstrap.h"
#include "src/transport/transport.h"

namespace squall::transport {

// Collective over `boot`: every rank calls it. Connects to every other rank
// (listening on the interface `boot` reaches the root from) and returns a
// transport named "tcp". Fails with kTimeout naming the ranks it could not
// connect to within boot.timeout().
// `wait.spin` is the waiters' polling window; SQUALL_TCP_SPIN_US, when set,
// takes its place.
Status createTcpTransport(bootstrap::Bootstrap& boot, std::unique_ptr<Transport>* out,
                          const WaitOptions& wait);
// Waiters that sleep at once (no polling).
Status createTcpTransport(bootstrap::Bootstrap& boot, std::unique_ptr<Transport>* out);

}  // namespace squall::transport
