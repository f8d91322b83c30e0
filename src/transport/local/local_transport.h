// The local backend: the ranks of a group are threads of one process.
//
// Every rank owns a mailbox guarded by one mutex. A send to rank d locks d's
// mailbox and either completes a matching posted receive (copying the bytes
// straight into the receiver's buffer) or, when none is posted yet, buffers a
// copy as an unexpected message; either way the send completes at once
// (eager), so posting never blocks on the peer. A receive first looks for a
// buffered unexpected message and otherwise posts itself. Matching is by
// (source, sequence, step); a match whose descriptor or size differs fails the
// receive with an error that prints both tags. Each mailbox carries a
// generation counter and a condition variable, so waitForActivity sleeps
// instead of spinning while ranks share a core.
#pragma once

#include <memory>
#include <vector>

#include "src/transport/transport.h"

namespace squall::transport {

// Creates `n` connected transports; (*out)[r] is rank r. They may be used
// from n different threads, and each from one thread at a time.
Status createLocalTransports(int n, std::vector<std::unique_ptr<Transport>>* out);

}  // namespace squall::transport
