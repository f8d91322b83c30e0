// Dissemination barrier: in round k (0 .. ceil(log2 n) - 1) rank r sends an
// empty message to r + 2^k and waits for one from r - 2^k. After the last
// round every rank has (transitively) heard from every other, so no rank
// leaves before all have entered. Each message carries the operation's
// descriptor, which the receiver's transport compares with its own; a rank
// passes a round only if the previous one agreed, so a rank that finishes
// has a chain of equal descriptors from every other rank: the same rounds
// also serve as an agreement step before collectives that write their output
// as data arrives (agreeOnDescriptor).
//
// Cost per rank: ceil(log2 n) rounds of one zero-byte message each.
#include "src/coll/algorithms.h"

namespace squall::coll {

Status agreeOnDescriptor(const OpContext& ctx, uint32_t firstStep) {
  const int n = ctx.size();
  const int r = ctx.rank();
  uint8_t token = 0, received = 0;
  uint32_t step = firstStep;
  for (int distance = 1; distance < n; distance <<= 1, ++step) {
    SQUALL_TRY(
        ctx.sendRecv((r + distance) % n, &token, 0, (r - distance + n) % n, &received, 0, step));
  }
  return Status::kOk;
}

Status disseminationBarrier(const OpContext& ctx) { return agreeOnDescriptor(ctx, 0); }

}  // namespace squall::coll
