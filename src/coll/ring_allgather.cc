// Ring all-gather: rank r copies its block into slot r of the output, then in
// step s (0 .. n-2) sends block (r - s) mod n to rank r + 1 and receives
// block (r - s - 1) mod n from rank r - 1 straight into its slot.
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
  if (bytes != 0) std::memmove(slot(r), in, bytes);
  if (n == 1 || count == 0) return Status::kOk;
  for (int s = 0; s < n - 1; ++s) {
    SQUALL_TRY(ctx.sendRecv((r + 1) % n, slot(r - s), bytes, (r + n - 1) % n, slot(r - s - 1),
                            bytes, static_cast<uint32_t>(s)));
  }
  return Status::kOk;
}

}  // namespace squall::coll
