// The TCP transport's setup: a full mesh of authenticated, connected sockets.
//
// Every rank listens on an ephemeral port of the interface it reaches the
// bootstrap root from; the addresses are exchanged with allGather. Rank i
// connects to every rank j > i and introduces itself with a 40-byte Hello
// (magic "SQTH", version, job secret, from, to, world size); rank j accepts
// until every lower rank is present (bootstrap::acceptHellos: strays are
// refused and logged without delaying the real peers).
#pragma once

#include <vector>

#include "src/bootstrap/bootstrap.h"
#include "src/common/status.h"

namespace squall::transport::tcp {

// Collective over `boot`. On success (*fds)[p] is a connected, tuned,
// non-blocking socket to rank p, and -1 for this rank. Fails with kTimeout
// naming the ranks that did not connect within boot.timeout().
Status connectMesh(bootstrap::Bootstrap& boot, std::vector<int>* fds);

}  // namespace squall::transport::tcp
