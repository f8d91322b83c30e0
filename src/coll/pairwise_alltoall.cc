// Pairwise all-to-all: in step s (1 .. n-1) rank r sends block (r + s) mod n
// to that rank and receives block (r - s) mod n from that rank, then copies
// its own block. Beyond two ranks, ranks that called different counts must
// fail before any output is written: outputs up to kStagedGatherBytes are
// received into scratch and copied out on success, larger ones start with an
// agreement round (agreeOnDescriptor, ceil(log2 n) empty messages). Each step is one exchange with
// one peer, so no rank is flooded by n-1 simultaneous senders.
//
// Cost per rank: n-1 messages ((n-1) alpha), (n-1)/n * N bytes sent and
// received for a buffer of N bytes (n blocks), plus the agreement's
// ceil(log2 n) alpha beyond two ranks and 64 KiB.
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
  // agreement; beyond that small outputs are staged and larger ones agree
  // before the first write.
  const size_t total = bytes * static_cast<size_t>(n);
  const bool staged = n > 2 && total <= kStagedGatherBytes;
  // The agreement's first round and the data's first step are both the
  // first message to rank r + 1, on step 1: ranks that disagree on the count
  // (and so perhaps on staging) meet there and fail at once.
  uint32_t shift = 0;
  if (n > 2 && !staged) {
    SQUALL_TRY(agreeOnDescriptor(ctx, 1));
    for (int distance = 1; distance < n; distance <<= 1) ++shift;
  }
  uint8_t* received = dst;
  if (staged) {
    if (ctx.scratch->size() < total) ctx.scratch->resize(total);
    received = ctx.scratch->data();
  }
  for (int s = 1; s < n; ++s) {
    const int to = (r + s) % n;
    const int from = (r - s + n) % n;
    SQUALL_TRY(ctx.sendRecv(to, src + at(to), bytes, from, received + at(from), bytes,
                            shift + static_cast<uint32_t>(s)));
  }
  if (staged) std::memcpy(dst, received, total);
  std::memcpy(dst + at(r), src + at(r), bytes);
  return Status::kOk;
}

}  // namespace squall::coll
