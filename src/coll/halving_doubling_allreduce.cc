// Recursive halving-doubling allreduce (Rabenseifner's): a reduce-scatter by
// recursive halving, then an all-gather by recursive doubling, for mid-sized
// buffers, where the ring's 2(n-1) rounds cost more than its pipelining
// saves and the direct algorithm's (n-1) * N bytes cost more than one round.
//
// With p the largest power of two <= n, the n - p extra ranks first fold
// their buffer into a partner (rank r + p sends to rank r), sit out, and get
// the result back at the end. Among the p ranks, at level mask = p/2, ...,
// 1, a rank and its partner r ^ mask hold the same element range; each
// keeps one half (the lower if its mask bit is clear), sends the other, and
// reduces the partner's copy of the half it keeps into its own. After log2 p
// levels each rank holds one fully reduced 1/p of the buffer (divided by n
// there for avg), and the levels are walked back up, each rank sending what
// it has and receiving the partner's sibling range in place.
//
// Every element is reduced by exactly one rank at each level, always own
// operand first, and then only copied, so the results agree bit for bit on
// every rank, whatever the operation.
//
// Cost per rank: 2 log2(p) rounds (plus 2 for a folded rank's partner),
// 2(p-1)/p * N bytes sent and received (plus N each way per fold).
#include <algorithm>
#include <cstring>
#include <vector>

#include "src/coll/algorithms.h"
#include "src/coll/reduce.h"

namespace squall::coll {

Status halvingDoublingAllReduce(const OpContext& ctx, const void* in, void* out, size_t count,
                                DataType dtype, ReduceOp op) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t esize = dataTypeSize(dtype);
  auto* buffer = static_cast<uint8_t*>(out);
  if (in != out && count != 0) std::memcpy(out, in, count * esize);
  if (n == 1 || count == 0) return Status::kOk;

  int p = 1;
  while (p * 2 <= n) p *= 2;
  int levels = 0;
  while ((1 << levels) < p) ++levels;
  const auto lastStep = static_cast<uint32_t>(2 * levels + 1);

  std::vector<uint8_t>& scratch = *ctx.scratch;
  const size_t half = (count + 1) / 2;  // the most any level receives
  const size_t needed = (r < n - p ? count : half) * esize;
  if (scratch.size() < needed) scratch.resize(needed);

  if (r >= p) {  // folded: hand the buffer over, wait for the result
    transport::RequestPtr requests[2];
    SQUALL_TRY(ctx.recv(r - p, lastStep, buffer, count * esize, &requests[0]));
    SQUALL_TRY(ctx.send(r - p, 0, buffer, count * esize, &requests[1]));
    return ctx.waitAll(requests);
  }
  if (r < n - p) {
    transport::RequestPtr request;
    SQUALL_TRY(ctx.recv(r + p, 0, scratch.data(), count * esize, &request));
    SQUALL_TRY(ctx.waitAll({&request, 1}));
    reduceInto(dtype, op, buffer, scratch.data(), count);
  }

  // Reduce-scatter by halving; ranges[l] is this rank's range before level l.
  struct Range {
    size_t first, size;
  };
  std::vector<Range> ranges;
  ranges.reserve(static_cast<size_t>(levels) + 1);
  Range mine{0, count};
  for (int l = 0; l < levels; ++l) {
    ranges.push_back(mine);
    const int mask = p >> (l + 1);
    const int partner = r ^ mask;
    const size_t lower = mine.size / 2 + mine.size % 2;
    const Range low{mine.first, lower}, high{mine.first + lower, mine.size - lower};
    const bool keepLow = (r & mask) == 0;
    const Range keep = keepLow ? low : high, give = keepLow ? high : low;
    const auto step = static_cast<uint32_t>(1 + l);
    transport::RequestPtr requests[2];
    if (keep.size != 0)
      SQUALL_TRY(ctx.recv(partner, step, scratch.data(), keep.size * esize, &requests[0]));
    if (give.size != 0)
      SQUALL_TRY(
          ctx.send(partner, step, buffer + give.first * esize, give.size * esize, &requests[1]));
    SQUALL_TRY(ctx.waitAll(requests));
    reduceInto(dtype, op, buffer + keep.first * esize, scratch.data(), keep.size);
    mine = keep;
  }
  if (op == ReduceOp::kAvg) finishAverage(dtype, buffer + mine.first * esize, mine.size, n);

  // All-gather by doubling: at level l (walked back) the partner holds the
  // other half of ranges[l].
  for (int l = levels - 1; l >= 0; --l) {
    const int partner = r ^ (p >> (l + 1));
    const Range whole = ranges[static_cast<size_t>(l)];
    const Range theirs = mine.first == whole.first
                             ? Range{whole.first + mine.size, whole.size - mine.size}
                             : Range{whole.first, whole.size - mine.size};
    const auto step = static_cast<uint32_t>(1 + levels + (levels - 1 - l));
    transport::RequestPtr requests[2];
    if (theirs.size != 0)
      SQUALL_TRY(ctx.recv(partner, step, buffer + theirs.first * esize, theirs.size * esize,
                          &requests[0]));
    if (mine.size != 0)
      SQUALL_TRY(
          ctx.send(partner, step, buffer + mine.first * esize, mine.size * esize, &requests[1]));
    SQUALL_TRY(ctx.waitAll(requests));
    mine = whole;
  }

  if (r < n - p) {
    transport::RequestPtr request;
    SQUALL_TRY(ctx.send(r + p, lastStep, buffer, count * esize, &request));
    SQUALL_TRY(ctx.waitAll({&request, 1}));
  }
  return Status::kOk;
}

}  // namespace squall::coll
