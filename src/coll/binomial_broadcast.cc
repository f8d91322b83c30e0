// Binomial-tree broadcast. With v = (rank - root) mod n, rank v receives the
// buffer from v minus its lowest set bit, then sends it to v + 2^k for every
// 2^k below that bit (largest first), so the set of ranks holding the data
// doubles every round.
//
// Cost per rank: ceil(log2 n) rounds (alpha each) of N bytes; the root sends
// ceil(log2 n) messages, a leaf receives one. Good for the small and medium
// buffers broadcast is used for (parameters at start-up, flags).
//
// Root agreement: the root is part of the operation's descriptor, so a rank
// that receives from a parent with another root fails with both printed.
// That alone misses ranks that all believe themselves roots (they only send)
// or all wait for each other; so every rank also sends one empty message to
// its ring successor (step 1), in parallel with the tree, and waits for its
// predecessor's together with its own receive. A disagreement between any
// two neighbours fails the receiving one at once, and since the ring links
// every rank, ranks that disagree can never all succeed. The extra message
// is empty and overlaps the tree: one alpha at most, no bandwidth.
#include <array>
#include <vector>

#include "src/coll/algorithms.h"

namespace squall::coll {

Status binomialBroadcast(const OpContext& ctx, void* buffer, size_t count, DataType dtype,
                         int root) {
  const int n = ctx.size();
  const int v = (ctx.rank() - root + n) % n;
  const size_t bytes = count * dataTypeSize(dtype);
  if (n == 1 || count == 0) return Status::kOk;
  constexpr uint32_t kAgreementStep = 1;
  const int r = ctx.rank();
  // [0] the predecessor's agreement message, [1] the parent's data.
  std::array<transport::RequestPtr, 2> received;
  std::vector<transport::RequestPtr> sends(1);
  char empty = 0;
  SQUALL_TRY(ctx.recv((r - 1 + n) % n, kAgreementStep, &empty, 0, &received[0]));
  SQUALL_TRY(ctx.send((r + 1) % n, kAgreementStep, &empty, 0, &sends[0]));
  int mask = 1;
  while (mask < n) {
    if ((v & mask) != 0) {
      SQUALL_TRY(ctx.recv((v - mask + root) % n, 0, buffer, bytes, &received[1]));
      break;
    }
    mask <<= 1;
  }
  SQUALL_TRY(ctx.waitAll(received));
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < n) {
      sends.emplace_back();
      SQUALL_TRY(ctx.send((v + mask + root) % n, 0, buffer, bytes, &sends.back()));
    }
  }
  return ctx.waitAll(sends);
}

}  // namespace squall::coll
