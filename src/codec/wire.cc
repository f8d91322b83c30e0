#include "src/codec/wire.h"

#include <bit>
#include <cstring>
#include <limits>

namespace squall::codec {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian; big-endian hosts need byte swapping");

constexpr size_t kSizeMax = std::numeric_limits<size_t>::max();

bool roundUp8(size_t v, size_t* out) {
  if (v > kSizeMax - 7) return false;
  *out = (v + 7) & ~size_t{7};
  return true;
}

bool mulOk(size_t a, size_t b, size_t* out) { return !__builtin_mul_overflow(a, b, out); }
bool addOk(size_t a, size_t b, size_t* out) { return !__builtin_add_overflow(a, b, out); }

}  // namespace

const char* codecName(CodecId codec) {
  switch (codec) {
    case CodecId::kNone: return "none";
    case CodecId::kOnebit: return "onebit";
    case CodecId::kFp16: return "fp16";
    case CodecId::kBf16: return "bf16";
    case CodecId::kInt8: return "int8";
    case CodecId::kInt2: return "int2";
    case CodecId::kInt4: return "int4";
  }
  return "unknown";
}

size_t dtypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

Status validateSpec(const Spec& spec) {
  SQUALL_REQUIRE(
      static_cast<unsigned>(spec.codec) < kNumCodecs, Status::kInvalidArgument, Subsys::kCodec,
      "unknown codec id %u; use none, onebit, int2, int4, int8, fp16 or bf16 (squallCodec_t)",
      static_cast<unsigned>(spec.codec));
  if (spec.codec == CodecId::kOnebit) {
    SQUALL_REQUIRE(spec.scale == Scale::kMeanAbs || spec.scale == Scale::kRms,
                   Status::kInvalidArgument, Subsys::kCodec,
                   "unknown onebit scale kind %u; use squallScaleMeanAbs or squallScaleRms",
                   static_cast<unsigned>(spec.scale));
  }
  if (usesBlocks(spec.codec)) {
    SQUALL_REQUIRE(
        spec.block >= kMinBlock && spec.block <= kMaxBlock && std::has_single_bit(spec.block),
        Status::kInvalidArgument, Subsys::kCodec,
        "block size %u is invalid for %s: use a power of two from %u to %u "
        "(default %u)",
        spec.block, codecName(spec.codec), kMinBlock, kMaxBlock, kDefaultBlock);
  }
  return Status::kOk;
}

Status layoutFor(const Spec& spec, size_t count, Layout* layout) {
  SQUALL_TRY(validateSpec(spec));
  Layout l;
  bool ok = true;
  if (usesBlocks(spec.codec)) {
    l.blocks = count / spec.block + (count % spec.block != 0);
    ok = ok && mulOk(l.blocks, 4, &l.scalesBytes) && roundUp8(l.scalesBytes, &l.scalesBytes);
  }
  l.dataOffset = l.scalesBytes;
  size_t dataBytes = 0;
  switch (spec.codec) {
    case CodecId::kNone: ok = ok && mulOk(count, 4, &dataBytes); break;
    case CodecId::kFp16:
    case CodecId::kBf16: ok = ok && mulOk(count, 2, &dataBytes); break;
    case CodecId::kOnebit: ok = ok && mulOk(count / 64 + (count % 64 != 0), 8, &dataBytes); break;
    case CodecId::kInt8: dataBytes = count; break;
    case CodecId::kInt4: dataBytes = count / 2 + count % 2; break;
    case CodecId::kInt2: dataBytes = count / 4 + (count % 4 != 0); break;
  }
  l.dataBytes = dataBytes;
  ok = ok && roundUp8(dataBytes, &dataBytes) && addOk(l.dataOffset, dataBytes, &l.payloadBytes) &&
       addOk(l.payloadBytes, kHeaderBytes, &l.totalBytes);
  SQUALL_REQUIRE(ok, Status::kInvalidArgument, Subsys::kCodec,
                 "%zu elements encoded with %s would need more than SIZE_MAX bytes; "
                 "split the buffer",
                 count, codecName(spec.codec));
  *layout = l;
  return Status::kOk;
}

void writeHeader(const Spec& spec, size_t count, void* out) {
  WireHeader h{};
  h.magic = kMagic;
  h.version = kVersion;
  h.codec = static_cast<uint8_t>(spec.codec);
  h.scale = spec.codec == CodecId::kOnebit ? static_cast<uint8_t>(spec.scale) : 0;
  h.block = usesBlocks(spec.codec) ? spec.block : 0;
  h.count = count;
  std::memcpy(out, &h, sizeof(h));
}

Status readHeader(const void* in, size_t bytes, Spec* spec, size_t* count, Layout* layout) {
  SQUALL_REQUIRE(bytes >= kHeaderBytes, Status::kCorruptData, Subsys::kCodec,
                 "encoded buffer of %zu bytes is shorter than the %zu-byte header; it was "
                 "truncated",
                 bytes, kHeaderBytes);
  WireHeader h;
  std::memcpy(&h, in, sizeof(h));
  SQUALL_REQUIRE(h.magic == kMagic, Status::kCorruptData, Subsys::kCodec,
                 "encoded buffer does not start with the Squall magic (found 0x%08x); it is "
                 "not a Squall encoding or it is corrupt",
                 h.magic);
  SQUALL_REQUIRE(h.version == kVersion, Status::kCorruptData, Subsys::kCodec,
                 "encoded buffer has wire version %u but this library reads version %u; "
                 "run the same Squall version on every rank",
                 h.version, kVersion);
  SQUALL_REQUIRE(h.codec < kNumCodecs && h.reserved0 == 0 && h.reserved1 == 0, Status::kCorruptData,
                 Subsys::kCodec,
                 "encoded buffer header is corrupt (codec id %u, reserved fields %u/%u)", h.codec,
                 h.reserved0, h.reserved1);
  Spec s;
  s.codec = static_cast<CodecId>(h.codec);
  s.scale = static_cast<Scale>(h.scale);
  s.block = usesBlocks(s.codec) ? h.block : kDefaultBlock;
  const bool specOk = (s.codec == CodecId::kOnebit ? h.scale <= 1 : h.scale == 0) &&
                      (usesBlocks(s.codec) || h.block == 0);
  SQUALL_REQUIRE(specOk, Status::kCorruptData, Subsys::kCodec,
                 "encoded buffer header is corrupt (scale kind %u, block size %u for %s)", h.scale,
                 h.block, codecName(s.codec));
  if (usesBlocks(s.codec)) {
    SQUALL_REQUIRE(h.block >= kMinBlock && h.block <= kMaxBlock && std::has_single_bit(h.block),
                   Status::kCorruptData, Subsys::kCodec,
                   "encoded buffer header is corrupt: block size %u is not a power of two "
                   "from %u to %u",
                   h.block, kMinBlock, kMaxBlock);
  }
  SQUALL_REQUIRE(h.count <= kSizeMax, Status::kCorruptData, Subsys::kCodec,
                 "encoded buffer claims %llu elements, more than this machine can address",
                 static_cast<unsigned long long>(h.count));
  Layout l;
  Status st = layoutFor(s, static_cast<size_t>(h.count), &l);
  SQUALL_REQUIRE(st == Status::kOk, Status::kCorruptData, Subsys::kCodec,
                 "encoded buffer claims %llu elements, too many to be real; it is corrupt",
                 static_cast<unsigned long long>(h.count));
  SQUALL_REQUIRE(bytes == l.totalBytes, Status::kCorruptData, Subsys::kCodec,
                 "encoded buffer is %zu bytes but %llu %s elements take exactly %zu; it was "
                 "truncated or padded",
                 bytes, static_cast<unsigned long long>(h.count), codecName(s.codec), l.totalBytes);
  *spec = s;
  *count = static_cast<size_t>(h.count);
  *layout = l;
  return Status::kOk;
}

}  // namespace squall::codec
