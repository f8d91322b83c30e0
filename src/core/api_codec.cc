// The C API of the codec layer and the library-wide entry points.
#include <cstring>
#include <memory>
#include <string>

#include "src/codec/codec.h"
#include "src/core/api.h"
#include "src/core/engine.h"

using squall::Status;
using squall::Subsys;
namespace codec = squall::codec;

struct squallResidual {
  std::unique_ptr<codec::Residual> impl;
};

static_assert(static_cast<int>(squallCodecNone) == static_cast<int>(codec::CodecId::kNone));
static_assert(static_cast<int>(squallCodecOnebit) == static_cast<int>(codec::CodecId::kOnebit));
static_assert(static_cast<int>(squallCodecFp16) == static_cast<int>(codec::CodecId::kFp16));
static_assert(static_cast<int>(squallCodecBf16) == static_cast<int>(codec::CodecId::kBf16));
static_assert(static_cast<int>(squallCodecInt8) == static_cast<int>(codec::CodecId::kInt8));
static_assert(static_cast<int>(squallCodecInt2) == static_cast<int>(codec::CodecId::kInt2));
static_assert(static_cast<int>(squallCodecInt4) == static_cast<int>(codec::CodecId::kInt4));
static_assert(squallNumCodecs == codec::kNumCodecs);
static_assert(static_cast<int>(squallFloat16) == static_cast<int>(codec::DType::kF16));
static_assert(static_cast<int>(squallBfloat16) == static_cast<int>(codec::DType::kBf16));

namespace squall::core {

Status toCodecSpec(const squallCodecSpec_t* in, codec::Spec* out) {
  SQUALL_REQUIRE(in != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the codec spec pointer is NULL; pass e.g. SQUALL_CODEC_SPEC_ONEBIT");
  const int codecId = rawEnum(in->codec);
  const int scaleId = rawEnum(in->scale);
  SQUALL_REQUIRE(codecId >= 0 && codecId < squallNumCodecs, Status::kInvalidArgument, Subsys::kApi,
                 "unknown codec %d; use squallCodecNone, Onebit, Int2, Int4, Int8, Fp16 or Bf16",
                 codecId);
  SQUALL_REQUIRE(scaleId == squallScaleMeanAbs || scaleId == squallScaleRms,
                 Status::kInvalidArgument, Subsys::kApi,
                 "unknown scale kind %d; use squallScaleMeanAbs or squallScaleRms", scaleId);
  out->codec = static_cast<codec::CodecId>(codecId);
  out->scale = static_cast<codec::Scale>(scaleId);
  out->block = in->blockSize;
  return codec::validateSpec(*out);
}

}  // namespace squall::core

namespace {

squallCodecSpec_t fromSpec(const codec::Spec& s) {
  squallCodecSpec_t out;
  out.codec = static_cast<squallCodec_t>(s.codec);
  out.scale = static_cast<squallScale_t>(s.scale);
  out.blockSize = codec::usesBlocks(s.codec) ? s.block : 0;
  return out;
}

Status toDType(const squallDataType_t& dtype, codec::DType* out) {
  const int id = squall::core::rawEnum(dtype);
  SQUALL_REQUIRE(id == squallFloat32 || id == squallFloat16 || id == squallBfloat16,
                 Status::kInvalidArgument, Subsys::kApi,
                 "codecs take squallFloat32, squallFloat16 or squallBfloat16 input, not data "
                 "type %d",
                 id);
  *out = static_cast<codec::DType>(id);
  return Status::kOk;
}

Status checkResidual(squallResidual_t r) {
  SQUALL_REQUIRE(r != nullptr && r->impl != nullptr, Status::kInvalidArgument, Subsys::kApi,
                 "the residual handle is NULL; create one with squallResidualCreate");
  return Status::kOk;
}

Status parseSpec(const char* text, codec::Spec* spec) {
  SQUALL_REQUIRE(text != nullptr, Status::kInvalidArgument, Subsys::kApi, "the codec text is NULL");
  std::string s(text);
  size_t colon = s.find(':');
  std::string name = s.substr(0, colon);
  codec::Spec out;
  bool known = false;
  for (int id = 0; id < codec::kNumCodecs; ++id) {
    if (name == codec::codecName(static_cast<codec::CodecId>(id))) {
      out.codec = static_cast<codec::CodecId>(id);
      known = true;
    }
  }
  SQUALL_REQUIRE(known, Status::kInvalidArgument, Subsys::kApi,
                 "unknown codec \"%s\"; use none, onebit, int2, int4, int8, fp16 or bf16",
                 name.c_str());
  while (colon != std::string::npos) {
    size_t next = s.find(':', colon + 1);
    std::string option = s.substr(colon + 1, next == std::string::npos ? next : next - colon - 1);
    colon = next;
    if (option.rfind("block=", 0) == 0) {
      char* end = nullptr;
      unsigned long long v = std::strtoull(option.c_str() + 6, &end, 10);
      SQUALL_REQUIRE(*end == '\0' && end != option.c_str() + 6 && v <= UINT32_MAX,
                     Status::kInvalidArgument, Subsys::kApi,
                     "\"%s\" in \"%s\" is not a block size; write block=2048", option.c_str(),
                     text);
      out.block = static_cast<uint32_t>(v);
    } else if (option == "scale=rms") {
      out.scale = codec::Scale::kRms;
    } else if (option == "scale=mean" || option == "scale=meanabs") {
      out.scale = codec::Scale::kMeanAbs;
    } else {
      return SQUALL_FAIL(Status::kInvalidArgument, Subsys::kApi,
                         "unknown codec option \"%s\" in \"%s\"; the options are block=N and "
                         "scale=mean|rms",
                         option.c_str(), text);
    }
  }
  SQUALL_TRY(codec::validateSpec(out));
  *spec = out;
  return Status::kOk;
}

}  // namespace

extern "C" {

squallResult_t squallGetCapabilities(unsigned* capabilities) {
#ifdef SQUALL_HAVE_UCX
  constexpr unsigned kUcx = squallCapabilityUcx;
#else
  constexpr unsigned kUcx = 0;
#endif
  return SQUALL_API_GUARD({
    SQUALL_REQUIRE(capabilities != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the capabilities pointer is NULL");
    const unsigned device = squallCapabilityDevice;
    *capabilities = kUcx | (squall::core::devicePathBuilt() ? device : 0u);
    return Status::kOk;
  });
}

squallResult_t squallGetVersion(int* version) {
  return SQUALL_API_GUARD({
    SQUALL_REQUIRE(version != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the version pointer is NULL");
    *version = SQUALL_VERSION_CODE;
    return Status::kOk;
  });
}

const char* squallGetErrorString(squallResult_t result) {
  if (static_cast<unsigned>(result) >= squallNumResults) return "unknown result code";
  return squall::statusName(static_cast<Status>(result));
}

const char* squallGetLastError(void) { return squall::lastError().c_str(); }

squallResult_t squallCodecSpecParse(const char* text, squallCodecSpec_t* spec) {
  return SQUALL_API_GUARD({
    SQUALL_REQUIRE(spec != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the spec output pointer is NULL");
    codec::Spec s;
    SQUALL_TRY(parseSpec(text, &s));
    *spec = fromSpec(s);
    return Status::kOk;
  });
}

squallResult_t squallResidualCreate(size_t count, squallResidual_t* residual) {
  return SQUALL_API_GUARD({
    SQUALL_REQUIRE(residual != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the residual output pointer is NULL");
    auto handle = std::make_unique<squallResidual>();
    SQUALL_TRY(codec::Residual::create(count, &handle->impl));
    *residual = handle.release();
    return Status::kOk;
  });
}

squallResult_t squallResidualDestroy(squallResidual_t residual) {
  return SQUALL_API_GUARD({
    delete residual;
    return Status::kOk;
  });
}

squallResult_t squallResidualGetCount(squallResidual_t residual, size_t* count) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkResidual(residual));
    SQUALL_REQUIRE(count != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the count output pointer is NULL");
    *count = residual->impl->count();
    return Status::kOk;
  });
}

squallResult_t squallResidualReset(squallResidual_t residual) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkResidual(residual));
    residual->impl->reset();
    return Status::kOk;
  });
}

squallResult_t squallResidualRead(squallResidual_t residual, float* values, size_t count) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkResidual(residual));
    SQUALL_REQUIRE(count == residual->impl->count(), Status::kInvalidUsage, Subsys::kApi,
                   "the residual holds %zu elements, not %zu", residual->impl->count(), count);
    SQUALL_REQUIRE(values != nullptr || count == 0, Status::kInvalidArgument, Subsys::kApi,
                   "the values pointer is NULL");
    if (count != 0) std::memcpy(values, residual->impl->current(), count * sizeof(float));
    return Status::kOk;
  });
}

squallResult_t squallResidualWrite(squallResidual_t residual, const float* values, size_t count) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkResidual(residual));
    SQUALL_REQUIRE(count == residual->impl->count(), Status::kInvalidUsage, Subsys::kApi,
                   "the residual holds %zu elements, not %zu", residual->impl->count(), count);
    SQUALL_REQUIRE(values != nullptr || count == 0, Status::kInvalidArgument, Subsys::kApi,
                   "the values pointer is NULL");
    if (count != 0) std::memcpy(residual->impl->current(), values, count * sizeof(float));
    return Status::kOk;
  });
}

squallResult_t squallResidualGetSkipped(squallResidual_t residual, uint64_t* calls) {
  return SQUALL_API_GUARD({
    SQUALL_TRY(checkResidual(residual));
    SQUALL_REQUIRE(calls != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the calls output pointer is NULL");
    *calls = residual->impl->skipped();
    return Status::kOk;
  });
}

squallResult_t squallEncodedSize(const squallCodecSpec_t* spec, size_t count, size_t* bytes) {
  return SQUALL_API_GUARD({
    codec::Spec s;
    SQUALL_TRY(squall::core::toCodecSpec(spec, &s));
    return codec::encodedSize(s, count, bytes);
  });
}

squallResult_t squallEncode(const squallCodecSpec_t* spec, const void* input,
                            squallDataType_t dtype, size_t count, squallResidual_t residual,
                            void* output, size_t capacity, size_t* written) {
  return SQUALL_API_GUARD({
    codec::Spec s;
    SQUALL_TRY(squall::core::toCodecSpec(spec, &s));
    codec::DType d;
    SQUALL_TRY(toDType(dtype, &d));
    SQUALL_REQUIRE(written != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the written-bytes output pointer is NULL");
    if (residual != nullptr) SQUALL_TRY(checkResidual(residual));
    codec::EncodeResult result;
    SQUALL_TRY(codec::encode(s, input, d, count,
                             residual != nullptr ? residual->impl.get() : nullptr, output, capacity,
                             &result));
    *written = result.bytes;
    return Status::kOk;
  });
}

squallResult_t squallDecode(const void* input, size_t bytes, float* output, size_t count) {
  return SQUALL_API_GUARD({ return codec::decode(input, bytes, output, count); });
}

squallResult_t squallDecodeAccumulate(const void* input, size_t bytes, float* accumulator,
                                      size_t count) {
  return SQUALL_API_GUARD({ return codec::decodeAccumulate(input, bytes, accumulator, count); });
}

squallResult_t squallEncodedInspect(const void* input, size_t bytes, squallCodecSpec_t* spec,
                                    size_t* count) {
  return SQUALL_API_GUARD({
    codec::Spec s;
    size_t n = 0;
    SQUALL_REQUIRE(spec != nullptr && count != nullptr, Status::kInvalidArgument, Subsys::kApi,
                   "the spec and count output pointers must not be NULL");
    SQUALL_TRY(codec::inspect(input, bytes, &s, &n));
    *spec = fromSpec(s);
    *count = n;
    return Status::kOk;
  });
}

const char* squallCodecImplementation(void) { return codec::implementationName(); }

}  // extern "C"
