// Pairwise all-to-all: in step s (1 .. n-1) rank r sends block (r + s) mod n
// to that rank and receives block (r - s) mod n from that rank, then copies
// its own block. Beyond two ranks an agreement round (agreeOnDescriptor, ceil
// (log2 n) empty messages) comes first, so ranks that called different counts
// fail before any output is written. Each step is one exchange with one
// peer, so no rank is flooded by n-1 simultaneous senders.
//
// Cost per rank: n-1 messages ((n-1) alpha), (n-1)/n * N bytes sent and
// received for a buffer of N bytes (n blocks), plus the agreement's
// ceil(log2 n) alpha beyond two ranks.
#include <cstring>

#include "src/coll/algorithms.h"

namespace squall::coll {

Status pairwiseAllToAll(const OpContext& ctx, const void* in, void* out, size_t count,
                        DataType dtype) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t bytes = count * dataTypeSize(dtype);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  auto at = [&](int j) { return bytes * static_cast<size_t>(j); };
  if (count == 0) return Status::kOk;
  // As in the ring all-gather: at two ranks the one exchange is the
  // agreement, beyond that an agreement round comes before the first write.
  if (n > 2) SQUALL_TRY(agreeOnDescriptor(ctx, static_cast<uint32_t>(n)));
  for (int s = 1; s < n; ++s) {
    const int to = (r + s) % n;
    const int from = (r - s + n) % n;
    SQUALL_TRY(ctx.sendRecv(to, src + at(to), bytes, from, dst + at(from), bytes,
                            static_cast<uint32_t>(s)));
  }
  std::memcpy(dst + at(r), src + at(r), bytes);
  return Status::kOk;
}

}  // namespace squall::coll
