// Helpers shared by the two compressed allreduce algorithms.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include "src/codec/codec.h"
#include "src/codec/numeric.h"
#include "src/coll/compressed_state.h"
#include "src/coll/context.h"
#include "src/common/types.h"

namespace squall::coll {

inline codec::DType codecDType(DataType dtype) {
  switch (dtype) {
    case DataType::kF16: return codec::DType::kF16;
    case DataType::kBf16: return codec::DType::kBf16;
    default: return codec::DType::kF32;
  }
}

// The pipeline segment, in elements: SQUALL_SEGMENT_BYTES of fp32 rounded
// down to whole codec units (at least one unit), or the whole span when
// segmenting is off or the span is smaller. Segment boundaries are therefore
// block boundaries, and the encoded blocks equal the unsegmented ones.
inline size_t segmentLength(const Options& options, size_t unit, size_t span) {
  if (span == 0) return 1;
  if (options.segmentBytes == 0) return span;
  const size_t elements = std::max(options.segmentBytes / sizeof(float) / unit, size_t{1}) * unit;
  return std::min(elements, span);
}

// Whether a call's large fp32 writes bypass the caches, by the bytes of its
// buffers (input, output, the worker residual's two halves when it keeps
// one): the new residuals past one core's L2 (codec::residualStoresFor),
// the output past the last-level cache (codec::storesFor).
struct CallStores {
  codec::Stores residual;
  codec::Stores output;
};

inline CallStores callStores(const CompressedState& state, size_t elementSize) {
  const size_t residual = state.feedback() == Feedback::kKept
                              ? 2 * codec::residualElementBytes(state.residualStore())
                              : 0;
  const size_t bytes = state.count() * (2 * elementSize + residual);
  return {codec::residualStoresFor(bytes), codec::storesFor(bytes)};
}

// A piece of a call: `count` elements, of which the first `head` end a codec
// block that began before the piece (a buffer of nonzero phase,
// compressed_state.h); head is 0 when the piece begins on a block boundary or
// lies inside one block. A piece with a head travels as two encodings back to
// back, the head's and the rest's, so that its blocks are the sequence's.
struct Piece {
  size_t head = 0;
  size_t count = 0;
};

// The piece of `count` elements at virtual position `at` of a buffer of
// phase `phase` in blocks of `unit`.
inline Piece pieceAt(size_t at, size_t count, size_t phase, size_t unit) {
  const size_t head = at == phase && phase % unit != 0 ? unit - phase % unit : 0;
  return Piece{head < count ? head : 0, count};
}

inline Status pieceBytes(const codec::Spec& spec, Piece piece, size_t* bytes) {
  if (piece.head == 0) return codec::encodedSize(spec, piece.count, bytes);
  size_t head = 0, rest = 0;
  SQUALL_TRY(codec::encodedSize(spec, piece.head, &head));
  SQUALL_TRY(codec::encodedSize(spec, piece.count - piece.head, &rest));
  *bytes = head + rest;
  return Status::kOk;
}

// encode(head, output, capacity, result) then encode(rest, ...) for a piece
// with a head, each with its own part of the output; `encode` takes the
// part's element offset and count: the two encodings travel back to back.
template <typename EncodePart>
Status encodeParts(Piece piece, uint8_t* output, size_t capacity, codec::EncodeResult* result,
                   EncodePart&& encode) {
  if (piece.head == 0) return encode(size_t{0}, piece.count, output, capacity, result);
  codec::EncodeResult head, rest;
  SQUALL_TRY(encode(size_t{0}, piece.head, output, capacity, &head));
  SQUALL_TRY(encode(piece.head, piece.count - piece.head, output + head.bytes,
                    capacity - head.bytes, &rest));
  result->bytes = head.bytes + rest.bytes;
  result->finite = head.finite && rest.finite;
  return Status::kOk;
}

// codec::encodeRaw of a piece: the head's encoding, then the rest's.
inline Status encodePiece(const codec::Spec& spec, Piece piece, const uint8_t* input,
                          codec::DType dtype, codec::ResidualSpan residual, uint8_t* output,
                          size_t capacity, codec::EncodeResult* result,
                          codec::Stores stores = codec::Stores::kCached) {
  return encodeParts(
      piece, output, capacity, result,
      [&](size_t at, size_t count, uint8_t* to, size_t room, codec::EncodeResult* part) {
        return codec::encodeRaw(spec, input + at * codec::dtypeSize(dtype), dtype, count,
                                residual.at(at), to, room, part, stores);
      });
}

// The byte length of a piece's head encoding (0 without a head).
inline size_t headBytes(const codec::Spec& spec, Piece piece) {
  size_t bytes = 0;
  if (piece.head != 0 && codec::encodedSize(spec, piece.head, &bytes) != Status::kOk) return 0;
  return bytes;
}

// The sum of n encodings of one piece (codec::decodeSum) into out[0, count),
// divided by `divisor` when above 1; a piece with a head is summed as its
// two encodings, each at its offset in every one of the n.
inline Status decodeSumPiece(const codec::Spec& spec, std::span<const uint8_t* const> encodings,
                             size_t bytes, Piece piece, float* out, int divisor,
                             codec::Stores stores) {
  if (piece.head == 0)
    return codec::decodeSum(encodings.data(), encodings.size(), bytes, out, piece.count, divisor,
                            stores);
  const size_t head = headBytes(spec, piece);
  SQUALL_TRY(
      codec::decodeSum(encodings.data(), encodings.size(), head, out, piece.head, divisor, stores));
  std::vector<const uint8_t*> rest(encodings.begin(), encodings.end());
  for (const uint8_t*& at : rest) at += head;
  return codec::decodeSum(rest.data(), rest.size(), bytes - head, out + piece.head,
                          piece.count - piece.head, divisor, stores);
}

// The same sum encoded with error feedback (codec::encodeSum): the head's
// encoding, then the rest's, as encodePiece writes them.
inline Status encodeSumPiece(const codec::Spec& spec, std::span<const uint8_t* const> encodings,
                             size_t bytes, Piece piece, int divisor, codec::ResidualSpan residual,
                             uint8_t* output, size_t capacity, codec::EncodeResult* result,
                             codec::Stores stores) {
  if (piece.head == 0) {
    return codec::encodeSum(spec, encodings.data(), encodings.size(), bytes, piece.count, divisor,
                            residual, output, capacity, result, stores);
  }
  // A headed piece: the rest's encodings start past each head's.
  const size_t head = headBytes(spec, piece);
  std::vector<const uint8_t*> parts(encodings.begin(), encodings.end());
  return encodeParts(
      piece, output, capacity, result,
      [&](size_t at, size_t count, uint8_t* to, size_t room, codec::EncodeResult* part) {
        const size_t length = at == 0 ? head : bytes - head;
        if (at != 0) {
          for (const uint8_t*& p : parts) p += head;
        }
        return codec::encodeSum(spec, parts.data(), parts.size(), length, count, divisor,
                                residual.at(at), to, room, part, stores);
      });
}

// decode (accumulate false) or decodeAccumulate of a piece into out[0, count).
inline Status decodePiece(const codec::Spec& spec, const uint8_t* encoded, size_t bytes,
                          Piece piece, float* out, bool accumulate,
                          codec::Stores stores = codec::Stores::kCached) {
  auto one = [&](const uint8_t* at, size_t length, float* to, size_t count) {
    return accumulate ? codec::decodeAccumulate(at, length, to, count)
                      : codec::decode(at, length, to, count, stores);
  };
  if (piece.head == 0) return one(encoded, bytes, out, piece.count);
  const size_t head = headBytes(spec, piece);
  SQUALL_TRY(one(encoded, head, out, piece.head));
  return one(encoded + head, bytes - head, out + piece.head, piece.count - piece.head);
}

// Checks the encoding of one piece before anything is decoded from it: a
// well-formed header holding `count` elements (then decode cannot fail), and folds whether it
// decodes to finite values into *finite. Both algorithms check every piece of
// a call before they write the first output element, so a call that fails
// leaves the output as it was.
inline Status checkEncoding(const uint8_t* encoded, size_t bytes, size_t count, bool* finite) {
  codec::Spec spec;
  size_t held = 0;
  SQUALL_TRY(codec::inspect(encoded, bytes, &spec, &held));
  SQUALL_REQUIRE(held == count, Status::kRemoteError, Subsys::kColl,
                 "a received encoding holds %zu elements where %zu were expected; the peer "
                 "sent corrupt data",
                 held, count);
  bool pieceFinite = true;
  SQUALL_TRY(codec::encodingFinite(encoded, bytes, &pieceFinite));
  *finite = *finite && pieceFinite;
  return Status::kOk;
}

// The head's length comes from the call's spec: a peer that encoded with
// another one fails the head's check.
inline Status checkPiece(const codec::Spec& spec, const uint8_t* encoded, size_t bytes, Piece piece,
                         bool* finite) {
  if (piece.head == 0) return checkEncoding(encoded, bytes, piece.count, finite);
  const size_t head = headBytes(spec, piece);
  SQUALL_REQUIRE(head != 0 && head < bytes, Status::kRemoteError, Subsys::kColl,
                 "a received piece of %zu bytes is too short for its two encodings; the peer "
                 "sent corrupt data",
                 bytes);
  SQUALL_TRY(checkEncoding(encoded, head, piece.head, finite));
  return checkEncoding(encoded + head, bytes - head, piece.count - piece.head, finite);
}

// Writes `count` decoded floats to element `offset` of `out` (of `dtype`),
// rounding to nearest even for fp16/bf16.
inline void storeDecoded(DataType dtype, const float* decoded, void* out, size_t offset,
                         size_t count) {
  auto* halves = static_cast<uint16_t*>(out) + offset;
  for (size_t i = 0; i < count; ++i) {
    halves[i] =
        dtype == DataType::kF16 ? codec::floatToHalf(decoded[i]) : codec::floatToBf16(decoded[i]);
  }
}

}  // namespace squall::coll
