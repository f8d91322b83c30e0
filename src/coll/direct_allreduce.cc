// Direct allreduce for small buffers: one round in which every rank sends its
// whole buffer to every other rank, after which every rank reduces the n
// buffers itself in rank order 0, 1, ..., n-1 (avg: then divides by n).
// Because every rank performs the same operations in the same order on the
// same operands, the results agree bit for bit (recursive doubling would add
// in a different order on different ranks).
//
// The peers' buffers land in the communicator's scratch, reused across
// calls; out of place the input is read where it is, and the first
// reduction writes out = buf0 (op) buf1 directly (no copy into the result).
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
  std::vector<uint8_t>& all = *ctx.scratch;
  if (all.size() < bytes * static_cast<size_t>(n)) all.resize(bytes * static_cast<size_t>(n));
  auto slot = [&](int j) { return all.data() + bytes * static_cast<size_t>(j); };
  std::vector<transport::RequestPtr> requests(2 * static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    if (j == r) continue;
    SQUALL_TRY(ctx.recv(j, 0, slot(j), bytes, &requests[static_cast<size_t>(j)]));
  }
  for (int j = 0; j < n; ++j) {
    if (j == r) continue;
    SQUALL_TRY(ctx.send(j, 0, in, bytes, &requests[static_cast<size_t>(n + j)]));
  }
  // In place, out is overwritten by the first reduction while rank r's own
  // operand may still be needed later in the order: keep a copy of it then.
  if (in == out) std::memcpy(slot(r), in, bytes);
  const void* own = in == out ? slot(r) : in;
  auto operand = [&](int j) -> const void* { return j == r ? own : slot(j); };
  SQUALL_TRY(ctx.waitAll(requests));
  combine(dtype, op, out, operand(0), operand(1), count);
  for (int j = 2; j < n; ++j) reduceInto(dtype, op, out, operand(j), count);
  if (op == ReduceOp::kAvg) finishAverage(dtype, out, count, n);
  return Status::kOk;
}

}  // namespace squall::coll
