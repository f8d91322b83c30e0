// Pairwise all-to-all: rank r copies its own block, then in step s (1 .. n-1)
// sends block (r + s) mod n to that rank and receives block (r - s) mod n from
// that rank. Each step is one exchange with one peer, so no rank is flooded
// by n-1 simultaneous senders.
//
// Cost per rank: n-1 messages ((n-1) alpha), (n-1)/n * N bytes sent and
// received for a buffer of N bytes (n blocks).
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
  if (bytes != 0) std::memcpy(dst + at(r), src + at(r), bytes);
  if (count == 0) return Status::kOk;
  for (int s = 1; s < n; ++s) {
    const int to = (r + s) % n;
    const int from = (r - s + n) % n;
    SQUALL_TRY(ctx.sendRecv(to, src + at(to), bytes, from, dst + at(from), bytes,
                            static_cast<uint32_t>(s)));
  }
  return Status::kOk;
}

}  // namespace squall::coll
