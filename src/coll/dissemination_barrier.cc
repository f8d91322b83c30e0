// Dissemination barrier: in round k (0 .. ceil(log2 n) - 1) rank r sends an
// empty message to r + 2^k and waits for one from r - 2^k. After the last
// round every rank has (transitively) heard from every other, so no rank
// leaves before all have entered.
//
// Cost per rank: ceil(log2 n) rounds of one zero-byte message each.
#include "src/coll/algorithms.h"

namespace squall::coll {

Status disseminationBarrier(const OpContext& ctx) {
  const int n = ctx.size();
  const int r = ctx.rank();
  uint8_t token = 0, received = 0;
  uint32_t round = 0;
  for (int distance = 1; distance < n; distance <<= 1, ++round) {
    SQUALL_TRY(
        ctx.sendRecv((r + distance) % n, &token, 0, (r - distance + n) % n, &received, 0, round));
  }
  return Status::kOk;
}

}  // namespace squall::coll
