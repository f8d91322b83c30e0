// Compressed reduce-scatter with error feedback: the first phase of the
// two-phase compressed allreduce (compressed_twophase.cc) on its own, for
// sharded data parallelism (FSDP's gradient reduce-scatter).
//
// The input holds n pieces of R elements; piece j, elements [j R, (j + 1) R),
// is rank j's shard (compressed_state.h, reduce-scatter layout).
//  1. Worker: encode every piece of the input with the worker residual e_w
//     (z = x + e_w, e_w' = z - decode(encode(z))); each piece is encoded on
//     its own, its codec blocks beginning at its first element, so R need not
//     be a multiple of the block.
//  2. Exchange: send encoded piece j to rank j (all-to-all), and then one
//     byte to every peer: whether all of this rank's encodings were finite.
//  3. Decode the n encodings of piece r in rank order 0..n-1 and sum them
//     (decode, then decodeAccumulate), dividing by n for avg (acc[i] / n,
//     the allreduce's rule) into the output of R elements (codec::decodeSum).
// There is no server residual: the sum is the output. The output is a
// function of the bytes received, summed in a fixed order, so it is the same
// run to run. A non-finite block decodes to NaN in the output of the rank
// that serves it; the other ranks do not see that block, so the verdict
// bytes tell them, and every rank commits its worker residual only when no
// rank's encoding was non-finite: a call with a non-finite input anywhere
// leaves every residual as it was.
//
// Pipelining: each piece is cut into K segments of S elements (S a multiple
// of the block, from SQUALL_SEGMENT_BYTES); segment k of every piece travels
// as its own message, sent as soon as it is encoded, while the next ones are
// encoded. All receives are posted first. The output is written only once
// every message has arrived, every send has left and every received piece
// has been checked, so a call that fails leaves the output (and the
// residual) as they were; the input is read in full by then, so the output
// may be the input's own piece r (in place).
//
// Cost per rank, with E = the encoded size of n R elements (about
// n R (bits / 8 + 4 / B) bytes): (n - 1)(K + 1) messages in one round,
// (n - 1)/n * E + (n - 1) bytes sent and the same received (half the
// two-phase allreduce's). Compute: encode n R elements, decode n R.
#include <vector>

#include "src/coll/algorithms.h"
#include "src/coll/compressed_common.h"

namespace squall::coll {

Status directCompressedReduceScatter(const OpContext& ctx, const void* in, void* out,
                                     DataType dtype, ReduceOp op, CompressedState* state) {
  SQUALL_REQUIRE(state->reduceScatter(), Status::kInternal, Subsys::kColl,
                 "the compressed reduce-scatter needs a state of the reduce-scatter layout");
  const int n = ctx.size();
  const auto nn = static_cast<size_t>(n);
  const auto rr = static_cast<size_t>(ctx.rank());
  const size_t piece = state->chunk();
  const codec::Spec spec = state->spec();
  const size_t seg = segmentLength(*ctx.options, state->unit(), piece);
  const size_t segments = (piece + seg - 1) / seg;
  const size_t esize = dataTypeSize(dtype);
  const codec::DType inType = codecDType(dtype);
  CompressedStats stats;
  stats.algorithm = "reducescatter";
  stats.segments = segments;

  // Segment k of every piece: its elements and the bytes of its encoding
  // (the same for every piece and every rank).
  auto countOf = [&](size_t k) { return std::min(seg, piece - k * seg); };
  std::vector<size_t> bytesOf(segments);
  for (size_t k = 0; k < segments; ++k)
    SQUALL_TRY(codec::encodedSize(spec, countOf(k), &bytesOf[k]));
  const size_t slot = bytesOf[0];
  CompressedState::Scratch& scratch = state->scratch();
  scratch.sendBuffer.resize(nn * segments * slot);
  scratch.recvBuffer.resize(nn * segments * slot);
  scratch.verdicts.assign(nn, 1);  // [j]: rank j's verdict, this rank's own at rr
  if (dtype != DataType::kF32) scratch.decoded.resize(seg);
  const CallStores stores = callStores(*state, esize);
  auto sendSlot = [&](size_t c, size_t k) {
    return scratch.sendBuffer.data() + (c * segments + k) * slot;
  };
  auto recvSlot = [&](size_t j, size_t k) {
    return scratch.recvBuffer.data() + (j * segments + k) * slot;
  };
  const auto verdictStep = static_cast<uint32_t>(segments);

  // Post every receive up front: segment k of piece r from every peer, then
  // every peer's verdict.
  std::vector<transport::RequestPtr> exchange(nn * segments), verdicts(nn), sends;
  sends.reserve((nn - 1) * (segments + 1));
  for (size_t k = 0; k < segments; ++k) {
    for (size_t j = 0; j < nn; ++j) {
      if (j == rr) continue;
      SQUALL_TRY(ctx.recv(static_cast<int>(j), static_cast<uint32_t>(k), recvSlot(j, k), bytesOf[k],
                          &exchange[k * nn + j]));
      stats.bytesReceived += bytesOf[k];
    }
  }
  for (size_t j = 0; j < nn; ++j) {
    if (j == rr) continue;
    SQUALL_TRY(ctx.recv(static_cast<int>(j), verdictStep, &scratch.verdicts[j], 1, &verdicts[j]));
    stats.bytesReceived += 1;
  }
  auto post = [&](size_t to, uint32_t step, const void* data, size_t bytes) -> Status {
    sends.emplace_back();
    SQUALL_TRY(ctx.send(static_cast<int>(to), step, data, bytes, &sends.back()));
    stats.bytesSent += bytes;
    ++stats.messagesSent;
    return Status::kOk;
  };

  // Encode and send, segment by segment; this rank's own piece last.
  const auto* input = static_cast<const uint8_t*>(in);
  bool finite = true;  // every encoding of this rank
  for (size_t k = 0; k < segments; ++k) {
    for (size_t i = 1; i <= nn; ++i) {
      const size_t c = (rr + i) % nn;
      const size_t at = c * piece + k * seg;
      const codec::ResidualSpan residual = state->workerAt(at);
      codec::EncodeResult result;
      SQUALL_TRY(codec::encodeRaw(spec, input + at * esize, inType, countOf(k), residual,
                                  sendSlot(c, k), slot, &result, stores.residual));
      finite = finite && result.finite;
      if (c != rr) SQUALL_TRY(post(c, static_cast<uint32_t>(k), sendSlot(c, k), result.bytes));
    }
    SQUALL_TRY(ctx.transport->progress());
  }
  scratch.verdicts[rr] = finite ? 1 : 0;
  for (size_t j = 0; j < nn; ++j) {
    if (j != rr) SQUALL_TRY(post(j, verdictStep, &scratch.verdicts[rr], 1));
  }

  // Output only on success: everything has arrived and left, and every
  // piece is checked, before the first output element is written.
  SQUALL_TRY(ctx.waitAll(exchange));
  SQUALL_TRY(ctx.waitAll(verdicts));
  SQUALL_TRY(ctx.waitAll(sends));
  for (size_t j = 0; j < nn; ++j) {
    SQUALL_REQUIRE(scratch.verdicts[j] <= 1, Status::kRemoteError, Subsys::kColl,
                   "rank %zu sent a finiteness verdict of %u, not 0 or 1; the peer sent "
                   "corrupt data",
                   j, static_cast<unsigned>(scratch.verdicts[j]));
    finite = finite && scratch.verdicts[j] == 1;
    if (j == rr) continue;
    for (size_t k = 0; k < segments; ++k)
      SQUALL_TRY(checkEncoding(recvSlot(j, k), bytesOf[k], countOf(k), &finite));
  }
  std::vector<const uint8_t*> encodings(nn);
  const int divisor = op == ReduceOp::kAvg ? n : 1;
  for (size_t k = 0; k < segments; ++k) {
    for (size_t j = 0; j < nn; ++j) encodings[j] = j == rr ? sendSlot(rr, k) : recvSlot(j, k);
    if (dtype == DataType::kF32) {
      SQUALL_TRY(codec::decodeSum(encodings.data(), nn, bytesOf[k],
                                  static_cast<float*>(out) + k * seg, countOf(k), divisor,
                                  stores.output));
    } else {
      SQUALL_TRY(codec::decodeSum(encodings.data(), nn, bytesOf[k], scratch.decoded.data(),
                                  countOf(k), divisor));
      storeDecoded(dtype, scratch.decoded.data(), out, k * seg, countOf(k));
    }
  }
  state->commit(finite, false);
  state->recordStats(stats);
  return Status::kOk;
}

}  // namespace squall::coll
