// Ring allreduce: a reduce-scatter followed by an all-gather around the ring
// r -> r + 1.
//
// The buffer is cut into n chunks. In reduce-scatter step s (0 .. n-2) rank r
// sends its partial chunk (r - s) mod n to the right and adds the partial
// chunk (r - s - 1) mod n received from the left into its own; after n - 1
// steps rank r holds the full reduction of chunk (r + 1) mod n (divided by n
// there for avg). All-gather step s then forwards chunk (r + 1 - s) mod n.
// Each chunk is reduced by exactly one sequence of additions and then copied,
// so every rank ends with bit-identical results.
//
// Cost per rank: 2(n-1) messages, 2(n-1)/n * N bytes sent and received:
// bandwidth-optimal, latency 2(n-1) alpha.
#include <algorithm>
#include <cstring>
#include <vector>

#include "src/coll/algorithms.h"
#include "src/coll/reduce.h"

namespace squall::coll {

Status ringAllReduce(const OpContext& ctx, const void* in, void* out, size_t count, DataType dtype,
                     ReduceOp op) {
  const int n = ctx.size();
  const int r = ctx.rank();
  const size_t esize = dataTypeSize(dtype);
  auto* buffer = static_cast<uint8_t*>(out);
  if (in != out && count != 0) std::memcpy(out, in, count * esize);
  if (n == 1 || count == 0) return Status::kOk;

  const size_t base = count / static_cast<size_t>(n);
  const size_t extra = count % static_cast<size_t>(n);
  auto start = [&](int c) {
    const auto u = static_cast<size_t>(c);
    return u * base + std::min(u, extra);
  };
  auto length = [&](int c) { return base + (static_cast<size_t>(c) < extra ? 1 : 0); };
  auto wrap = [&](int c) { return ((c % n) + n) % n; };
  const int right = wrap(r + 1);
  const int left = wrap(r - 1);
  std::vector<uint8_t> incoming((base + 1) * esize);

  for (int s = 0; s < n - 1; ++s) {
    const int sendChunk = wrap(r - s);
    const int recvChunk = wrap(r - s - 1);
    SQUALL_TRY(ctx.sendRecv(right, buffer + start(sendChunk) * esize, length(sendChunk) * esize,
                            left, incoming.data(), length(recvChunk) * esize,
                            static_cast<uint32_t>(s)));
    reduceInto(dtype, op, buffer + start(recvChunk) * esize, incoming.data(), length(recvChunk));
  }
  const int owned = wrap(r + 1);
  if (op == ReduceOp::kAvg) finishAverage(dtype, buffer + start(owned) * esize, length(owned), n);
  for (int s = 0; s < n - 1; ++s) {
    const int sendChunk = wrap(r + 1 - s);
    const int recvChunk = wrap(r - s);
    SQUALL_TRY(ctx.sendRecv(right, buffer + start(sendChunk) * esize, length(sendChunk) * esize,
                            left, buffer + start(recvChunk) * esize, length(recvChunk) * esize,
                            static_cast<uint32_t>(n - 1 + s)));
  }
  return Status::kOk;
}

}  // namespace squall::coll
