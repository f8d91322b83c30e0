// Helpers shared by the two compressed allreduce algorithms.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>

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

// acc[i] /= n for the avg op. Its own function, so that it vectorises
// whatever the caller's loop around it holds: inline in the algorithms, the
// out-parameters of the calls next to it (whose addresses escape) made gcc
// keep the trip count in memory and divide one element at a time, which cost
// the compressed allreduce a third of its time.
//
// For n a power of two, x / n and x * (1 / n) are the same correctly rounded
// value of the same real number (1 / n is exact), so the multiply, several
// times cheaper than a vector divide, gives the same bits.
[[gnu::noinline]] inline void divideAll(float* acc, size_t count, int n) {
  if (n > 0 && (n & (n - 1)) == 0) {
    const float inverse = 1.0f / static_cast<float>(n);
    for (size_t i = 0; i < count; ++i) acc[i] = acc[i] * inverse;
    return;
  }
  const auto divisor = static_cast<float>(n);
  for (size_t i = 0; i < count; ++i) acc[i] = acc[i] / divisor;
}

// Checks an encoding before anything is decoded from it: a well-formed header
// holding `count` elements (then decode cannot fail), and folds whether it
// decodes to finite values into *finite. Both algorithms check every piece of
// a call before they write the first output element, so a call that fails
// leaves the output as it was.
inline Status checkPiece(const uint8_t* encoded, size_t bytes, size_t count, bool* finite) {
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
