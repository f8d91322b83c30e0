// Ring allreduce: a reduce-scatter followed by an all-gather around the ring
// r -> r + 1, pipelined in segments.
//
// The buffer is cut into n chunks. In reduce-scatter step s (0 .. n-2) rank r
// sends its partial chunk (r - s) mod n to the right and adds the partial
// chunk (r - s - 1) mod n received from the left into its own; after n - 1
// steps rank r holds the full reduction of chunk (r + 1) mod n (divided by n
// there for avg). All-gather step s then forwards chunk (r + 1 - s) mod n.
// Each chunk is reduced by exactly one sequence of additions and then copied,
// so every rank ends with bit-identical results.
//
// Pipelining: every chunk is cut into K segments of SQUALL_SEGMENT_BYTES,
// each its own message. What step s + 1 sends is what step s just reduced
// (or, in the all-gather, received), so segment k moves on as soon as it is
// ready: while the transport carries segment k to the right, this rank is
// already reducing segment k + 1 from the left. Without it the reduction and
// the wire alternate and neither runs at full speed. The arithmetic is the
// same per element as without segments, so the results do not depend on the
// segment size.
//
// No copy of the input and, out of place, no scratch: step 0 sends this
// rank's chunk straight from `in`, the left neighbour's partial chunks land
// in `out` (each chunk of `out` is received into once in the reduce-scatter,
// before anything else touches it) and every reduction writes
// out = in (op) out, one pass. Every receive of the call, of both phases, is
// posted before the first send (in place: all but later reduce-scatter steps), so a neighbour that
// runs ahead (with more ranks than cores, one rank often enters a call after the others have
// finished most of the reduce-scatter) finds its receive posted instead of
// being buffered by the transport and copied. In place the input is in the
// way: the reduce-scatter receives go to a scratch of two chunks,
// alternating by step (each step's posted one step ahead), owned by the
// communicator and reused across calls.
//
// Cost per rank: 2(n-1)K messages, 2(n-1)/n * N bytes sent and received:
// bandwidth-optimal; latency 2(n-1) alpha plus K-1 segment times to fill the
// pipeline.
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
  const auto* source = static_cast<const uint8_t*>(in);
  if (n == 1 || count == 0) {
    if (in != out && count != 0) std::memcpy(out, in, count * esize);
    return Status::kOk;
  }

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
  const size_t longest = base + (extra != 0 ? 1 : 0);
  // Every message's step must stay below the abort notice's (2^32 - 1): at
  // most 2^31 of them, whatever SQUALL_SEGMENT_BYTES says.
  const auto steps = static_cast<size_t>(n - 1);
  // A chunk is cut into at most ringMaxSegments segments (the segment grows
  // with the buffer): every segment costs this rank a wakeup, and on a
  // loaded machine a wakeup waits for a time slice. 128 segments of 1 MiB
  // per chunk made a 256 MiB call at 2 ranks wait more than it worked. 4 and
  // 16 traded places between interleaved tests on a loaded machine
  // (docs/benchmarks.md). The pipeline needs only a few segments in flight.
  const size_t cap = ctx.options->ringMaxSegments;
  const size_t minSeg = std::max<size_t>(
      {1, (longest * 2 * steps) >> 31, cap == 0 ? size_t{1} : (longest + cap - 1) / cap});
  const size_t seg = ctx.options->segmentBytes == 0
                         ? std::max(longest, size_t{1})
                         : std::clamp(ctx.options->segmentBytes / esize, minSeg,
                                      std::max({longest, minSeg, size_t{1}}));
  const size_t segments = (longest + seg - 1) / seg;
  // Segment k of chunk c: elements [first, first + size) of the buffer.
  auto segFirst = [&](int c, size_t k) { return start(c) + std::min(k * seg, length(c)); };
  auto segSize = [&](int c, size_t k) {
    return std::min(length(c), (k + 1) * seg) - std::min(length(c), k * seg);
  };
  auto stepOf = [&](size_t phaseStep, size_t k) {
    return static_cast<uint32_t>(phaseStep * segments + k);
  };

  // Where reduce-scatter step s's segment k lands. Out of place, in `out`
  // itself: chunk (r - s - 1) of `out` is touched by nothing before it, and
  // the reduction then writes out = in (op) out in place, so every receive
  // of the phase can be posted at the start, no scratch is touched and the
  // left neighbour's messages land where they are reduced however far ahead
  // of this rank it runs. In place the input is in the way: the scratch (two
  // chunks, alternating by step) takes them, one step posted ahead.
  const bool inPlace = in == out;
  std::vector<uint8_t>& scratch = *ctx.scratch;
  const size_t chunkBytes = longest * esize;
  if (inPlace && scratch.size() < 2 * chunkBytes) scratch.resize(2 * chunkBytes);
  auto incoming = [&](size_t s, int chunk, size_t k) {
    return inPlace ? scratch.data() + (s % 2) * chunkBytes + k * seg * esize
                   : buffer + segFirst(chunk, k) * esize;
  };

  std::vector<transport::RequestPtr> received(steps * segments), gathered(steps * segments);
  std::vector<transport::RequestPtr> rsSends, agSends;
  rsSends.reserve(steps * segments);
  agSends.reserve(steps * segments);
  auto post = [&](std::vector<transport::RequestPtr>& sends, uint32_t step, int chunk, size_t k,
                  const uint8_t* from) -> Status {
    const size_t m = segSize(chunk, k);
    sends.emplace_back();
    return ctx.send(right, step, from + segFirst(chunk, k) * esize, m * esize, &sends.back());
  };
  auto postReduceReceives = [&](size_t s) -> Status {
    const int chunk = wrap(r - static_cast<int>(s) - 1);
    for (size_t k = 0; k < segments; ++k) {
      SQUALL_TRY(ctx.recv(left, stepOf(s, k), incoming(s, chunk, k), segSize(chunk, k) * esize,
                          &received[s * segments + k]));
    }
    return Status::kOk;
  };
  // All-gather step s's segment k lands in place, in chunk (r - s), which
  // this rank reduces in step s - 1 and sends in step s. Every one of these
  // receives is posted at the start all the same: what arrives there is the
  // fully reduced segment, which the owner could only compute from what this
  // rank's send of that segment delivered, so it cannot arrive before that
  // send has read the segment (on any transport). Posted late, the left
  // neighbour's all-gather messages, which start while this rank is still
  // reducing, arrived unexpected (a growing transport buffer and a copy):
  // 4 ranks, 256 MiB on loopback, about a fifth of all bytes received.
  auto postGatherReceives = [&]() -> Status {
    for (size_t s = 0; s < steps; ++s) {
      const int chunk = wrap(r - static_cast<int>(s));
      for (size_t k = 0; k < segments; ++k) {
        SQUALL_TRY(ctx.recv(left, stepOf(steps + s, k), buffer + segFirst(chunk, k) * esize,
                            segSize(chunk, k) * esize, &gathered[s * segments + k]));
      }
    }
    return Status::kOk;
  };

  // Reduce-scatter.
  if (inPlace) {
    SQUALL_TRY(postReduceReceives(0));
  } else {
    for (size_t s = 0; s < steps; ++s) SQUALL_TRY(postReduceReceives(s));
  }
  SQUALL_TRY(postGatherReceives());
  for (size_t k = 0; k < segments; ++k) SQUALL_TRY(post(rsSends, stepOf(0, k), r, k, source));
  const int owned = wrap(r + 1);
  for (size_t s = 0; s < steps; ++s) {
    // Step s - 1 has reduced all of its scratch half: step s + 1 may reuse it.
    if (inPlace && s + 1 < steps) SQUALL_TRY(postReduceReceives(s + 1));
    const int chunk = wrap(r - static_cast<int>(s) - 1);
    for (size_t k = 0; k < segments; ++k) {
      SQUALL_TRY(ctx.waitAll({&received[s * segments + k], 1}));
      const size_t offset = segFirst(chunk, k) * esize;
      combine(dtype, op, buffer + offset, source + offset, incoming(s, chunk, k),
              segSize(chunk, k));
      if (s + 1 < steps) {
        SQUALL_TRY(post(rsSends, stepOf(s + 1, k), chunk, k, buffer));
      } else {  // chunk == owned: fully reduced, and the all-gather's first message
        if (op == ReduceOp::kAvg) finishAverage(dtype, buffer + offset, segSize(chunk, k), n);
        SQUALL_TRY(post(agSends, stepOf(steps, k), owned, k, buffer));
      }
    }
  }

  // All-gather.
  for (size_t s = 0; s < steps; ++s) {
    const int chunk = wrap(r - static_cast<int>(s));
    for (size_t k = 0; k < segments; ++k) {
      SQUALL_TRY(ctx.waitAll({&gathered[s * segments + k], 1}));
      if (s + 1 < steps) SQUALL_TRY(post(agSends, stepOf(steps + s + 1, k), chunk, k, buffer));
    }
  }
  SQUALL_TRY(ctx.waitAll(rsSends));
  return ctx.waitAll(agSends);
}

}  // namespace squall::coll
