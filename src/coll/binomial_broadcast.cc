// Binomial-tree broadcast. With v = (rank - root) mod n, rank v receives the
// buffer from v minus its lowest set bit, then sends it to v + 2^k for every
// 2^k below that bit (largest first), so the set of ranks holding the data
// doubles every round.
//
// Cost per rank: ceil(log2 n) rounds (alpha each) of N bytes; the root sends
// ceil(log2 n) messages, a leaf receives one. Good for the small and medium
// buffers broadcast is used for (parameters at start-up, flags).
#include <vector>

#include "src/coll/algorithms.h"

namespace squall::coll {

Status binomialBroadcast(const OpContext& ctx, void* buffer, size_t count, DataType dtype,
                         int root) {
  const int n = ctx.size();
  const int v = (ctx.rank() - root + n) % n;
  const size_t bytes = count * dataTypeSize(dtype);
  if (n == 1 || count == 0) return Status::kOk;
  int mask = 1;
  while (mask < n) {
    if ((v & mask) != 0) {
      transport::RequestPtr request;
      SQUALL_TRY(ctx.recv((v - mask + root) % n, 0, buffer, bytes, &request));
      SQUALL_TRY(ctx.waitAll({&request, 1}));
      break;
    }
    mask <<= 1;
  }
  std::vector<transport::RequestPtr> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < n) {
      sends.emplace_back();
      SQUALL_TRY(ctx.send((v + mask + root) % n, 0, buffer, bytes, &sends.back()));
    }
  }
  return ctx.waitAll(sends);
}

}  // namespace squall::coll
