// Direct allreduce for small buffers: one round in which every rank sends its
// whole buffer to every other rank, after which every rank reduces the n
// buffers itself in rank order 0, 1, ..., n-1 (avg: then divides by n).
// Because every rank performs the same operations in the same order on the
// same operands, the results agree bit for bit (recursive doubling would add
// in a different order on different ranks).
//
// Cost per rank: n-1 messages posted at once, so one alpha of latency, and
// (n-1) * N bytes sent and received: latency-optimal, used below
// SQUALL_ALLREDUCE_SMALL_BYTES where alpha dominates.
#include <cstring>
#include <vector>

#include "src/coll/algorithms.h"
#include "src/coll/reduce.h"

namespace squall::coll {

Status directAllReduce(const OpContext& ctx, const void* in, void* out, size_t count,
                       DataType dtype, ReduceOp op) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t bytes = count * dataTypeSize(dtype);
  if (n == 1 || count == 0) {
    if (in != out && bytes != 0) std::memcpy(out, in, bytes);
    return Status::kOk;
  }
  std::vector<uint8_t> all(bytes * static_cast<size_t>(n));
  std::memcpy(all.data() + bytes * static_cast<size_t>(r), in, bytes);
  std::vector<transport::RequestPtr> requests(2 * static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    if (j == r) continue;
    SQUALL_TRY(ctx.recv(j, 0, all.data() + bytes * static_cast<size_t>(j), bytes,
                        &requests[static_cast<size_t>(j)]));
  }
  for (int j = 0; j < n; ++j) {
    if (j == r) continue;
    SQUALL_TRY(ctx.send(j, 0, in, bytes, &requests[static_cast<size_t>(n + j)]));
  }
  SQUALL_TRY(ctx.waitAll(requests));
  std::memcpy(out, all.data(), bytes);
  for (int j = 1; j < n; ++j)
    reduceInto(dtype, op, out, all.data() + bytes * static_cast<size_t>(j), count);
  if (op == ReduceOp::kAvg) finishAverage(dtype, out, count, n);
  return Status::kOk;
}

}  // namespace squall::coll
