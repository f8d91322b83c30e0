// Ring all-gather: in step s (0 .. n-2) rank r sends block (r - s) mod n to
// rank r + 1 (its own, from the input, at step 0) and receives block
// (r - s - 1) mod n from rank r - 1 straight into its slot; its own block is
// copied into slot r last. Beyond two ranks, an agreement round
// (agreeOnDescriptor) comes first, so ranks that called different counts
// fail before any output is written: ceil(log2 n) empty messages.
//
// Cost per rank: n-1 messages ((n-1) alpha), (n-1) * N bytes sent and
// received for N bytes per rank: bandwidth-optimal.
#include <cstring>

#include "src/coll/algorithms.h"

namespace squall::coll {

Status ringAllGather(const OpContext& ctx, const void* in, void* out, size_t count,
                     DataType dtype) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t bytes = count * dataTypeSize(dtype);
  auto* slots = static_cast<uint8_t*>(out);
  auto slot = [&](int j) { return slots + bytes * static_cast<size_t>(((j % n) + n) % n); };
  if (n == 1 || count == 0) {
    if (bytes != 0) std::memmove(slot(r), in, bytes);
    return Status::kOk;
  }
  // Beyond two ranks, a rank would write blocks from its left neighbour
  // before hearing of a disagreement further round the ring; at two the one
  // exchange is the agreement (a mismatched message is refused unwritten).
  if (n > 2) SQUALL_TRY(agreeOnDescriptor(ctx, static_cast<uint32_t>(n - 1)));
  for (int s = 0; s < n - 1; ++s) {
    // Step 0 sends straight from the input, so the own block is copied last.
    const void* block = s == 0 ? in : slot(r - s);
    SQUALL_TRY(ctx.sendRecv((r + 1) % n, block, bytes, (r + n - 1) % n, slot(r - s - 1), bytes,
                            static_cast<uint32_t>(s)));
  }
  std::memcpy(slot(r), in, bytes);
  return Status::kOk;
}

}  // namespace squall::coll
