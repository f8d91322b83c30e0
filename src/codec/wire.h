// The wire format shared by every codec, on every implementation.
//
//   offset  size  field
//        0     4  magic "SQWL"
//        4     1  version (1)
//        5     1  codec id (squallCodec_t)
//        6     1  scale kind (onebit: 0 mean|z|, 1 rms; others 0)
//        7     1  reserved, 0
//        8     4  block size (onebit, int2, int4, int8; 0 for the others)
//       12     4  reserved, 0
//       16     8  element count
//       24        payload, every section padded to 8 bytes:
//   none   fp32[count]
//   fp16   uint16[count]                      (IEEE half)
//   bf16   uint16[count]                      (bfloat16)
//   onebit fp32 scale[blocks], uint64 word[ceil(count / 64)]
//          element i is bit i % 64 of word i / 64 (little-endian), 1 = +scale
//   int8   fp32 scale[blocks], int8[count]    (value = q * scale)
//   int4   fp32 scale[blocks], uint8[ceil(count / 2)]
//          element i is the 4-bit two's complement q in bits 4 * (i % 2) of
//          byte i / 2 (the even element in the low nibble), value = q * scale
//   int2   fp32 scale[blocks], uint8[ceil(count / 4)]
//          element i is the 2-bit two's complement q in bits 2 * (i % 4) of
//          byte i / 4, value = q * scale
//
// The integer codecs share one rule (intLevels): with L = 2^(bits-1) - 1
// (127, 7, 1), s = max|z| / L over the block and q = clamp(roundEven(z / s),
// -L, L); the code -L - 1 is never written. int2 is thus ternary: -s, 0 or
// +s, with s the block's largest magnitude. A bigger scale than mean|z|
// leaves most elements at 0 and sends the large ones whole; with error
// feedback that is what kept training closest to full precision
// (docs/codecs.md, "Choosing the levels").
//
// All multi-byte fields are little-endian. Encoded sizes are multiples of 8,
// so encoded chunks can be concatenated and stay aligned.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/common/status.h"

namespace squall::codec {

enum class CodecId : uint8_t {
  kNone = 0,
  kOnebit = 1,
  kFp16 = 2,
  kBf16 = 3,
  kInt8 = 4,
  kInt2 = 5,
  kInt4 = 6
};
constexpr int kNumCodecs = 7;

enum class Scale : uint8_t { kMeanAbs = 0, kRms = 1 };

enum class DType : uint8_t { kF32 = 0, kF16 = 1, kBf16 = 2 };

constexpr uint32_t kMinBlock = 64;
constexpr uint32_t kMaxBlock = 1u << 30;
constexpr uint32_t kDefaultBlock = 2048;

struct Spec {
  CodecId codec = CodecId::kOnebit;
  Scale scale = Scale::kMeanAbs;
  uint32_t block = kDefaultBlock;
};

constexpr bool usesBlocks(CodecId codec) {
  return codec == CodecId::kOnebit || codec == CodecId::kInt8 || codec == CodecId::kInt2 ||
         codec == CodecId::kInt4;
}

// The block-scaled integer codecs: the largest |q| they write (L above), and
// the bits of one element; 0 for the others.
constexpr int intLevels(CodecId codec) {
  return codec == CodecId::kInt8   ? 127
         : codec == CodecId::kInt4 ? 7
         : codec == CodecId::kInt2 ? 1
                                   : 0;
}
constexpr int intBits(CodecId codec) {
  return codec == CodecId::kInt8   ? 8
         : codec == CodecId::kInt4 ? 4
         : codec == CodecId::kInt2 ? 2
                                   : 0;
}

const char* codecName(CodecId codec);
size_t dtypeSize(DType dtype);

struct WireHeader {
  uint32_t magic;
  uint8_t version;
  uint8_t codec;
  uint8_t scale;
  uint8_t reserved0;
  uint32_t block;
  uint32_t reserved1;
  uint64_t count;
};
static_assert(sizeof(WireHeader) == 24, "the wire header is 24 bytes");
constexpr uint32_t kMagic = 0x4c575153u;  // "SQWL" read as little-endian
constexpr uint8_t kVersion = 1;
constexpr size_t kHeaderBytes = sizeof(WireHeader);

// Where each section of a payload lies (offsets from the payload start).
struct Layout {
  size_t blocks = 0;       // number of scales (onebit and the integer codecs)
  size_t scalesBytes = 0;  // padded
  size_t dataOffset = 0;   // bits, integers, or the fp values
  size_t dataBytes = 0;    // unpadded
  size_t payloadBytes = 0;
  size_t totalBytes = 0;  // header included
};

// Checks a spec: known codec and scale, block a power of two in range.
Status validateSpec(const Spec& spec);

// The layout of `count` elements; fails on size_t overflow.
Status layoutFor(const Spec& spec, size_t count, Layout* layout);

void writeHeader(const Spec& spec, size_t count, void* out);

// Validates the header of `bytes` bytes at `in`: magic, version, codec, block,
// reserved fields, and that `bytes` equals the exact encoded size.
Status readHeader(const void* in, size_t bytes, Spec* spec, size_t* count, Layout* layout);

}  // namespace squall::codec
