// Two-phase compressed allreduce with error feedback on both sides (the
// 1-bit Adam / "compressed allreduce" scheme).
//
// The buffer of N elements is padded (conceptually) to N_pad, a multiple of
// n * B (B = codec block), and cut into n chunks of C = N_pad / n; rank r is
// the "server" of chunk r. Padding is never encoded or sent. A state of
// phase P lays this over P + N virtual elements (compressed_state.h): chunk
// and segment boundaries are virtual positions, and the one piece that
// begins inside a block travels as two encodings (Piece).
//  1. Worker: encode every chunk of the input with the worker residual e_w
//     (z = x + e_w, e_w' = z - decode(encode(z))).
//  2. Exchange: send encoded chunk j to rank j (all-to-all).
//  3. Server: decode the n encodings of chunk r in rank order 0..n-1 and sum
//     them (decode, then decodeAccumulate), divide by n for avg (acc[i] / n),
//     and encode that with the server residual e_s: one pass over e_s, the
//     sum formed tile by tile in the L1 cache and never stored
//     (codec::encodeSum).
//  4. All-gather the encoded server chunks; every rank decodes all of them.
// Every rank decodes the same bytes, so outputs are bit-identical. A
// non-finite block decodes to NaN on every rank, and its NaN reaches the
// server's encoding of that chunk; so every rank, reading the same gathered
// server encodings, sees the same answer to "was any block of this call
// non-finite, on any rank?". Residuals (worker and server) are committed
// once per call only when the answer is no, on every rank together: a call
// with a non-finite input anywhere leaves every residual as it was.
//
// Pipelining: each chunk is cut into K segments of S elements (S a multiple
// of B, from SQUALL_SEGMENT_BYTES); segment k of every chunk travels as its
// own message. All receives are posted first; the worker encodes and sends
// segment k while earlier segments are in flight, serves (decode-sum-encode)
// every segment whose n-1 pieces have arrived, and finally decodes the
// all-gathered segments once all have arrived. Output is written only after
// every message of the call has arrived, every send has left and every piece
// has been checked (checkPiece): a call that fails leaves the output as it
// was, and the input has been read in full by then, so the operation may run
// in place. The price is the overlap of the final decode with the last
// gather messages (docs/protocol.md has the measurement).
//
// Cost per rank, with E = the encoded size of N elements (about
// N (1/8 + 4/B) bytes for onebit): 2(n-1)K messages in 2 dependent rounds
// (2(n-1) alpha when the network serialises them), 2(n-1)/n * E bytes sent
// and the same received. Compute: the worker encodes N elements, the server
// decodes n * N/n and encodes N/n, and every rank decodes N at the end.
// With a second-round code of its own (CompressedState::setGatherSpec, of
// E_g bytes for N elements) a rank sends (n-1)/n * (E + E_g), and the server
// decodes the sum into the accumulator and encodes it with that code: the
// bits of the fused pass, one more pass over its segment. Its blocks restart
// at every segment, as the workers' do.
#include <algorithm>
#include <vector>

#include "src/coll/algorithms.h"
#include "src/coll/compressed_common.h"

namespace squall::coll {

Status twoPhaseCompressedAllReduce(const OpContext& ctx, const void* in, void* out, DataType dtype,
                                   ReduceOp op, CompressedState* state, bool* verdict,
                                   const ExchangeHooks* hooks) {
  SQUALL_REQUIRE(hooks == nullptr || verdict != nullptr, Status::kInternal, Subsys::kColl,
                 "exchange hooks need a caller that commits the residuals itself");
  const int n = ctx.size();
  const int r = ctx.rank();
  const auto nn = static_cast<size_t>(n);
  const auto rr = static_cast<size_t>(r);
  const size_t phase = state->phase();
  const size_t span = phase + state->count();  // virtual positions [phase, span) hold elements
  const size_t unit = state->unit();
  const size_t chunk = state->chunk();
  const codec::Spec spec = state->spec();
  // The servers' code (gspec): the workers' own unless the state chose a
  // wider one (compressed_state.h); then the sum is decoded whole into the
  // accumulator and re-encoded, the same bits as the fused encodeSum.
  const codec::Spec gspec = state->gatherSpec();
  const bool fused = codec::sameEncoding(spec, gspec);
  const size_t seg = segmentLength(*ctx.options, unit, chunk);
  const size_t segments = (chunk + seg - 1) / seg;
  const size_t esize = dataTypeSize(dtype);
  const codec::DType inType = codecDType(dtype);
  CompressedStats stats;
  stats.algorithm = "twophase";
  stats.segments = segments;

  // Segment k of chunk c: the virtual position of its first element, and
  // its piece (the elements it holds, none for padding).
  auto firstOf = [&](size_t c, size_t k) { return std::max(c * chunk + k * seg, phase); };
  auto pieceOf = [&](size_t c, size_t k) -> Piece {
    const size_t begin = firstOf(c, k);
    const size_t end = std::min(c * chunk + std::min((k + 1) * seg, chunk), span);
    return begin < end ? pieceAt(begin, end - begin, phase, unit) : Piece{};
  };
  auto realCount = [&](size_t c, size_t k) { return pieceOf(c, k).count; };
  // A slot holds a segment's encoding, or a piece's two (one header more):
  // `slot` for the workers' code (send, exchange), `gslot` for the servers'
  // (server, gather).
  size_t slot = 0, headroom = 0, gslot = 0, gheadroom = 0;
  SQUALL_TRY(codec::encodedSize(spec, seg, &slot));
  SQUALL_TRY(codec::encodedSize(spec, unit, &headroom));
  SQUALL_TRY(codec::encodedSize(gspec, seg, &gslot));
  SQUALL_TRY(codec::encodedSize(gspec, unit, &gheadroom));
  slot += headroom;
  gslot += gheadroom;
  state->scratch().sendBuffer.resize(nn * segments * slot);
  state->scratch().recvBuffer.resize(nn * segments * slot);
  state->scratch().gatherBuffer.resize(nn * segments * gslot);
  state->scratch().serverBuffer.resize(segments * gslot);
  if (dtype != DataType::kF32) state->scratch().decoded.resize(seg);
  if (!fused) state->scratch().accumulator.resize(seg);
  const CallStores stores = callStores(*state, esize);
  auto sendSlot = [&](size_t c, size_t k) {
    return state->scratch().sendBuffer.data() + (c * segments + k) * slot;
  };
  auto recvSlot = [&](size_t j, size_t k) {
    return state->scratch().recvBuffer.data() + (j * segments + k) * slot;
  };
  auto gatherSlot = [&](size_t c, size_t k) {
    return state->scratch().gatherBuffer.data() + (c * segments + k) * gslot;
  };
  auto serverSlot = [&](size_t k) { return state->scratch().serverBuffer.data() + k * gslot; };
  std::vector<size_t> serverBytes(segments, 0);
  const auto gatherStep = static_cast<uint32_t>(segments);

  // Post every receive up front: exchange pieces of chunk r, then the
  // all-gathered server chunks.
  std::vector<transport::RequestPtr> exchange(nn * segments), gather(nn * segments), sends;
  sends.reserve(2 * nn * segments);
  for (size_t k = 0; k < segments; ++k) {
    for (size_t j = 0; j < nn; ++j) {
      size_t bytes = 0;
      if (j != rr && realCount(rr, k) != 0) {
        SQUALL_TRY(pieceBytes(spec, pieceOf(rr, k), &bytes));
        SQUALL_TRY(ctx.recv(static_cast<int>(j), static_cast<uint32_t>(k), recvSlot(j, k), bytes,
                            &exchange[k * nn + j]));
        stats.bytesReceived += bytes;
      }
      if (j != rr && realCount(j, k) != 0) {
        SQUALL_TRY(pieceBytes(gspec, pieceOf(j, k), &bytes));
        SQUALL_TRY(ctx.recv(static_cast<int>(j), gatherStep + static_cast<uint32_t>(k),
                            gatherSlot(j, k), bytes, &gather[k * nn + j]));
        stats.bytesReceived += bytes;
      }
    }
  }
  auto post = [&](size_t to, uint32_t step, const void* data, size_t bytes) -> Status {
    sends.emplace_back();
    SQUALL_TRY(ctx.send(static_cast<int>(to), step, data, bytes, &sends.back()));
    stats.bytesSent += bytes;
    ++stats.messagesSent;
    return Status::kOk;
  };

  // Server step for segment k: sum the n pieces in rank order, divide for
  // avg, encode with the server residual, send; one pass (encodeSumPiece),
  // the sum never stored, unless the gather's code differs.
  std::vector<const uint8_t*> encodings(nn);
  auto serve = [&](size_t k) -> Status {
    const Piece piece = pieceOf(rr, k);
    if (piece.count == 0) return Status::kOk;
    size_t bytes = 0;
    SQUALL_TRY(pieceBytes(spec, piece, &bytes));
    for (size_t j = 0; j < nn; ++j) encodings[j] = j == rr ? sendSlot(rr, k) : recvSlot(j, k);
    // The server residual is indexed by position within the chunk.
    const size_t at = firstOf(rr, k) - rr * chunk;
    const codec::ResidualSpan residual = state->serverAt(at);
    codec::EncodeResult result;
    const int divisor = op == ReduceOp::kAvg ? n : 1;
    if (fused) {
      SQUALL_TRY(encodeSumPiece(spec, encodings, bytes, piece, divisor, residual, serverSlot(k),
                                gslot, &result, stores.residual));
    } else {
      float* sum = state->scratch().accumulator.data();
      SQUALL_TRY(
          decodeSumPiece(spec, encodings, bytes, piece, sum, divisor, codec::Stores::kCached));
      SQUALL_TRY(encodePiece(gspec, piece, reinterpret_cast<const uint8_t*>(sum),
                             codec::DType::kF32, residual, serverSlot(k), gslot, &result,
                             stores.residual));
    }
    serverBytes[k] = result.bytes;
    for (size_t j = 0; j < nn; ++j) {
      if (j != rr)
        SQUALL_TRY(post(j, gatherStep + static_cast<uint32_t>(k), serverSlot(k), result.bytes));
    }
    return Status::kOk;
  };
  auto pieces = [&](std::vector<transport::RequestPtr>& requests, size_t k) {
    return std::span<const transport::RequestPtr>(requests.data() + k * nn, nn);
  };
  auto arrived = [&](size_t k) {
    for (const transport::RequestPtr& request : pieces(exchange, k))
      if (request != nullptr && !request->done()) return false;
    return true;
  };

  // Segment k of every chunk is encoded at once, so the input is needed
  // whole from the start (no overlap with the caller's work).
  if (hooks != nullptr) SQUALL_TRY(hooks->inputNeeded(state->count()));
  const auto* input = static_cast<const uint8_t*>(in);
  size_t served = 0;
  for (size_t k = 0; k < segments; ++k) {
    // Own chunk last, so it is encoded by the time segment k is served.
    for (size_t i = 1; i <= nn; ++i) {
      const size_t c = (rr + i) % nn;
      const Piece piece = pieceOf(c, k);
      if (piece.count == 0) continue;
      const size_t at = firstOf(c, k);  // the worker residual is indexed virtually
      const codec::ResidualSpan residual = state->workerAt(at);
      codec::EncodeResult result;
      SQUALL_TRY(encodePiece(spec, piece, input + (at - phase) * esize, inType, residual,
                             sendSlot(c, k), slot, &result, stores.residual));
      if (c != rr) SQUALL_TRY(post(c, static_cast<uint32_t>(k), sendSlot(c, k), result.bytes));
    }
    SQUALL_TRY(ctx.transport->progress());
    while (served <= k && arrived(served)) {
      SQUALL_TRY(ctx.waitAll(pieces(exchange, served)));
      SQUALL_TRY(serve(served++));
    }
  }
  for (; served < segments; ++served) {
    SQUALL_TRY(ctx.waitAll(pieces(exchange, served)));
    SQUALL_TRY(serve(served));
  }

  // Output only on success: everything has arrived and left, and every
  // piece is checked, before the first output element is written.
  for (size_t k = 0; k < segments; ++k) SQUALL_TRY(ctx.waitAll(pieces(gather, k)));
  SQUALL_TRY(ctx.waitAll(sends));
  // Calls visit(encoded, bytes, piece, at) for every non-empty piece, server
  // slots and gathered ones alike, in output order (`at`: the output index).
  auto eachPiece = [&](auto&& visit) -> Status {
    for (size_t k = 0; k < segments; ++k) {
      for (size_t c = 0; c < nn; ++c) {
        const Piece piece = pieceOf(c, k);
        if (piece.count == 0) continue;
        size_t bytes = serverBytes[k];
        if (c != rr) SQUALL_TRY(pieceBytes(gspec, piece, &bytes));
        SQUALL_TRY(
            visit(c == rr ? serverSlot(k) : gatherSlot(c, k), bytes, piece, firstOf(c, k) - phase));
      }
    }
    return Status::kOk;
  };
  bool finite = true;  // every server encoding of the call, so every block
  SQUALL_TRY(eachPiece([&](const uint8_t* encoded, size_t bytes, Piece piece, size_t) {
    return checkPiece(gspec, encoded, bytes, piece, &finite);
  }));
  SQUALL_TRY(eachPiece([&](const uint8_t* encoded, size_t bytes, Piece piece, size_t at) {
    if (dtype == DataType::kF32) {
      return decodePiece(gspec, encoded, bytes, piece, static_cast<float*>(out) + at, false,
                         stores.output);
    }
    SQUALL_TRY(decodePiece(gspec, encoded, bytes, piece, state->scratch().decoded.data(), false));
    storeDecoded(dtype, state->scratch().decoded.data(), out, at, piece.count);
    return Status::kOk;
  }));
  if (hooks != nullptr) SQUALL_TRY(hooks->outputReady(state->count(), finite));
  if (verdict != nullptr) {
    *verdict = finite;
  } else {
    state->commit(finite, true);
  }
  state->recordStats(stats);
  return Status::kOk;
}

}  // namespace squall::coll
