// Ring all-gather: in step s (0 .. n-2) rank r sends block (r - s) mod n to
// rank r + 1 (its own, from the input, at step 0) and receives block
// (r - s - 1) mod n from rank r - 1 straight into its slot; its own block is
// copied into slot r last. Beyond two ranks, ranks that called different
// counts must fail before any output is written: outputs up to
// kStagedGatherBytes are received into scratch and copied out on success,
// larger ones start with an agreement round (agreeOnDescriptor: ceil(log2 n)
// empty messages).
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
  // before hearing of a disagreement further round the ring: small outputs
  // are staged, larger ones agree first. At two ranks the one exchange is
  // the agreement (a mismatched message is refused unwritten).
  const size_t total = bytes * static_cast<size_t>(n);
  const bool staged = n > 2 && total <= kStagedGatherBytes;
  // The agreement's first round and the data's first step are both the
  // first message to rank r + 1, on step 0: ranks that disagree on the count
  // (and so perhaps on staging) meet at step 0 and fail at once.
  uint32_t first = 0;
  if (n > 2 && !staged) {
    SQUALL_TRY(agreeOnDescriptor(ctx, 0));
    for (int distance = 1; distance < n; distance <<= 1) ++first;
  }
  if (staged) {
    if (ctx.scratch->size() < total) ctx.scratch->resize(total);
    slots = ctx.scratch->data();
  }
  for (int s = 0; s < n - 1; ++s) {
    // Step 0 sends straight from the input, so the own block is copied last.
    const void* block = s == 0 ? in : slot(r - s);
    SQUALL_TRY(ctx.sendRecv((r + 1) % n, block, bytes, (r + n - 1) % n, slot(r - s - 1), bytes,
                            first + static_cast<uint32_t>(s)));
  }
  if (staged) std::memcpy(out, slots, total);
  std::memcpy(static_cast<uint8_t*>(out) + bytes * static_cast<size_t>(r), in, bytes);
  return Status::kOk;
}

}  // namespace squall::coll
