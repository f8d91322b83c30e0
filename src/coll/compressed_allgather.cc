// All-gather compressed allreduce, for small n * N where message latency
// dominates.
//
// Semantics (differ from the two-phase algorithm: there is no server
// residual and no second compression):
//   every rank encodes its whole input with its worker residual e_w
//   (committed only if every block of every rank was finite: all ranks read
//   the same n encodings, so they decide together), all-gathers the n encoded
//   buffers, and every rank decodes them in rank order 0..n-1 and sums them
//   (decode, then decodeAccumulate); avg divides by n (acc[i] / n). output =
//   that sum, formed tile by tile in the L1 cache and written once
//   (codec::decodeSum).
// All ranks decode the same bytes in the same order, so outputs are
// bit-identical. The server residual of the state is left untouched.
//
// Pipelining: the buffer is cut into segments of S elements (S a multiple of
// the codec block); every rank encodes and sends segment k while earlier
// ones travel, then decodes them once all have arrived. Output is written
// only after every message has arrived, every send has left and every piece
// has been checked (checkPiece), so a call that fails leaves it as it was;
// all input has been encoded by then, so the operation may run in place.
// A caller's hooks (ExchangeHooks: the hierarchical allreduce) are asked
// for segment k's input just before it is encoded, and given each segment
// of output as soon as it is decoded.
//
// Cost per rank, E = encoded size of N elements: (n-1) messages per segment
// in one round ((n-1) alpha if the network serialises them, one alpha
// otherwise), (n-1) * E bytes sent and received; n decodes of N.
//
// Choice (auto): two-phase costs 2(n-1) alpha + 2(n-1)/n E beta, all-gather
// (n-1) alpha + (n-1) E beta; all-gather wins when E (n-2)/n <= alpha/beta.
// alpha and beta come from SQUALL_NET_LATENCY_US and SQUALL_NET_MBPS
// (default 50 us and 10 Gbit/s: alpha/beta = 62500 bytes, so at 4 ranks the
// all-gather up to about 1M elements of onebit; at 1 Gbit/s up to about
// 100k); n = 2 always uses the all-gather.
#include <algorithm>
#include <vector>

#include "src/coll/algorithms.h"
#include "src/coll/compressed_common.h"

namespace squall::coll {

CompressedAlgo chooseCompressedAlgo(int nranks, size_t count, const codec::Spec& spec,
                                    double latencyBytes, const codec::Spec* gatherSpec) {
  // With the servers' code of E_g bytes the two-phase sends (n-1)/n (E + E_g):
  // the all-gather wins when E - (E + E_g)/n <= alpha/beta.
  size_t encoded = 0, gathered = 0;
  if (codec::encodedSize(spec, count, &encoded) != Status::kOk ||
      codec::encodedSize(gatherSpec != nullptr ? *gatherSpec : spec, count, &gathered) !=
          Status::kOk)
    return CompressedAlgo::kTwoPhase;
  const double n = nranks;
  const double e = static_cast<double>(encoded);
  return e - (e + static_cast<double>(gathered)) / n <= latencyBytes ? CompressedAlgo::kAllGather
                                                                     : CompressedAlgo::kTwoPhase;
}

CompressedAlgo chooseCompressedAlgoByBytes(int nranks, size_t count, const codec::Spec& spec,
                                           const codec::Spec* gatherSpec) {
  // Rank r's share of the two-phase: its chunk of the padded buffer (the
  // layout of compressed_state.h), encoded in each of the two rounds to the
  // n - 1 others; the last chunks may be shorter, or empty, below N.
  const auto n = static_cast<size_t>(nranks);
  const size_t unit = codec::usesBlocks(spec.codec) ? spec.block : 1;
  const size_t chunk = (count + n * unit - 1) / (n * unit) * unit;
  size_t whole = 0, mine = 0, served = 0;
  if (codec::encodedSize(spec, count, &whole) != Status::kOk ||
      codec::encodedSize(spec, std::min(chunk, count), &mine) != Status::kOk ||
      codec::encodedSize(gatherSpec != nullptr ? *gatherSpec : spec, std::min(chunk, count),
                         &served) != Status::kOk)
    return CompressedAlgo::kTwoPhase;
  const double twoPhase = static_cast<double>(n - 1) * static_cast<double>(mine + served);
  const double allGather = static_cast<double>(n - 1) * static_cast<double>(whole);
  return twoPhase < allGather ? CompressedAlgo::kTwoPhase : CompressedAlgo::kAllGather;
}

CompressedAlgo resolveCompressedAlgo(int nranks, const CompressedState& state,
                                     CompressedAlgo option, double latencyBytes) {
  // A fixed choice of the state's owner first, then the variable's, then
  // the owner's kind of auto.
  CompressedAlgo algo = state.algorithm();
  if (algo == CompressedAlgo::kTwoPhase || algo == CompressedAlgo::kAllGather) return algo;
  if (option == CompressedAlgo::kTwoPhase || option == CompressedAlgo::kAllGather) return option;
  if (algo == CompressedAlgo::kAutoBytes)
    return chooseCompressedAlgoByBytes(nranks, state.count(), state.spec(), &state.gatherSpec());
  return chooseCompressedAlgo(nranks, state.count(), state.spec(), latencyBytes,
                              &state.gatherSpec());
}

Status allGatherCompressedAllReduce(const OpContext& ctx, const void* in, void* out, DataType dtype,
                                    ReduceOp op, CompressedState* state, bool* verdict,
                                    const ExchangeHooks* hooks) {
  SQUALL_REQUIRE(hooks == nullptr || verdict != nullptr, Status::kInternal, Subsys::kColl,
                 "exchange hooks need a caller that commits the residuals itself");
  const int n = ctx.size();
  const auto nn = static_cast<size_t>(n);
  const auto rr = static_cast<size_t>(ctx.rank());
  // Segments are cut at virtual positions (a state's phase, compressed_state.h).
  const size_t phase = state->phase();
  const size_t span = phase + state->count();
  const size_t unit = state->unit();
  const codec::Spec spec = state->spec();
  const size_t seg = segmentLength(*ctx.options, unit, span);
  const size_t segments = (span + seg - 1) / seg;
  const size_t esize = dataTypeSize(dtype);
  CompressedStats stats;
  stats.algorithm = "allgather";
  stats.segments = segments;

  // Segment k: its first element's virtual position, and its piece.
  auto firstOf = [&](size_t k) { return std::max(k * seg, phase); };
  auto pieceOf = [&](size_t k) {
    return pieceAt(firstOf(k), std::min((k + 1) * seg, span) - firstOf(k), phase, unit);
  };
  // A slot holds a segment's encoding, or a piece's two (one header more).
  size_t slot = 0, headroom = 0;
  SQUALL_TRY(codec::encodedSize(spec, seg, &slot));
  SQUALL_TRY(codec::encodedSize(spec, unit, &headroom));
  slot += headroom;
  state->scratch().recvBuffer.resize(nn * segments * slot);  // slot (j, k); own encodings too
  if (dtype != DataType::kF32) state->scratch().accumulator.resize(seg);
  // With hooks the caller reads each decoded segment next, from the cache.
  CallStores stores = callStores(*state, esize);
  if (hooks != nullptr) stores.output = codec::Stores::kCached;
  auto slotOf = [&](size_t j, size_t k) {
    return state->scratch().recvBuffer.data() + (j * segments + k) * slot;
  };

  std::vector<transport::RequestPtr> received(nn * segments), sends;
  sends.reserve(nn * segments);
  for (size_t k = 0; k < segments; ++k) {
    size_t bytes = 0;
    SQUALL_TRY(pieceBytes(spec, pieceOf(k), &bytes));
    for (size_t j = 0; j < nn; ++j) {
      if (j == rr) continue;
      SQUALL_TRY(ctx.recv(static_cast<int>(j), static_cast<uint32_t>(k), slotOf(j, k), bytes,
                          &received[k * nn + j]));
      stats.bytesReceived += bytes;
    }
  }
  const auto* input = static_cast<const uint8_t*>(in);
  for (size_t k = 0; k < segments; ++k) {
    const size_t at = firstOf(k);  // the worker residual is indexed virtually
    if (hooks != nullptr) SQUALL_TRY(hooks->inputNeeded(std::min((k + 1) * seg, span) - phase));
    const codec::ResidualSpan residual = state->workerAt(at);
    codec::EncodeResult result;
    SQUALL_TRY(encodePiece(spec, pieceOf(k), input + (at - phase) * esize, codecDType(dtype),
                           residual, slotOf(rr, k), slot, &result, stores.residual));
    for (size_t j = 0; j < nn; ++j) {
      if (j == rr) continue;
      sends.emplace_back();
      SQUALL_TRY(ctx.send(static_cast<int>(j), static_cast<uint32_t>(k), slotOf(rr, k),
                          result.bytes, &sends.back()));
      stats.bytesSent += result.bytes;
      ++stats.messagesSent;
    }
    // Move what has arrived while the next segment is encoded, instead of
    // all of it after the last one (a transport without a progress thread,
    // such as ucx, moves bytes only when asked).
    SQUALL_TRY(ctx.transport->progress());
  }
  // Output only on success: everything has arrived and left, and every
  // piece is checked, before the first output element is written.
  SQUALL_TRY(ctx.waitAll(received));
  SQUALL_TRY(ctx.waitAll(sends));
  bool finite = true;  // every rank's encoding of every segment
  for (size_t k = 0; k < segments; ++k) {
    size_t bytes = 0;
    SQUALL_TRY(pieceBytes(spec, pieceOf(k), &bytes));
    for (size_t j = 0; j < nn; ++j)
      SQUALL_TRY(checkPiece(spec, slotOf(j, k), bytes, pieceOf(k), &finite));
  }
  std::vector<const uint8_t*> encodings(nn);
  for (size_t k = 0; k < segments; ++k) {
    // The n decodes, their sum and the division in one pass: fp32 output is
    // written once, straight from the L1 cache (the input is no longer read,
    // see above).
    const size_t at = firstOf(k) - phase;  // the output index
    const bool f32 = dtype == DataType::kF32;
    float* sum = f32 ? static_cast<float*>(out) + at : state->scratch().accumulator.data();
    const Piece piece = pieceOf(k);
    size_t bytes = 0;
    SQUALL_TRY(pieceBytes(spec, piece, &bytes));
    for (size_t j = 0; j < nn; ++j) encodings[j] = slotOf(j, k);
    SQUALL_TRY(decodeSumPiece(spec, encodings, bytes, piece, sum, op == ReduceOp::kAvg ? n : 1,
                              f32 ? stores.output : codec::Stores::kCached));
    if (!f32) storeDecoded(dtype, sum, out, at, piece.count);
    if (hooks != nullptr) SQUALL_TRY(hooks->outputReady(at + piece.count, finite));
  }
  if (verdict != nullptr) {
    *verdict = finite;
  } else {
    state->commit(finite, false);
  }
  state->recordStats(stats);
  return Status::kOk;
}

}  // namespace squall::coll
