// Hierarchical compressed allreduce: H hosts of L ranks each (hierarchy.h).
//
// The buffer is cut into L slices (CompressedState::createHierarchical:
// boundaries at multiples of H * codec block); local rank j owns slice j.
//  A. Local reduce-scatter at full precision through the host's shared
//     memory segment, in rounds of one window: every rank writes its piece of
//     every slice into its slot, the ranks exchange a note, and rank j sums
//     the L pieces of slice j in local order 0..L-1 into an fp32 buffer (and
//     divides by L for avg, in the pass of the last piece).
//  B. The flat compressed allreduce (two-phase or all-gather, the usual
//     choice for H ranks and the slice) of that fp32 slice among the H ranks
//     of local index j, one per host, through a GroupTransport view; its
//     residuals are the state's. It reports whether every block was finite
//     instead of committing. For fp32 it writes the result straight into
//     the rank's output (A has read the input there before).
//  C. Local all-gather through the segment, in rounds: rank j writes its
//     slice of the result, converted to the dtype, into its slot; after the
//     note every rank copies every slot to its output. The notes of the first
//     round carry the B verdicts of the host's L slices; every host sees the
//     same L verdicts (verdict j is shared by the H ranks of index j), so all
//     n ranks commit their residuals together, or none does.
// A final note says every rank has read the segment, so the next call may
// write it from its first round on.
//
// Overlap: A and C run inside B, through its hooks (ExchangeHooks). B asks
// for its input segment by segment, and A's rounds run just in time, while
// the segments encoded before travel; B hands back its output as it decodes
// each segment, and C's rounds run while that window is still in cache. So
// the link is busy during the local phases instead of idle, and each window
// is summed, encoded, decoded and spread while it is in cache. Every A round
// comes before B first waits for a message from another host (its last
// request is for the whole slice), so a rank never waits for a local peer
// that waits for it; the two-phase exchange needs its input whole at once
// and writes its output out of order, so it asks once and hands back once.
//
// Rounds alternate between the segment's two buffers. A rank writes round t
// into buffer t % 2 only after it has the notes of round t - 1 from every
// local peer, and a peer sends that note only after it has read round t - 2,
// the last one in that buffer; so one note per peer and round is all the
// synchronisation, and every wait is an OpContext wait (deadline, abort
// notices, dead peers reported as in every other collective).
//
// Bit-identical results: slice j is summed by rank j alone in a fixed order,
// B gives the same bytes on the H ranks of index j, and every rank copies the
// same converted bytes in C. Inter-host traffic: each rank sends the
// compressed exchange of N / L elements among H ranks, so a host puts about
// the bytes of one flat rank among H on its link, and each rank encodes and
// decodes a slice instead of the buffer.
#include <algorithm>
#include <vector>

#include "src/codec/numeric.h"
#include "src/coll/algorithms.h"
#include "src/coll/compressed_common.h"
#include "src/coll/group_transport.h"
#include "src/coll/hierarchy.h"

namespace squall::coll {
namespace {

// Local notes use their own step range; the compressed exchange uses the
// low steps between other pairs of ranks.
constexpr uint32_t kLocalStepBase = 0x40000000u;

float toFloat(DataType dtype, const uint8_t* src, size_t i) {
  uint16_t h;
  std::memcpy(&h, src + 2 * i, 2);
  return dtype == DataType::kF16 ? codec::halfToFloat(h) : codec::bf16ToFloat(h);
}

// acc = finish(a + b), or acc = finish(acc + a) with b null, elementwise in
// fp32 (the memory traffic, not the adds, is what this phase costs).
template <class Finish>
void combine(DataType dtype, const uint8_t* a, const uint8_t* b, float* acc, size_t m,
             Finish finish) {
  if (dtype == DataType::kF32) {
    const auto* x = reinterpret_cast<const float*>(a);
    const auto* y = reinterpret_cast<const float*>(b);
    if (y != nullptr) {
      for (size_t i = 0; i < m; ++i) acc[i] = finish(x[i] + y[i]);
    } else {
      for (size_t i = 0; i < m; ++i) acc[i] = finish(acc[i] + x[i]);
    }
    return;
  }
  if (b != nullptr) {
    for (size_t i = 0; i < m; ++i) acc[i] = finish(toFloat(dtype, a, i) + toFloat(dtype, b, i));
  } else {
    for (size_t i = 0; i < m; ++i) acc[i] = finish(acc[i] + toFloat(dtype, a, i));
  }
}

// combine(), the last piece of an avg dividing by `divisor` in the same pass,
// by the rule of codec::divideAll (codec::divideByProduct), so the bytes are
// those of a separate division.
void accumulate(DataType dtype, const uint8_t* a, const uint8_t* b, float* acc, size_t m,
                int divisor) {
  if (divisor <= 1) return combine(dtype, a, b, acc, m, [](float v) { return v; });
  if (codec::divideByProduct(divisor)) {
    const float inverse = 1.0f / static_cast<float>(divisor);
    return combine(dtype, a, b, acc, m, [inverse](float v) { return v * inverse; });
  }
  const auto by = static_cast<float>(divisor);
  combine(dtype, a, b, acc, m, [by](float v) { return v / by; });
}

// The notes of one round among the local ranks.
class LocalRounds {
 public:
  LocalRounds(const OpContext& ctx, const HostLayout& layout) : ctx_(ctx), layout_(layout) {
    const auto l = static_cast<size_t>(layout.local);
    inbox_.resize(l);
    requests_.reserve(2 * l);
  }

  // Sends `note` to every local peer and waits for theirs (inbox(l) after).
  Status exchange(uint32_t round, uint8_t note) {
    requests_.clear();
    outbox_ = note;
    const uint32_t step = kLocalStepBase + round;
    for (size_t l = 0; l < inbox_.size(); ++l) {
      if (static_cast<int>(l) == layout_.localIndex) continue;
      requests_.emplace_back();
      SQUALL_TRY(ctx_.recv(layout_.localRanks[l], step, &inbox_[l], 1, &requests_.back()));
    }
    for (size_t l = 0; l < inbox_.size(); ++l) {
      if (static_cast<int>(l) == layout_.localIndex) continue;
      requests_.emplace_back();
      SQUALL_TRY(ctx_.send(layout_.localRanks[l], step, &outbox_, 1, &requests_.back()));
    }
    SQUALL_TRY(ctx_.waitAll(requests_));
    inbox_[static_cast<size_t>(layout_.localIndex)] = note;
    return Status::kOk;
  }
  uint8_t inbox(size_t l) const { return inbox_[l]; }

 private:
  const OpContext& ctx_;
  const HostLayout& layout_;
  std::vector<uint8_t> inbox_;
  uint8_t outbox_ = 0;
  std::vector<transport::RequestPtr> requests_;
};

}  // namespace

Status hierarchicalCompressedAllReduce(const OpContext& ctx, const Hierarchy& hierarchy,
                                       const void* in, void* out, DataType dtype, ReduceOp op,
                                       CompressedState* state) {
  const HostLayout& layout = hierarchy.layout;
  const auto ll = static_cast<size_t>(layout.local);
  const int j = layout.localIndex;
  const size_t esize = dataTypeSize(dtype);
  const size_t window = hierarchy.windowBytes;
  const auto* input = static_cast<const uint8_t*>(in);
  auto* output = static_cast<uint8_t*>(out);
  const size_t mine = state->sliceCount(j);
  const size_t largest = state->sliceCount(0);  // the first slices are the largest
  std::vector<float>& sum = state->scratch().slice;
  sum.resize(std::max<size_t>(mine, 1));
  // Where the exchange writes the slice's result: straight into this rank's
  // output for fp32 (its input there was read in A, which ends before the
  // exchange writes anything), else the sum, to be converted.
  float* result = dtype == DataType::kF32
                      ? reinterpret_cast<float*>(output + state->sliceBegin(j) * esize)
                      : sum.data();
  LocalRounds notes(ctx, layout);
  uint32_t round = 0;
  uint64_t noteBytes = 0;

  // A. One round of the reduce-scatter: piece [reduced, reduced + p) of
  // every slice.
  const size_t p = std::max<size_t>(window / (ll * esize), 1);
  size_t reduced = 0;
  auto reduceRound = [&]() -> Status {
    const size_t at = reduced;
    reduced += p;
    uint8_t* slot = hierarchy.slot(round % 2, static_cast<size_t>(j));
    for (size_t l = 0; l < ll; ++l) {
      const size_t count = state->sliceCount(static_cast<int>(l));
      // Its own slice a rank reads from its input.
      if (at >= count || l == static_cast<size_t>(j)) continue;
      const size_t m = std::min(p, count - at);
      std::memcpy(slot + l * p * esize,
                  input + (state->sliceBegin(static_cast<int>(l)) + at) * esize, m * esize);
    }
    SQUALL_TRY(notes.exchange(round, 1));
    noteBytes += ll - 1;
    const uint32_t r = round++;
    if (at >= mine) return Status::kOk;
    const size_t m = std::min(p, mine - at);
    auto piece = [&](size_t l) -> const uint8_t* {
      if (l == static_cast<size_t>(j)) return input + (state->sliceBegin(j) + at) * esize;
      return hierarchy.slot(r % 2, l) + static_cast<size_t>(j) * p * esize;
    };
    // Local order 0, 1, ..., L-1 on every host: ((x0 + x1) + x2) + ...; avg
    // divides in the pass of the last piece.
    auto divisor = [&](size_t l) { return op == ReduceOp::kAvg && l + 1 == ll ? layout.local : 1; };
    accumulate(dtype, piece(0), piece(1), sum.data() + at, m, divisor(1));
    for (size_t l = 2; l < ll; ++l)
      accumulate(dtype, piece(l), nullptr, sum.data() + at, m, divisor(l));
    return Status::kOk;
  };
  // The rounds that form sum[0, end); all of them (the peers' slices may
  // be longer) once this rank's whole slice is asked for.
  auto reduceUpTo = [&](size_t end) -> Status {
    const size_t goal = end >= mine ? largest : end;
    while (reduced < goal) SQUALL_TRY(reduceRound());
    return Status::kOk;
  };

  // C. One round of the all-gather: window [gathered, gathered + q) of
  // every slice, converted to the dtype. The first round's notes carry the
  // verdicts.
  const size_t q = std::max<size_t>(window / esize, 1);
  size_t gathered = 0;
  bool allFinite = true;
  auto gatherRound = [&](bool finite) -> Status {
    const size_t at = gathered;
    gathered += q;
    if (at < mine) {
      // Into the slot for the peers (fp32: from the output, where the
      // exchange left it); other dtypes convert into the output too, while
      // the piece is in cache.
      const size_t m = std::min(q, mine - at);
      uint8_t* slot = hierarchy.slot(round % 2, static_cast<size_t>(j));
      if (dtype == DataType::kF32) {
        std::memcpy(slot, result + at, m * sizeof(float));
      } else {
        storeDecoded(dtype, result + at, slot, 0, m);
        storeDecoded(dtype, result + at, output, state->sliceBegin(j) + at, m);
      }
    }
    SQUALL_TRY(notes.exchange(round, finite ? 1 : 0));
    noteBytes += ll - 1;
    if (at == 0) {
      for (size_t l = 0; l < ll; ++l) allFinite = allFinite && notes.inbox(l) != 0;
    }
    for (size_t l = 0; l < ll; ++l) {
      const size_t count = state->sliceCount(static_cast<int>(l));
      if (at >= count || l == static_cast<size_t>(j)) continue;
      std::memcpy(output + (state->sliceBegin(static_cast<int>(l)) + at) * esize,
                  hierarchy.slot(round % 2, l), std::min(q, count - at) * esize);
    }
    ++round;
    return Status::kOk;
  };
  // The rounds whose windows of this rank's slice lie in sum[0, end); all
  // of them once the whole slice is final.
  auto gatherUpTo = [&](size_t end, bool finite) -> Status {
    const size_t goal = end >= mine ? largest : end / q * q;
    while (gathered < goal) SQUALL_TRY(gatherRound(finite));
    return Status::kOk;
  };

  // B. The compressed exchange of the slice among the hosts, pipelined with
  // A and C through its hooks: A's rounds run as the exchange needs its
  // input, C's as it decodes its output.
  CompressedState& cross = state->cross();
  bool finite = true;
  bool serverUsed = false;  // the all-gather variant keeps no server residual
  CompressedStats crossStats;
  if (mine != 0) {
    GroupTransport group(ctx.whole != nullptr ? ctx.whole : ctx.transport, layout.crossRanks);
    OpContext sub = ctx;
    sub.transport = &group;
    sub.whole = group.base();
    const CompressedAlgo algo = resolveCompressedAlgo(
        layout.hosts, cross, ctx.options->compressedAlgo, ctx.options->latencyBytes());
    serverUsed = algo != CompressedAlgo::kAllGather;
    ExchangeHooks hooks;
    hooks.inputNeeded = reduceUpTo;
    hooks.outputReady = gatherUpTo;
    SQUALL_TRY(algo == CompressedAlgo::kAllGather
                   ? allGatherCompressedAllReduce(sub, sum.data(), result, DataType::kF32, op,
                                                  &cross, &finite, &hooks)
                   : twoPhaseCompressedAllReduce(sub, sum.data(), result, DataType::kF32, op,
                                                 &cross, &finite, &hooks));
    crossStats = cross.lastStats();
  }
  // Whatever the exchange did not need (all of it for an empty slice).
  SQUALL_TRY(reduceUpTo(mine));
  SQUALL_TRY(gatherUpTo(mine, finite));
  // Everyone has read the segment: the next call may write it.
  SQUALL_TRY(notes.exchange(round, 1));
  noteBytes += ll - 1;

  cross.commit(allFinite, serverUsed);
  CompressedStats stats;
  stats.algorithm = "hierarchical";
  stats.crossAlgorithm = mine != 0 ? crossStats.algorithm : "none";
  stats.segments = crossStats.segments;
  stats.crossBytesSent = crossStats.bytesSent;
  stats.bytesSent = crossStats.bytesSent + noteBytes;
  stats.bytesReceived = crossStats.bytesReceived + noteBytes;
  stats.messagesSent = crossStats.messagesSent + static_cast<uint64_t>(round + 1) * (ll - 1);
  state->recordStats(stats);
  return Status::kOk;
}

}  // namespace squall::coll
